"""``python -m jaxdrive.bench render``: time recordings (env steps + on-device frames).

One recording = ``envs`` procedural scenes at the default sizes (64 agent slots, 4096
road points) played by log replay for ``steps`` steps, every step rendered in each view
at ``size`` x ``size``, all in one jitted call (``chunk_steps = steps``), frames fetched
to the host. Compile time is reported separately; the timed figure is the median of
``repeats`` calls after compile.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from jaxdrive.agents.controllers import log_replay
from jaxdrive.env import Env, EnvConfig
from jaxdrive.render.record import Recorder, VideoConfig, controller_actor, record
from jaxdrive.scenarios.pool import make_pool
from jaxdrive.scenarios.procedural import generate_batch


def bench_render(envs: int, steps: int, size: int, views: tuple[str, ...],
                 repeats: int) -> dict:
    """One benchmark record (see the module doc)."""
    config = EnvConfig.from_dict({"episode_length": min(steps, 80)})
    env = Env(config)
    scenes = generate_batch(jax.random.key(0), envs, scenario_config=config.scenario)
    params = env.make_params(make_pool(scenes, config.road_index))
    video = VideoConfig(num_envs=envs, num_steps=steps, views=tuple(views), width=size,
                        height=size, chunk_steps=steps, overlay=False)
    recorder = Recorder(env, controller_actor(env, log_replay(env)), video)
    ids = np.arange(envs, dtype=np.int32)
    shapes = []
    sink = lambda first, frames, info: shapes.append(frames.shape)

    def once(seed):
        t0 = time.perf_counter()
        record(recorder, None, params, ids, steps, sink, jax.random.key(seed))
        return time.perf_counter() - t0

    compile_s = once(0)
    times = [once(1 + i) for i in range(repeats)]
    median = float(np.median(times))
    frames = envs * steps * len(views)
    return {
        "envs": envs, "steps": steps, "size": size, "views": list(views),
        "agents": config.scenario.max_agents, "road_points": config.scenario.max_road_points,
        "frames": frames, "calls_per_recording": len(shapes) // (repeats + 1),
        "seconds": median, "seconds_all": times, "frames_per_s": frames / median,
        "first_call_s": compile_s,
    }


def render_table(records: list[dict]) -> str:
    """The ``bench_render`` records as a fixed-width text table."""
    head = (f"{'envs':>5} {'steps':>5} {'size':>5} {'views':>10} {'frames':>7} "
            f"{'seconds':>8} {'frames/s':>9} {'1st call s':>10}")
    rows = [head, "-" * len(head)]
    for r in records:
        rows.append(f"{r['envs']:>5} {r['steps']:>5} {r['size']:>5} "
                    f"{'+'.join(r['views']):>10} {r['frames']:>7} {r['seconds']:>8.2f} "
                    f"{r['frames_per_s']:>9,.0f} {r['first_call_s']:>10.1f}")
    return "\n".join(rows)
