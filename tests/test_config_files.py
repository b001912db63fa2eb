"""YAML config files: inheritance between files, errors naming the files, shipped presets."""

import pathlib

import pytest

from jaxdrive.config import ConfigError, load_yaml
from jaxdrive.env import EnvConfig
from jaxdrive.scenarios.procedural import ProceduralConfig

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def write(tmp_path, name, text):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_inheritance_merges_parents_in_order_and_child_wins(tmp_path):
    write(tmp_path, "base.yaml", "env: {goal_radius: 3.0, observation: {num_road: 50}}\n"
                                 "procedural: {arm_length: 40}\n")
    write(tmp_path, "more/mid.yaml", "inherits: ../base.yaml\nenv: {observation: "
                                     "{num_partners: 7}}\n")
    write(tmp_path, "other.yaml", "env: {goal_radius: 4.0}\n")
    child = write(tmp_path, "child.yaml", "inherits: [more/mid.yaml, other.yaml]\n"
                                          "env: {init_step: 5}\n")
    got = load_yaml(child)
    assert got == {"env": {"goal_radius": 4.0, "observation": {"num_road": 50,
                                                               "num_partners": 7},
                           "init_step": 5},
                   "procedural": {"arm_length": 40}}


def test_cycles_and_missing_parents_are_errors_naming_the_files(tmp_path):
    write(tmp_path, "a.yaml", "inherits: b.yaml\n")
    write(tmp_path, "b.yaml", "inherits: a.yaml\n")
    with pytest.raises(ConfigError, match=r"cycle: a.yaml -> b.yaml -> a.yaml"):
        load_yaml(tmp_path / "a.yaml")
    write(tmp_path, "c.yaml", "inherits: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml' not found \(inherited by .*c.yaml"):
        load_yaml(tmp_path / "c.yaml")
    write(tmp_path, "d.yaml", "inherits: 3\n")
    with pytest.raises(ConfigError, match="inherits"):
        load_yaml(tmp_path / "d.yaml")
    with pytest.raises(ConfigError, match="not found"):
        load_yaml(tmp_path / "missing.yaml")


def test_shipped_presets_load_and_validate():
    for path in sorted(CONFIGS.glob("*.yaml")):
        data = load_yaml(path)
        EnvConfig.from_dict(data.get("env") or {}, "env")
        ProceduralConfig.from_dict(data.get("procedural") or {}, "procedural")
    adaptive = load_yaml(CONFIGS / "adaptive_simulate.yaml")
    assert adaptive["env"]["goal_behavior"] == "trial"
    assert adaptive["env"]["observation"]["num_road"] == 200  # from the parent


def test_run_config_files_accept_dotted_keys(tmp_path):
    from jaxdrive.runs.config import load_run_config

    write(tmp_path, "base.yaml", "env: {collision_behavior: stop, goal_radius: 3.0}\n"
                                 "train.seed: 3\n")
    child = write(tmp_path, "child.yaml", "inherits: base.yaml\n"
                                          "env.collision_behavior: remove\n"
                                          "env: {scenario.max_agents: 16}\n")
    config = load_run_config(str(child), {"train.num_envs": 8})
    assert (config.env.collision_behavior, config.env.goal_radius) == ("remove", 3.0)
    assert config.env.scenario.max_agents == 16
    assert (config.train.seed, config.train.num_envs) == (3, 8)
    # Each file expands before it merges: a child's mapping beats a parent's dotted key.
    write(tmp_path, "dotted.yaml", "env.goal_radius: 3.0\n")
    mapped = write(tmp_path, "mapped.yaml", "inherits: dotted.yaml\nenv: {goal_radius: 4.0}\n")
    assert load_run_config(str(mapped)).env.goal_radius == 4.0
    assert load_yaml(mapped, dotted=True) == {"env": {"goal_radius": 4.0}}
    assert load_yaml(tmp_path / "dotted.yaml") == {"env.goal_radius": 3.0}
    with pytest.raises(ConfigError, match="unknown config key 'env.colision_behavior'"):
        load_run_config(str(write(tmp_path, "typo.yaml", "env.colision_behavior: stop\n")))
    with pytest.raises(ConfigError, match="key 'env..x' must be a name or a dotted path"):
        load_run_config(str(write(tmp_path, "empty.yaml", "env..x: 1\n")))
