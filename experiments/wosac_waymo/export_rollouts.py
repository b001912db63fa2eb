"""Score synthetic rollout sets of one real WOMD scene with jaxdrive's WOSAC metrics and
export them for Waymo's package (``score_with_waymo.py``, run in a separate venv).

    python experiments/wosac_waymo/export_rollouts.py SCENE.tfrecord --out rollouts.npz

The rollout sets are built from the log, not from a policy, so that both implementations
score exactly the same trajectories (world frame, 32 rollouts x 80 steps):

- ``log``: the logged future as every rollout (the oracle);
- ``noisy_log``: the logged future plus Gaussian noise (0.3 m, 0.03 rad) per step;
- ``const_vel``: straight on from step 10 at the logged speed and heading;
- ``const_vel_spread``: the same with each object's speed scaled by U(0.6, 1.4) per rollout.

Objects that are valid at step 10 are simulated (valid at every future step), the others
are absent; an object whose log ends early is held at its last valid state. Scored:
``tracks_to_predict`` and the SDC. Writes our scores into the npz
(``ours_SET``: a JSON string) and prints them.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.data.convert import real_data_config
from jaxdrive.data.load import load_scenarios
from jaxdrive.metrics import wosac
from jaxdrive.scenarios.pool import make_pool

INIT = 10  # the current step; 11 history steps (0..10)
ROLLOUTS = 32
STEPS = 80


def rollout_sets(obj, key) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(R, A, 80, 2) xy and (R, A, 80) yaw of the future steps, per set, scene frame."""
    xy, yaw, vel = np.asarray(obj.xy), np.asarray(obj.yaw), np.asarray(obj.vel)
    # An object whose log ends early is held at its last valid state (every simulated
    # object is valid at every future step, as the challenge requires).
    steps = np.arange(xy.shape[1])
    last = np.maximum.accumulate(np.where(np.asarray(obj.valid), steps, 0), axis=1)
    xy = np.take_along_axis(xy, last[..., None], axis=1)
    yaw = np.take_along_axis(yaw, last, axis=1)
    fut_xy, fut_yaw = xy[:, INIT + 1:INIT + 1 + STEPS], yaw[:, INIT + 1:INIT + 1 + STEPS]
    a = xy.shape[0]
    rep = lambda x: np.repeat(x[None], ROLLOUTS, axis=0)  # noqa: E731
    k1, k2, k3 = jax.random.split(key, 3)
    noise_xy = 0.3 * np.asarray(jax.random.normal(k1, (ROLLOUTS, a, STEPS, 2)))
    noise_yaw = 0.03 * np.asarray(jax.random.normal(k2, (ROLLOUTS, a, STEPS)))
    speed = np.linalg.norm(vel[:, INIT], axis=-1)  # (A,)
    heading = np.stack([np.cos(yaw[:, INIT]), np.sin(yaw[:, INIT])], -1)  # (A, 2)
    t = 0.1 * np.arange(1, STEPS + 1)  # (80,)
    cv_xy = xy[:, INIT, None] + speed[:, None, None] * t[None, :, None] * heading[:, None]
    cv_yaw = np.repeat(yaw[:, INIT, None], STEPS, axis=1)
    scale = np.asarray(jax.random.uniform(k3, (ROLLOUTS, a), minval=0.6, maxval=1.4))
    spread_xy = (xy[None, :, INIT, None] + (scale * speed)[..., None, None]
                 * t[None, None, :, None] * heading[None, :, None])
    return {
        "log": (rep(fut_xy), rep(fut_yaw)),
        "noisy_log": (rep(fut_xy) + noise_xy, rep(fut_yaw) + noise_yaw),
        "const_vel": (rep(cv_xy), rep(cv_yaw)),
        "const_vel_spread": (spread_xy, rep(cv_yaw)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scene", help="a WOMD TFRecord holding the scene (its first)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    scen, report = load_scenarios([args.scene], real_data_config())
    scen = jax.tree.map(jnp.asarray, scen)
    pool = make_pool(scen)
    one = jax.tree.map(lambda x: x[0], pool)
    obj = one.scenarios.objects
    t = INIT + 1 + STEPS
    at_init = np.asarray(obj.valid[:, INIT])
    marked = np.asarray(obj.to_predict | obj.is_sdc) & at_init
    evaluated = marked if marked.any() else at_init
    log = wosac.Trajectories(xy=obj.xy[:, :t], yaw=obj.yaw[:, :t], valid=obj.valid[:, :t])
    lights = one.scenarios.traffic_lights
    lights = lights.replace(state=lights.state[:, :t], valid=lights.valid[:, :t])
    if not at_init.sum() or report["totals"].get("truncated_present_agents", 0):
        raise SystemExit(f"{args.scene}: {report['totals'].get('truncated_present_agents')} "
                         "objects valid at step 10 did not fit the object slots; Waymo's "
                         "package simulates every one of them (raise max_agents in "
                         "real_data_config).")
    # The scene as arguments, not constants: constants of this size take XLA minutes to fold.
    scene = (log, obj.length, obj.width, jnp.asarray(evaluated), one.road_index,
             one.scenarios.roadgraph, lights)
    run = jax.jit(lambda sim, log, length, width, evaluated, index, roadgraph, lights:
                  wosac.realism_scores(sim, log, length, width, evaluated, index, roadgraph,
                                       init_steps=INIT + 1, dt=0.1, rollout_batch=8,
                                       traffic_lights=lights))
    score = lambda sim: run(sim, *scene)  # noqa: E731
    out = {"origin": np.asarray(report["origins"][0]), "evaluated": evaluated,
           "simulated": at_init, "scenario_id": np.str_(report["scenario_ids"][0]),
           "log_xy": np.asarray(obj.xy[:, :t]), "length": np.asarray(obj.length)}
    hist = lambda x: np.repeat(np.asarray(x[None, :, :INIT + 1]), ROLLOUTS, 0)  # noqa: E731
    future_valid = np.repeat(at_init[None, :, None], STEPS, axis=2)
    sim_valid = np.concatenate([hist(obj.valid), np.repeat(future_valid, ROLLOUTS, 0)], 2)
    for name, (fxy, fyaw) in rollout_sets(obj, jax.random.key(0)).items():
        sim = wosac.Trajectories(
            xy=jnp.asarray(np.concatenate([hist(obj.xy), fxy], 2), jnp.float32),
            yaw=jnp.asarray(np.concatenate([hist(obj.yaw), fyaw], 2), jnp.float32),
            valid=jnp.asarray(sim_valid))
        scores = {k: float(v) for k, v in score(sim).items() if np.ndim(v) == 0}
        out[f"xy_{name}"] = fxy + out["origin"][None, None, None]  # world frame, float64
        out[f"yaw_{name}"] = fyaw
        out[f"ours_{name}"] = np.str_(json.dumps(scores))
        print(name, json.dumps({k: round(v, 4) for k, v in scores.items()}))
    np.savez(args.out, **out)
    print(f"evaluated objects: {int(evaluated.sum())}, simulated: {int(at_init.sum())}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    main()
