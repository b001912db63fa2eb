"""Regression tests of issue 15's config defects (items 5, 8, 9, 10 and "Configs").

Each test failed before the fix (checked against the tree before it): a NaN or inf that
passed the range checks, a YAML input that crashed or hung, a ``--set`` syntax error
that escaped as a traceback, a path or list key of the wrong type, a size that crashed
deep inside JAX, a name that became a path outside its root. No JAX compilation here:
configs are plain Python.
"""

from __future__ import annotations

import dataclasses
import math
import typing

import pytest

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_interval,
    check_range,
    load_yaml,
    parse_overrides,
    resolve_config_path,
)
from jaxdrive.eval.evaluators import EVALUATORS
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.runs.config import RunConfig, load_run_config
from jaxdrive.runs.load import read_run_config


def _run(*pairs: str) -> RunConfig:
    return load_run_config(None, parse_overrides(list(pairs)))


def _write(tmp_path, text: str | bytes, name: str = "run.yaml") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


# --- defect 5: NaN and inf pass the range checks ----------------------------------------

FLOAT_KEYS = [
    "train.learning_rate", "train.gamma", "train.gae_lambda", "train.clip_eps",
    "train.entropy_coef", "train.value_coef", "train.ema_alpha", "train.max_grad_norm",
    "train.adam_eps", "train.value_clip_eps", "env.goal_radius", "env.controlled_fraction",
    "env.co_player_fraction", "env.static_threshold", "env.reward.goal",
    "env.reward.collision", "env.reward.offroad", "env.reward.progress", "env.reward.step",
    "env.dynamics.dt", "env.dynamics.bicycle.max_speed", "env.observation.road_radius",
    "env.road_index.margin", "procedural.arm_length", "procedural.topology.curve",
    "video.ego_metres_per_pixel",
]


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_nan_and_inf_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key.rsplit(".", 1)[-1]):
        _run(f"{key}={value}")


@pytest.mark.parametrize("key", ["env.new_goal_distance", "procedural.speed",
                                 "procedural.lane_width"])
def test_nan_inside_an_interval_is_refused(key):
    with pytest.raises(ConfigError, match=key.rsplit(".", 1)[-1]):
        _run(f"{key}=[1.0, .nan]")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_check_range_and_check_interval_refuse_non_finite(value):
    # Before: NaN compares False with every bound, so both passed it.
    with pytest.raises(ConfigError, match="'x'"):
        check_range("x", value, 0.0, 1.0)
    with pytest.raises(ConfigError, match="finite"):
        check_range("x", value)
    with pytest.raises(ConfigError, match="'x"):
        check_interval("x", (0.0, value))


def _config_classes() -> list[type[ConfigBase]]:
    found, todo = [], [ConfigBase]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return sorted(set(found), key=lambda c: c.__name__)


def _float_fields() -> list[tuple[type[ConfigBase], str, bool]]:
    out = []
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            text = str(hints[f.name])
            if "float" in text:
                out.append((cls, f.name, text.startswith("tuple")))
    return out


def test_every_float_field_of_every_config_refuses_nan_and_inf():
    # The audit: all ConfigBase subclasses of the package (the evaluators' included).
    fields = _float_fields()
    assert len(fields) > 60
    required = {"classes": ("a",)}
    for cls, name, pair in fields:
        for bad in (math.nan, math.inf):
            value = [1.0, bad] if pair else bad
            extra = {k: v for k, v in required.items()
                     if k in {f.name for f in dataclasses.fields(cls)}}
            with pytest.raises(ConfigError, match=name):
                cls.from_dict({name: value, **extra})


def test_huge_numbers_are_refused():
    # 1e39 is inf in float32 (the device); 10**30 overflows every integer dtype.
    with pytest.raises(ConfigError, match="max_grad_norm"):
        _run("train.max_grad_norm=1e39")
    with pytest.raises(ConfigError, match="total_steps"):
        _run(f"train.total_steps={10**30}")


# --- YAML (defect 9, 10) ------------------------------------------------------------------

def test_yaml_scientific_floats_are_floats(tmp_path):
    path = _write(tmp_path, "train:\n  learning_rate: 1e-3\n  adam_eps: 1E-8\n")
    config = load_run_config(path)
    assert config.train.learning_rate == 0.001
    assert config.train.adam_eps == 1e-8
    assert _run("train.learning_rate=2e-4").train.learning_rate == 2e-4


def test_yaml_duplicate_keys_are_an_error_naming_the_key_and_file(tmp_path):
    path = _write(tmp_path, "train:\n  seed: 1\n  epochs: 2\n  seed: 2\n")
    with pytest.raises(ConfigError, match=r"run\.yaml.*'seed'.*twice"):
        load_run_config(path)
    top = _write(tmp_path, "train: {seed: 1}\ntrain: {seed: 2}\n", "top.yaml")
    with pytest.raises(ConfigError, match="'train'"):
        load_run_config(top)


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    path = _write(tmp_path, "base: &b {seed: 3, epochs: 2}\n"
                  "train:\n  <<: *b\n  seed: 5\n", "merge.yaml")
    data = load_yaml(path)
    assert data["train"] == {"seed": 5, "epochs": 2}


def _bomb(levels: int) -> str:
    """``levels`` anchors of 9 aliases each to the previous one, inside a real key:
    9**levels strings once expanded (387 million for 9) in a few hundred bytes."""
    names = "abcdefghi"[:levels]
    items = [f"&a [{', '.join(['lol'] * 9)}]"]
    items += [f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in
              zip(names[:-1], names[1:], strict=True)]
    return "train:\n  co_players: [" + ", ".join(items) + "]\n"


@pytest.mark.parametrize("levels", [6, 9])
def test_yaml_alias_bomb_fails_with_a_short_message(tmp_path, levels):
    # Before: the values were expanded by the checks and printed in the error (the issue:
    # 30 s and a 351 MB message; 6 levels here gave a 4 MB message).
    text = _bomb(levels)
    assert len(text) < 700
    path = _write(tmp_path, text, "bomb.yaml")
    with pytest.raises(ConfigError, match="bomb.yaml.*expands to more than") as e:
        load_run_config(path)
    assert len(str(e.value)) < 500
    with pytest.raises(ConfigError, match="not valid YAML") as e:
        parse_overrides([f"train.co_players={text.splitlines()[1].split(': ', 1)[1]}"])
    assert len(str(e.value)) < 500


def test_yaml_recursive_alias_is_an_error(tmp_path):
    path = _write(tmp_path, "train: &a\n  x: *a\n", "rec.yaml")
    with pytest.raises(ConfigError, match="rec.yaml.*recursive"):
        load_run_config(path)


def test_yaml_deep_nesting_is_an_error(tmp_path):
    path = _write(tmp_path, "a: " + "[" * 5000 + "]" * 5000 + "\n", "deep.yaml")
    with pytest.raises(ConfigError, match="deep.yaml"):
        load_run_config(path)


def test_non_utf8_file_is_an_error(tmp_path):
    path = _write(tmp_path, b"train:\n  seed: \xff\xfe\n", "latin.yaml")
    with pytest.raises(ConfigError, match="latin.yaml.*UTF-8"):
        load_run_config(path)


def test_directory_as_config_is_an_error(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        resolve_config_path(str(tmp_path / "dir"))
    with pytest.raises(ConfigError, match="is a directory"):
        load_run_config(str(tmp_path / "dir"))
    child = _write(tmp_path, "inherits: dir\n", "child.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_run_config(child)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\n", "null\n"])
def test_empty_config_file_is_an_error_with_a_hint(tmp_path, text):
    # Before: an empty file trained the full defaults without a word.
    path = _write(tmp_path, text, "empty.yaml")
    with pytest.raises(ConfigError, match=r"empty.yaml.*empty.*'\{\}'"):
        load_run_config(path)


def test_explicit_empty_mapping_means_all_defaults(tmp_path):
    assert load_run_config(_write(tmp_path, "{}\n", "defaults.yaml")) == RunConfig()


@pytest.mark.parametrize("text", [
    "train: !!python/object/apply:os.system ['true']\n",
    "train: !!python/name:os.system\n",
])
def test_python_tags_stay_refused(tmp_path, text):
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(_write(tmp_path, text, "tag.yaml"))


# --- --set syntax (defect 9) --------------------------------------------------------------

@pytest.mark.parametrize("pairs", [
    ["train.num_envs=="],
    ["x={a: 1"],
    ["x=[1, 2"],
    ["x=1", "x.y=2"],
    ["train=3", "train.seed=1"],
    ["=3"],
    ["a..b=1"],
    [".a=1"],
    ["a.=1"],
    ["novalue"],
    ["x=!!python/object/apply:os.system ['true']"],
    ["x={a: 1, a: 2}"],
    ["x=a\n---\nb"],
])
def test_set_syntax_errors_are_clean(pairs):
    with pytest.raises(ConfigError, match="override") as e:
        parse_overrides(pairs)
    assert repr(pairs[-1])[1:-1][:10] in str(e.value)


def test_set_later_value_of_a_key_wins():
    assert parse_overrides(["a.b=1", "a.b=2", "a.c=x"]) == {"a": {"b": 2, "c": "x"}}
    assert parse_overrides(["a={b: 1}", "a.c=2"]) == {"a": {"b": 1, "c": 2}}


# --- types of path and list keys (defect 9) -----------------------------------------------

@pytest.mark.parametrize("pair", [
    "data.path=3", "data.validation_path=3", "evaluation.suite_file=1",
    "evaluation.suite=2", "logging.output_dir=3", "data.subset=4", "data.path=''",
    "logging.output_dir=''", "logging.wandb_project=[a]",
])
def test_path_and_name_keys_given_other_types_are_errors(pair):
    key = pair.split("=")[0].rsplit(".", 1)[-1]
    with pytest.raises(ConfigError, match=key):
        _run(pair)


def test_a_string_for_a_list_key_is_a_list_of_one():
    # Before: 'notalist' became 8 co-player directories, one per character.
    assert _run("train.co_players=notalist").train.co_players == ("notalist",)
    assert _run("train.co_players=[a, b]").train.co_players == ("a", "b")
    assert _run("env.controlled_types=vehicle").env.controlled_types == ("vehicle",)


@pytest.mark.parametrize("pair, key", [
    ("train.co_players=[a, 3]", r"co_players\[1\]"),
    ("train.co_players=[a, '']", r"co_players\[1\]"),
    ("train.co_players={a: 1}", "co_players"),
    ("env.controlled_types=[vehicle, [x]]", "controlled_types"),
    ("env.new_goal_distance=[1, x]", r"new_goal_distance\[1\]"),
    ("env.new_goal_distance=[1, 2, 3]", "new_goal_distance"),
    ("procedural.num_agents=[1, 2.5]", r"num_agents\[1\]"),
    ("video.views=[scene, 3]", "views"),
])
def test_list_keys_check_their_elements(pair, key):
    with pytest.raises(ConfigError, match=key):
        _run(pair)


# --- sizes that crashed deep inside (defect 9) --------------------------------------------

@pytest.mark.parametrize("pair, key", [
    ("env.observation.num_road=0", "num_road"),
    ("env.observation.num_road=-1", "num_road"),
    ("train.num_envs=0", "num_envs"),
    ("policy.road_group=0", "road_group"),
    ("env.road_index.chunk_size=0", "chunk_size"),
])
def test_zero_sizes_are_range_errors(pair, key):
    with pytest.raises(ConfigError, match=key):
        _run(pair)


def test_eval_seed_is_a_32_bit_seed():
    # A JAX key holds 32 bits of an int seed; 2**62 became the key of seed 0.
    with pytest.raises(ConfigError, match="seed"):
        load_suite_specs({"eval": {"v": {"type": "multi_scenario", "seed": 2**62}}})


def test_missing_required_key_is_a_config_error():
    cls = EVALUATORS["behavior_class"].Config
    with pytest.raises(ConfigError, match="'classes'.*required"):
        cls.from_dict({})


def test_non_mapping_and_mixed_keys_are_config_errors():
    with pytest.raises(ConfigError, match="mapping"):
        RunConfig.from_dict(["train"])
    with pytest.raises(ConfigError, match="unknown config key"):
        RunConfig.from_dict({1: 2, "b": 3})
    with pytest.raises(ConfigError, match="unknown config key"):
        RunConfig.from_dict({"env": {"dynamics": {1: 2, "b": 3}}})


# --- names confined (defect 8) ------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/tmp/x", "..", ".", "a/b", "a\\b", "",
                                  " x", "a\x00b"])
def test_run_name_must_stay_inside_output_dir(name):
    with pytest.raises(ConfigError, match="run_name"):
        RunConfig.from_dict({"logging": {"run_name": name}})


def test_ordinary_run_names_are_accepted():
    assert _run("logging.run_name=my-run_1.2").logging.run_name == "my-run_1.2"


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", "/abs"])
def test_eval_section_names_must_be_safe_names(name):
    with pytest.raises(ConfigError, match="eval section"):
        load_suite_specs({"eval": {name: {"type": "multi_scenario"}}})


def test_render_view_names_are_chosen_from_the_views():
    data = {"eval": {"v": {"type": "multi_scenario",
                           "render": {"enabled": True, "views": ["../x"]}}}}
    with pytest.raises(ConfigError, match="views"):
        load_suite_specs(data)
    with pytest.raises(ConfigError, match="views"):
        _run("video.views=[../x]")


@pytest.mark.parametrize("cls_name", ["../../x", "/abs", "a/b", ""])
def test_behavior_class_names_must_be_safe_names(cls_name):
    # Each class becomes part of an evaluator name, hence of its output paths.
    data = {"eval": {"bc": {"type": "behavior_class", "scenarios": "some/dir",
                            "classes": ["ok", cls_name]}}}
    with pytest.raises(ConfigError, match="classes"):
        load_suite_specs(data)


@pytest.mark.parametrize("text", ["- a\n- b\n", "env: {a: 1\n", "\xff\xfe", ""])
def test_a_damaged_run_config_is_an_error_naming_the_file(tmp_path, text):
    # A run directory's config.yaml read back (eval/render --checkpoint, --resume).
    (tmp_path / "config.yaml").write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match="config.yaml"):
        read_run_config(tmp_path)
