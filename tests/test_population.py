"""Population play: the member-per-env scheme, population directories, frozen partners
driving co-players in training (each member's forward pass on its own rows only) and in
evaluation (kept under ``clean`` when named explicitly)."""

import jax
import numpy as np
import pytest
import yaml

from jaxdrive.agents.actors import env_members, member_blocks, partner_caches
from jaxdrive.config import ConfigError
from jaxdrive.eval.evaluators import EVALUATORS
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.models.policy import Policy
from jaxdrive.runs.checkpoint import Checkpointer
from jaxdrive.runs.config import (
    POPULATION_MANIFEST,
    RunConfig,
    expand_co_players,
    member_config,
)
from jaxdrive.runs.load import save_config
from jaxdrive.train.population import write_manifest
from jaxdrive.train.ppo import PPO
from jaxdrive.train.run import build_env

# B = 6 envs of A = 4 slots: N = 24 rows, 12 per member with two members (sizes that no
# model dimension shares, so the jaxpr's row counts are unambiguous).
BASE = {
    "env": {"scenario": {"max_agents": 4}, "collision_behavior": "remove",
            "goal_behavior": "trial", "num_trials": 2, "trial_timeout": 6,
            "co_player_fraction": 1.0,
            "observation": {"num_partners": 3, "num_road": 20},
            "road_index": {"road_per_cell": 20, "grid_size": 8}},
    "procedural": {"num_agents": [3, 4], "topology": {"straight": 1.0, "curve": 1.0,
                                                      "t_junction": 0.0, "intersection": 0.0}},
    "policy": {"kind": "mlp", "model_dim": 16, "token_dim": 8},
    "train": {"seed": 5, "num_scenes": 2, "num_envs": 6, "rollout_steps": 4, "epochs": 1,
              "minibatches": 1},
    "validation": {"every": 0},
}
FORCED = (7, 3)  # member m always picks action FORCED[m]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Config, env, learner (a PPO state without partners), two biased partners and a
    population directory of them."""
    config = RunConfig.from_dict(BASE)
    env, env_params = build_env(config, 0, 2)
    policy = Policy.for_env(config.policy, env)
    alone = PPO(config, env, policy)
    state = alone.init(jax.random.key(2), env_params)
    learner = state.params
    partners = []
    for action in FORCED:
        params = jax.tree.map(lambda x: x, learner)  # a copy, then always `action`
        bias = params["params"]["pi_out"]["bias"]
        params["params"]["pi_out"]["bias"] = bias.at[action].set(1e4)
        partners.append((policy, params))
    pop_dir = tmp_path_factory.mktemp("pop")
    pop_config = RunConfig.from_dict({**BASE, "population": {"size": 2}})
    for m, (_, params) in enumerate(partners):
        run_dir = pop_dir / f"member_{m}"
        run_dir.mkdir()
        save_config(member_config(pop_config, m), run_dir / "config.yaml")
        with Checkpointer(run_dir / "checkpoints") as ckpt:
            ckpt.save(1, {"params": params}, {"step": 1})
    write_manifest(pop_dir, pop_config, 2)
    return dict(config=config, env=env, env_params=env_params, policy=policy, alone=alone,
                state=state, learner=learner, partners=partners, pop_dir=pop_dir)


def test_member_blocks_cover_every_env_exactly_once():
    # env i -> member i * M // B: B = 6, M = 2 gives [0, 0, 0, 1, 1, 1].
    np.testing.assert_array_equal(env_members(6, 2), [0, 0, 0, 1, 1, 1])
    assert member_blocks(6, 2) == ((0, 3), (3, 6))
    # Uneven (evaluation batches): B = 10, M = 4 -> [0,0,0,1,1,2,2,2,3,3].
    assert member_blocks(10, 4) == ((0, 3), (3, 5), (5, 8), (8, 10))
    for b, m in [(6, 2), (10, 4), (7, 7), (3, 5), (64, 4), (1, 1)]:
        seen = np.zeros(b, int)
        for i, (lo, hi) in enumerate(member_blocks(b, m)):
            seen[lo:hi] += 1
            assert np.all(env_members(b, m)[lo:hi] == i)
        assert np.all(seen == 1), (b, m)


def _rows_of_dots(jaxpr) -> list[int]:
    """Leading dimension of every dot_general's left operand, nested jaxprs included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            out.append(eqn.invars[0].aval.shape[0])
        for p in eqn.params.values():
            for sub in (p if isinstance(p, tuple | list) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out.extend(_rows_of_dots(inner))
    return out


def test_training_partners_run_on_their_own_rows_only_and_act_from_frozen_params(world):
    env, policy = world["env"], world["policy"]
    config, alone = world["config"], world["alone"]
    ppo = PPO(config, env, policy, world["partners"])
    # ppo.init's state, without a second reset: the partners' caches and the members.
    state = world["state"].replace(co_caches=partner_caches(ppo.co_players, 6, 4),
                                   co_member=ppo._members())
    args = (world["learner"], state.cache, state.co_caches, state.co_member,
            state.env_state, state.timestep, jax.random.key(3))
    base = _rows_of_dots(jax.make_jaxpr(alone._act)(*args[:2], (), *args[3:]).jaxpr)
    rows = _rows_of_dots(jax.make_jaxpr(ppo._act)(*args).jaxpr)
    n = ppo.num_rows  # 24
    # The learner alone: k matmuls over all 24 rows, none over 12. With two partners the
    # old scheme ran 3k over 24 rows; now the learner's k over 24 and k per member over
    # its 12 rows: one N-row pass of partner compute in all instead of M.
    k = base.count(n)
    assert k > 0 and base.count(n // 2) == 0
    assert rows.count(n) == k and rows.count(n // 2) == 2 * k
    np.testing.assert_array_equal(state.co_member, [0, 0, 0, 1, 1, 1])

    out = jax.jit(ppo._act)(*args)
    action = np.asarray(out[5]).reshape(6, 4)
    co = np.asarray(state.env_state.co_player) & np.asarray(state.timestep.active)
    ego = np.asarray(state.env_state.ego) & np.asarray(state.timestep.active)
    for i in range(6):
        assert co[i].any()
        assert np.all(action[i][co[i]] == FORCED[i // 3])  # envs 0-2: member 0, 3-5: 1
    assert not np.all(np.isin(action[ego], FORCED))
    assert [c.pos.shape[0] for c in out[8]] == [12, 12]  # each member's cache: its rows


def test_num_envs_not_a_multiple_of_the_members_names_the_key(world):
    config = RunConfig.from_dict({**BASE, "train": {**BASE["train"], "num_envs": 5}})
    with pytest.raises(ConfigError, match=r"train\.num_envs.*train\.co_players"):
        PPO(config, world["env"], world["policy"], world["partners"])


def test_population_directory_expands_to_its_members_and_bad_input_names_the_key(
        world, tmp_path):
    pop = world["pop_dir"]
    run = str(pop / "member_1")
    assert expand_co_players([str(pop), run]) == (str(pop / "member_0"),
                                                  str(pop / "member_1"), run)
    manifest = yaml.safe_load((pop / POPULATION_MANIFEST).read_text())
    assert [m["seed"] for m in manifest["members"]] == [5, 6]  # train.seed + i
    # A directory of runs without the manifest.
    (tmp_path / "runs" / "a").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"'train\.co_players\[1\]'.*population\.yaml"):
        expand_co_players([run, str(tmp_path / "runs")])
    missing = str(tmp_path / "missing")  # kept: load_policy names it
    assert expand_co_players([missing], key="co_players") == (missing,)
    # An incomplete population (1 of 2 members trained) is refused.
    (tmp_path / "half").mkdir()
    write_manifest(tmp_path / "half", RunConfig.from_dict({**BASE, "population": {
        "size": 2}}), 1)
    with pytest.raises(ConfigError, match=r"train\.co_players\[0\].*incomplete"):
        expand_co_players([str(tmp_path / "half")])
    # Member overrides are checked up front, naming the member.
    with pytest.raises(ConfigError, match=r"population\.members\[1\].*gooal"):
        RunConfig.from_dict({**BASE, "population": {
            "size": 2, "members": [{}, {"env.reward.gooal": 1.0}]}})


def _partner_specs(world):
    env_config = world["config"].env.replace(co_player_fraction=0.0)
    specs = load_suite_specs({"eval": {
        "partners": {"type": "multi_scenario", "num_scenarios": 6, "batch_size": 6,
                     "num_steps": 2, "co_players": str(world["pop_dir"]),
                     "env.co_player_fraction": 1.0},
        "plain": {"type": "multi_scenario", "env.co_player_fraction": 1.0},
        "inherited": {"type": "multi_scenario", "co_players": str(world["pop_dir"])}}},
        base_env=env_config.replace(co_player_fraction=0.5),
        base_procedural=world["config"].procedural)
    return specs, env_config


def test_evaluator_partners_survive_clean_and_drive_every_co_player(world):
    specs, env_config = _partner_specs(world)
    plain, inherited, spec = specs["plain"], specs["inherited"], specs["partners"]
    # Without partners clean zeroes co-players unless the section sets the fraction; with
    # partners the fraction stays (the section's, or the base env's).
    assert plain.env.co_player_fraction == 1.0  # set explicitly: clean overridden
    assert inherited.env.co_player_fraction == 0.5
    assert "env.co_player_fraction" in inherited.clean_overridden
    assert spec.env.co_player_fraction == 1.0 and spec.deterministic
    nothing = load_suite_specs({"eval": {"v": {"type": "multi_scenario"}}},
                               base_env=env_config.replace(co_player_fraction=0.5))["v"]
    assert nothing.env.co_player_fraction == 0.0
    with pytest.raises(ConfigError, match="co_player_fraction"):
        load_suite_specs({"eval": {"v": {"type": "multi_scenario",
                                         "co_players": str(world["pop_dir"])}}},
                         base_env=env_config)

    evaluator = EVALUATORS[spec.type](spec)
    env_params = world["env_params"]
    actor = evaluator._actors(world["env"], world["policy"])["policy"]
    state, ts = world["state"].env_state, world["state"].timestep
    action, _ = jax.jit(actor.act)(world["learner"], actor.init(6), env_params, state, ts,
                                   jax.random.key(5))
    action = np.asarray(action)
    co = np.asarray(state.co_player) & np.asarray(ts.active)
    ego = np.asarray(state.ego) & np.asarray(ts.active)
    for i in range(6):
        assert co[i].any() and np.all(action[i][co[i]] == FORCED[i // 3])
    assert not np.all(np.isin(action[ego], FORCED))


# Slow-marked for the CI budget (compiles a whole evaluation rollout); its default-run
# sibling is test_evaluator_partners_survive_clean_and_drive_every_co_player, which runs
# the same actor (Evaluator._actors, what the rollout is built from) for one step.
@pytest.mark.slow
def test_evaluator_with_partners_runs_and_counts_ego_agents_only(world):
    spec = _partner_specs(world)[0]["partners"]
    evaluator = EVALUATORS[spec.type](spec)
    result = evaluator.run(world["policy"], world["learner"])
    assert result.status == "ok", result.error
    assert result.metrics["agent_episodes"] == 6


def test_population_cli_bad_input_is_an_error_naming_the_key(tmp_path, capsys):
    from jaxdrive.train import cli

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**BASE, "logging": {"output_dir": str(tmp_path / "runs")},
                                    "population": {"members": [{}, {}]}}))
    assert cli.main(["--config", str(path)]) == 2  # 2 members listed, size 0
    assert "population" in (err := capsys.readouterr().err) and "size" in err, err
    assert cli.main(["--config", str(path), "--population", "0"]) == 2
    assert "--population 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--config", str(path), "--population", "2", "--resume", str(tmp_path)])
    assert not (tmp_path / "runs").exists()


# Slow-marked for the CI budget (trains two one-iteration runs); its default-run siblings
# are the manifest and expansion checks above (write_manifest, expand_co_players).
@pytest.mark.slow
def test_population_command_trains_members_into_a_population_directory(tmp_path, capsys):
    from jaxdrive.train import cli

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({
        **BASE, "env": {**BASE["env"], "co_player_fraction": 0.0},
        "train": {**BASE["train"], "total_steps": 96},
        "logging": {"output_dir": str(tmp_path / "runs"), "run_name": "pop"},
        "population": {"members": [{"env.reward.step": -0.1}]}}))
    assert cli.main(["--config", str(path), "--population", "2"]) == 0
    pop = tmp_path / "runs" / "pop"
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(pop)
    manifest = yaml.safe_load((pop / POPULATION_MANIFEST).read_text())
    assert manifest["size"] == 2
    assert [m["overrides"] for m in manifest["members"]] == [{"env.reward.step": -0.1}, {}]
    members = expand_co_players([str(pop)])
    assert members == (str(pop / "member_0"), str(pop / "member_1"))
    saved = [yaml.safe_load((pop / f"member_{i}" / "config.yaml").read_text()) for i in (0, 1)]
    assert [s["train"]["seed"] for s in saved] == [5, 6]
    assert [s["env"]["reward"]["step"] for s in saved] == [-0.1, 0.0]
    assert "population" not in saved[0]
