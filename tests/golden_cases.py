"""Golden outputs of the simulator, policies, PPO and evaluation on tiny shapes.

Recorded before the architecture redesign (issue 14) into ``tests/golden/*.npz`` and
checked bit for bit by ``tests/test_golden.py`` ever after: a refactor must not change a
single number. Each case is a function returning a flat ``{name: np.ndarray}``; the
names are semantic (``obs/ego``, ``reward``, ``metric/collided``, ...) so that when an
API moves only the few lines that read it change here, never the recorded files.

Write the files with ``python tests/golden_cases.py`` (only when a change of behaviour
is intended, and say so in the commit). Recording also writes the machine it ran on
(CPU vendor, generation, AVX-512, jax and jaxlib versions) into
``tests/golden/machines.json``: XLA's CPU code depends on the processor's vector
instructions, so floats agree bit for bit only on a machine like the recording one (see
``golden_check``). A case whose arrays come out bit-identical keeps its file; only its
machine record is updated.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
NUM_STEPS = 30
NUM_ENVS = 4

GOALS = ("respawn", "new_goal", "stop", "trial")
COLLISIONS = ("ignore", "stop", "remove")
CONTROLS = ("all", "sdc", "fraction")

# Tiny shapes: 8 agent slots, 40 logged steps (episodes of 29 steps from init_step 10,
# so a 30-step rollout crosses an auto-reset), a short observation (no light tokens: the
# goldens were recorded before traffic lights were observed).
ENV_BASE = {
    "scenario": {"max_agents": 8, "num_steps": 40},
    "observation": {"num_partners": 3, "num_road": 8, "num_lights": 0},
    "road_index": {"road_per_cell": 16, "chunk_size": 8, "grid_size": 8},
    "goal_radius": 6.0,
    "reward": {"goal": 1.0, "collision": -0.5, "offroad": -0.25, "progress": 0.1,
               "step": -0.01},
}
# The procedural distribution the goldens were recorded on, spelled out where a default
# changed since (issue 20: wider corners, conflicting vehicles dropped from the log).
PROCEDURAL_AS_RECORDED = {"corner_radius": [4.0, 8.0], "log_conflicts": "keep"}
PROCEDURAL = {"num_agents": [4, 8], "goal_distance": [20.0, 30.0], **PROCEDURAL_AS_RECORDED}


def env_cases() -> dict[str, dict]:
    """Case name -> env config overrides: every goal x collision x control combination,
    trial mode with co-players, the delta-local model, continuous actions."""
    cases = {}
    for goal, collision, control in itertools.product(GOALS, COLLISIONS, CONTROLS):
        c = {"goal_behavior": goal, "collision_behavior": collision, "control_mode": control}
        if goal == "trial":
            c.update(num_trials=3, trial_timeout=8)
        cases[f"env_{goal}_{collision}_{control}"] = c
    cases["env_trial_coplayers"] = {"goal_behavior": "trial", "num_trials": 2,
                                    "trial_timeout": 12, "collision_behavior": "remove",
                                    "co_player_fraction": 0.5}
    cases["env_delta_local"] = {"dynamics": {"model": "delta_local"},
                                "collision_behavior": "stop"}
    cases["env_bicycle_continuous"] = {"dynamics": {"action_space": "continuous"},
                                       "goal_behavior": "new_goal"}
    cases["env_delta_local_continuous"] = {
        "dynamics": {"model": "delta_local", "action_space": "continuous"},
        "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 10}
    return cases


def _env_and_params(overrides: dict):
    from jaxdrive.config import merge
    from jaxdrive.env import Env, EnvConfig
    from jaxdrive.scenarios.pool import make_pool
    from jaxdrive.scenarios.procedural import ProceduralConfig, generate_batch

    config = EnvConfig.from_dict(merge(ENV_BASE, overrides))
    scenes = generate_batch(jax.random.key(3), 4, ProceduralConfig.from_dict(PROCEDURAL),
                            config.scenario)
    env = Env(config)
    return env, env.make_params(make_pool(scenes, config.road_index))


def _timestep_record(ts, state) -> dict:
    """The semantic content of one batched step (names are the golden contract)."""
    info = ts.info
    out = {
        "obs/ego": ts.obs.ego, "obs/partners": ts.obs.partners, "obs/road": ts.obs.road,
        "active": ts.active, "reward": ts.reward, "terminated": ts.terminated,
        "truncated": ts.truncated, "trial_ended": info.trial_ended,
        "episode_done": info.episode_done, "trial_done": info.trial_done, "first": ts.first,
        "trial": state.trial, "removed": ts.removed, "ego": state.ego,
        "co_player": state.co_player,
        "metric/collided": info.metrics.collided, "metric/offroad": info.metrics.offroad,
        "metric/goal_reached": info.metrics.goal_reached,
        "metric/goal_distance": info.metrics.goal_distance,
        "metric/progress": info.metrics.progress,
        "episode/mask": info.episode_controlled, "episode/ego": info.episode_ego,
        "episode/goal_reached": info.episode.goal_reached,
        "episode/collided": info.episode.collided, "episode/offroad": info.episode.offroad,
        "episode/return": info.episode.return_, "episode/length": info.episode.length,
        "trials/ego_reached": info.trials.ego_reached,
        "trials/co_reached": info.trials.co_reached,
        "trials/length": info.trials.length, "trials/timed_out": info.trials.timed_out,
        "trials/goal_reached": info.trials.goal_reached, "trials/num_ego": info.trials.num_ego,
        "trials/num_co": info.trials.num_co,
        "state/xy": state.agents.xy, "state/yaw": state.agents.yaw,
        "state/vel": state.agents.vel, "state/steer": state.agents.steer,
        "state/accel": state.agents.accel, "state/valid": state.agents.valid,
        "state/kind": state.kind, "state/role": state.role, "state/done": state.done,
        "state/removed": state.removed, "state/reached": state.reached,
        "state/goal": state.goal, "state/step": state.step, "state/trial": state.trial,
        "state/trial_start": state.trial_start, "state/scenario_id": state.scenario_id,
    }
    # Episode statistics are only meaningful where an episode ended.
    ended = info.episode_done
    for k in list(out):
        if k.startswith(("episode/", "trials/")):
            x = out[k]
            m = ended.reshape(ended.shape + (1,) * (x.ndim - 1))
            out[k] = jnp.where(m, x, jnp.zeros_like(x))
    return out


def env_case(overrides: dict) -> dict[str, np.ndarray]:
    """30 steps of 4 envs: envs 0-1 lane-following, 2-3 random actions."""
    from jaxdrive.agents.controllers import lane_follow, random_actions

    env, params = _env_and_params(overrides)
    follow, rand = lane_follow(env), random_actions(env)
    act_follow = jax.vmap(follow, in_axes=(None, 0, 0, 0))
    act_rand = jax.vmap(rand, in_axes=(None, 0, 0, 0))

    @jax.jit
    def run(key):
        k_reset, k_run = jax.random.split(key)
        state, ts = env.reset_batch(params, k_reset, NUM_ENVS)
        first = _timestep_record(ts, state)

        def body(carry, k):
            state, ts = carry
            keys = jax.random.split(k, NUM_ENVS)
            a_f = act_follow(params, state, ts, keys)
            a_r = act_rand(params, state, ts, keys)
            pick = (jnp.arange(NUM_ENVS) < 2).reshape((NUM_ENVS,) + (1,) * (a_f.ndim - 1))
            action = jnp.where(pick, a_f, a_r)
            state, ts = env.step_batch(params, state, action)
            return (state, ts), (_timestep_record(ts, state), action)

        _, (recs, actions) = jax.lax.scan(body, (state, ts),
                                          jax.random.split(k_run, NUM_STEPS))
        return first, recs, actions

    first, recs, actions = jax.device_get(run(jax.random.key(11)))
    out = {f"reset/{k}": np.asarray(v) for k, v in first.items()}
    out.update({f"step/{k}": np.asarray(v) for k, v in recs.items()})
    out["action"] = np.asarray(actions)
    return out


# ---------------------------------------------------------------------- policies
POLICIES = {
    "transformer": {"kind": "transformer", "model_dim": 16, "token_dim": 8, "horizon": 6,
                    "num_layers": 2, "heads": 2},
    "mlp": {"kind": "mlp", "model_dim": 16, "token_dim": 8},
}


def policy_case(name: str) -> dict[str, np.ndarray]:
    """Policy step over 9 env steps (memory wraps the horizon, removals, a reset) and the
    sequence path over the same segment, from fixed observations."""
    from jaxdrive.models.policy import Policy, PolicyConfig, policy_inputs

    env, params_env = _env_and_params({"goal_behavior": "trial", "num_trials": 2,
                                       "trial_timeout": 5, "collision_behavior": "remove"})
    policy = Policy.for_env(PolicyConfig.from_dict(POLICIES[name]), env)
    rows = lambda x: x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])  # zero-size too
    state, ts = jax.jit(env.reset_batch, static_argnums=2)(params_env, jax.random.key(5), 2)
    params = policy.init(jax.random.key(6), jax.tree.map(rows, ts.obs))
    n = 2 * env.config.scenario.max_agents
    cache0 = policy.init_cache(n)
    step_env = jax.jit(env.step_batch)
    pstep = jax.jit(policy.step)
    cache = cache0
    obs_seq, first_seq, removed_seq, logits, values = [], [], [], [], []
    action = jnp.zeros((2, env.config.scenario.max_agents), jnp.int32)
    for t in range(9):
        first, removed = (rows(x) for x in policy_inputs(ts))
        if t == 6:  # a memory reset of one env mid-segment
            first = first.at[:8].set(True)
        obs = jax.tree.map(rows, ts.obs)
        out, cache = pstep(params, cache, obs, first, removed)
        obs_seq.append(obs)
        first_seq.append(first)
        removed_seq.append(removed)
        logits.append(out.dist)
        values.append(out.value)
        action = jnp.argmax(out.dist, axis=-1).astype(jnp.int32).reshape(action.shape)
        state, ts = step_env(params_env, state, action)
    stack = lambda xs: jnp.stack(xs, axis=1)  # (N, T, ...)
    obs_bt = jax.tree.map(lambda *xs: jnp.stack(xs, axis=1), *obs_seq)
    seq = jax.jit(policy.sequence)(params, cache0, obs_bt, stack(first_seq),
                                   stack(removed_seq))
    out = {"step/dist": stack(logits), "step/value": stack(values),
           "seq/dist": seq.dist, "seq/value": seq.value,
           "cache/k": cache.k, "cache/v": cache.v, "cache/pos": cache.pos,
           "cache/garbage": cache.garbage, "cache/next_pos": cache.next_pos}
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        out["params" + jax.tree_util.keystr(path)] = leaf
    return {k: np.asarray(v) for k, v in jax.device_get(out).items()}


# ---------------------------------------------------------------------- PPO
PPO_BASE = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 6,
            "observation": {"num_partners": 3, "num_road": 20, "num_lights": 0},
            "road_index": {"road_per_cell": 20, "grid_size": 8}, "co_player_fraction": 0.5},
    "procedural": {"num_agents": [3, 4], "topology": {"straight": 1.0, "curve": 1.0,
                                                      "t_junction": 0.0, "intersection": 0.0},
                   **PROCEDURAL_AS_RECORDED},
    "policy": {"kind": "transformer", "model_dim": 16, "token_dim": 8, "horizon": 16},
    # The padded path, recorded before dense rows existed (tests/test_dense_rows.py checks
    # dense rows against it).
    "train": {"seed": 5, "num_scenes": 2, "num_envs": 3, "rollout_steps": 7, "epochs": 2,
              "minibatches": 2, "dense_rows": "off"},
    "validation": {"every": 0},
}


def ppo_case(kind: str) -> dict[str, np.ndarray]:
    """Three PPO iterations: every logged metric and the final parameters."""
    from jaxdrive.config import merge
    from jaxdrive.models.policy import Policy
    from jaxdrive.runs.config import RunConfig
    from jaxdrive.train.ppo import PPO
    from jaxdrive.train.run import build_env

    data = merge(PPO_BASE, {"policy": {"kind": kind}})
    if kind == "mlp":  # plain episodes: the non-trial statistics path
        data["env"] = {k: v for k, v in data["env"].items()
                       if k not in ("num_trials", "trial_timeout", "co_player_fraction")}
        data["env"]["goal_behavior"] = "stop"
        data["env"]["episode_length"] = 9
    config = RunConfig.from_dict(data)
    env, env_params = build_env(config, 0, 2)
    policy = Policy.for_env(config.policy, env)
    ppo = PPO(config, env, policy)
    state = ppo.init(jax.random.key(0), env_params)
    step = jax.jit(ppo.train_step)
    out = {}
    for it in range(3):
        state, metrics = step(state, env_params)
        for k, v in jax.device_get(metrics).items():
            out[f"iter{it}/{k}"] = np.asarray(v)
    for path, leaf in jax.tree_util.tree_leaves_with_path(jax.device_get(state.params)):
        out["params" + jax.tree_util.keystr(path)] = np.asarray(leaf)
    return out


# ---------------------------------------------------------------------- evaluation
EVAL_ENV = {"scenario": {"max_agents": 4, "num_steps": 40}, "collision_behavior": "remove",
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}, "episode_length": 14}
EVAL_PROCEDURAL = {"num_agents": [2, 4], "topology": {"straight": 1.0, "curve": 1.0,
                                                      "t_junction": 0.0,
                                                      "intersection": 0.0},
                   **PROCEDURAL_AS_RECORDED}
EVAL_SUITE = {"eval": {
    "_tiny": {"template": True, "num_scenarios": 5, "batch_size": 2, "seed": 7},
    "multi": {"type": "multi_scenario", "inherits": "_tiny"},
    "replay": {"type": "human_replay", "inherits": "_tiny"},
    "adapt": {"type": "adaptation", "inherits": "_tiny", "num_trials": 2,
              "trial_timeout": 7, "env.goal_behavior": "trial"},
    "plan": {"type": "planning", "inherits": "_tiny"},
}}


def eval_case() -> dict[str, np.ndarray]:
    """Every evaluator type but behavior_class on 5 procedural scenes with a tiny MLP:
    metrics, per-scenario lists and per-episode records."""
    from jaxdrive.env import Env, EnvConfig
    from jaxdrive.eval.evaluators import make_evaluators
    from jaxdrive.eval.suite import load_suite_specs
    from jaxdrive.models.policy import Policy, PolicyConfig
    from jaxdrive.scenarios.procedural import ProceduralConfig

    env_config = EnvConfig.from_dict(EVAL_ENV)
    procedural = ProceduralConfig.from_dict(EVAL_PROCEDURAL)
    env = Env(env_config)
    policy = Policy.for_env(PolicyConfig(kind="mlp", model_dim=16, token_dim=8), env)
    env_params = _eval_pool_params(env, procedural)
    # The initialiser reads only the observation's shapes: zeros of the reset's shapes
    # (nothing of the reset is compiled or run eagerly).
    obs = jax.eval_shape(lambda p: env.reset_batch(p, jax.random.key(0), 1)[1].obs,
                         env_params)
    params = policy.init(jax.random.key(0), jax.tree.map(
        lambda s: jnp.zeros((s.shape[0] * s.shape[1],) + s.shape[2:], s.dtype), obs))
    specs = load_suite_specs(EVAL_SUITE, env_config, procedural)
    out = {}
    for ev in make_evaluators(specs.values()):
        res = ev.run(policy, params)
        assert res.status == "ok", res.error
        for k, v in sorted(res.metrics.items()):
            out[f"{ev.name}/metric/{k}"] = np.asarray(v, np.float64)
        for k, v in sorted(res.per_scenario.items()):
            out[f"{ev.name}/per_scenario/{k}"] = np.asarray(v)
        fields = sorted(res.episodes[0])
        for f in fields:
            vals = [e[f] for e in res.episodes]
            out[f"{ev.name}/episodes/{f}"] = np.asarray(vals)
    return out


def _eval_pool_params(env, procedural):
    from jaxdrive.scenarios.pool import make_pool
    from jaxdrive.scenarios.procedural import generate_batch

    scenes = generate_batch(jax.random.key(1), 2, procedural, env.config.scenario)
    return env.make_params(make_pool(scenes, env.config.road_index))


# ---------------------------------------------------------------------- registry
def all_cases() -> dict[str, callable]:
    cases = {name: (lambda o=o: env_case(o)) for name, o in env_cases().items()}
    cases.update({f"policy_{k}": (lambda k=k: policy_case(k)) for k in POLICIES})
    cases.update({f"ppo_{k}": (lambda k=k: ppo_case(k)) for k in ("transformer", "mlp")})
    cases["eval"] = eval_case
    return cases


def path(name: str) -> str:
    return os.path.join(GOLDEN_DIR, f"{name}.npz")


MACHINES_PATH = os.path.join(GOLDEN_DIR, "machines.json")


def machine() -> dict[str, str]:
    """What decides XLA's CPU floating-point code here: the processor (vendor, family and
    model: LLVM tunes its vector code per CPU generation, so two AMD machines of this
    workplace, Zen 5 and an older one, round matrix products differently), whether it
    has AVX-512, and jax / jaxlib."""
    first = {}  # /proc/cpuinfo's first processor block, "key: value" lines
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                first[key.strip()] = value.strip()
    except OSError:
        pass
    import jaxlib

    return {"cpu_vendor": first.get("vendor_id", platform.processor() or platform.machine()),
            "cpu": f"family {first.get('cpu family', '?')} model {first.get('model', '?')}",
            "avx512": str("avx512f" in first.get("flags", "").split()).lower(),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__}


def recorded_machines() -> dict[str, dict[str, str]]:
    """Case name -> the ``machine()`` its file was recorded on (empty if unknown)."""
    if not os.path.exists(MACHINES_PATH):
        return {}
    with open(MACHINES_PATH) as f:
        return json.load(f)


def _equal_to_recorded(name: str, arrays: dict[str, np.ndarray]) -> bool:
    """Whether ``name``'s recorded file holds exactly ``arrays`` (names, dtypes, bytes)."""
    if not os.path.exists(path(name)):
        return False
    with np.load(path(name)) as recorded:
        if sorted(recorded.files) != sorted(arrays):
            return False
        return all(recorded[k].dtype == np.asarray(v).dtype
                   and recorded[k].shape == np.shape(v)
                   and recorded[k].tobytes() == np.asarray(v).tobytes()
                   for k, v in arrays.items())


def main(names: list[str]) -> None:
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    cases = all_cases()
    machines = recorded_machines()
    for name in names or list(cases):
        arrays = cases[name]()
        machines[name] = machine()
        if _equal_to_recorded(name, arrays):
            print(f"{name}: {len(arrays)} arrays bit-identical to {path(name)} (kept; "
                  f"machine record updated)")
            continue
        np.savez_compressed(path(name), **arrays)
        print(f"{name}: {len(arrays)} arrays -> {path(name)}")
    with open(MACHINES_PATH, "w") as f:
        json.dump(dict(sorted(machines.items())), f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1:])
