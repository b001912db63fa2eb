"""Evaluation suites from config: inheritance, templates, the clean macro, validation,
the registry of evaluator types."""

import dataclasses
import json
import pickle
import re
from pathlib import Path

import pytest

from jaxdrive.config import ConfigError, check_int
from jaxdrive.env import EnvConfig
from jaxdrive.eval.evaluator import Evaluator
from jaxdrive.eval.evaluators import (
    AdaptationConfig,
    make_evaluators,
    register_evaluator,
    registered_evaluator,
    unregister_evaluator,
)
from jaxdrive.eval.spec import EvaluatorConfig
from jaxdrive.eval.suite import (
    CLEAN_SETTINGS,
    EVALUATOR_TYPES,
    RenderSpec,
    due,
    evaluator_types,
    load_suite_file,
    load_suite_specs,
    select_suite,
)
from jaxdrive.scenarios.procedural import ProceduralConfig

DEFAULT_YAML = Path(__file__).parents[1] / "configs" / "eval" / "default.yaml"


def specs_of(sections, suites=None, **kwargs):
    data = {"eval": sections}
    if suites is not None:
        data["suites"] = suites
    return load_suite_specs(data, **kwargs)


def error(sections, suites=None, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        specs_of(sections, suites, **kwargs)
    return str(info.value)


def test_three_level_chain_resolves_with_the_child_winning_at_every_level():
    specs = specs_of({
        "grand": {"template": True, "num_scenarios": 8, "seed": 1, "batch_size": 4,
                  "env": {"goal_radius": 3.0, "collision_behavior": "stop"},
                  "render": {"enabled": True, "width": 128}},
        "parent": {"type": "multi_scenario", "inherits": "grand", "seed": 2,
                   "interval": 10, "env.collision_behavior": "remove"},
        "child": {"type": "human_replay", "inherits": "parent", "batch_size": 2,
                  "interval": 5, "render.views": ["scene", "ego"]},
    })
    assert list(specs) == ["parent", "child"]
    parent, child = specs["parent"], specs["child"]
    # parent: seed from itself, num_scenarios / batch_size from grand.
    assert (parent.type, parent.seed, parent.num_scenarios, parent.batch_size,
            parent.interval) == ("multi_scenario", 2, 8, 4, 10)
    # child: batch_size / interval / type its own, seed from parent, num_scenarios grand.
    assert (child.type, child.seed, child.num_scenarios, child.batch_size,
            child.interval) == ("human_replay", 2, 8, 2, 5)
    # Nested mappings merge key by key down the chain.
    assert (child.env.goal_radius, child.env.collision_behavior) == (3.0, "remove")
    assert child.render == RenderSpec(enabled=True, views=("scene", "ego"), width=128)
    assert parent.render.views == ("scene",)


def test_list_parents_merge_in_order_then_the_child():
    sections = {
        "a": {"template": True, "seed": 1, "num_steps": 10, "env.goal_radius": 3.0},
        "b": {"template": True, "seed": 2, "batch_size": 8, "env.goal_radius": 4.0},
        "ab": {"type": "multi_scenario", "inherits": ["a", "b"]},
        "ba": {"type": "multi_scenario", "inherits": ["b", "a"]},
        "ab_own": {"type": "multi_scenario", "inherits": ["a", "b"], "seed": 3},
    }
    specs = specs_of(sections)
    ab, ba, own = specs["ab"], specs["ba"], specs["ab_own"]
    assert (ab.seed, ab.num_steps, ab.batch_size, ab.env.goal_radius) == (2, 10, 8, 4.0)
    assert (ba.seed, ba.num_steps, ba.batch_size, ba.env.goal_radius) == (1, 10, 8, 3.0)
    assert own.seed == 3


def test_inheritance_cycles_name_the_chain():
    msg = error({"a": {"type": "multi_scenario", "inherits": "b"},
                 "b": {"type": "multi_scenario", "inherits": "a"}})
    assert "cycle: a -> b -> a." in msg
    msg = error({"c": {"type": "multi_scenario", "inherits": ["c"]}})
    assert "cycle: c -> c." in msg
    msg = error({"x": {"type": "multi_scenario", "inherits": "a"},
                 "a": {"template": True, "inherits": "b"},
                 "b": {"template": True, "inherits": "a"}})
    assert "cycle: x -> a -> b -> a." in msg


def test_unknown_parent_names_section_parent_and_suggestion():
    msg = error({"_base": {"template": True},
                 "val": {"type": "multi_scenario", "inherits": "_bse"}})
    assert "eval section 'val' inherits unknown section '_bse'." in msg
    assert "Did you mean '_base'?" in msg
    assert "Available sections: _base, val." in msg
    assert "'inherits' must be" in error({"v": {"type": "planning", "inherits": 3}})


def test_templates_are_skipped_and_not_selectable():
    sections = {"_base": {"template": True, "num_scenarios": 4},
                "val": {"type": "multi_scenario", "inherits": "_base"},
                "child_of_template_is_no_template": {"type": "planning",
                                                     "inherits": "_base"}}
    specs = specs_of(sections)
    assert list(specs) == ["val", "child_of_template_is_no_template"]
    assert specs["val"].num_scenarios == 4
    data = {"eval": sections}
    with pytest.raises(ConfigError, match="'_base', a template section"):
        select_suite(data, "_base")
    with pytest.raises(ConfigError, match="'_base', a template section"):
        select_suite(data, ["val", "_base"])
    with pytest.raises(ConfigError, match="suite 'bad' names '_base', a template"):
        specs_of(sections, {"bad": ["val", "_base"]})
    # A template's keys are still checked even when no section inherits it.
    msg = error({"_t": {"template": True, "num_scenario": 3}})
    assert "eval section '_t': unknown key 'num_scenario'" in msg
    assert "Did you mean 'num_scenarios'?" in msg


def test_clean_macro_applies_under_the_section():
    base_env = EnvConfig(co_player_fraction=0.5)
    spec = specs_of({"v": {"type": "multi_scenario"}}, base_env=base_env)["v"]
    assert CLEAN_SETTINGS == {"deterministic": True, "env.co_player_fraction": 0.0}
    assert spec.clean and spec.deterministic
    assert spec.env.co_player_fraction == 0.0
    assert spec.clean_applied == ("deterministic", "env.co_player_fraction")
    assert spec.clean_overridden == ()
    assert spec.resolved["deterministic"] is True
    assert spec.resolved["env"]["co_player_fraction"] == 0.0


def test_clean_false_leaves_training_settings():
    base_env = EnvConfig(co_player_fraction=0.5)
    specs = specs_of({"_base": {"template": True, "clean": True},
                      "v": {"type": "adaptation", "inherits": "_base", "clean": False,
                            "env.goal_behavior": "trial"}}, base_env=base_env)
    spec = specs["v"]
    # The template's clean: true must not leak its settings into a clean: false child.
    assert not spec.clean and not spec.deterministic
    assert spec.env.co_player_fraction == 0.5
    assert spec.clean_applied == spec.clean_overridden == ()


def test_clean_macro_loses_to_explicit_and_inherited_values():
    base_env = EnvConfig(co_player_fraction=0.5)
    specs = specs_of({
        "_base": {"template": True, "env": {"co_player_fraction": 0.25}},
        "explicit": {"type": "multi_scenario", "deterministic": False},
        "inherited": {"type": "multi_scenario", "inherits": "_base"},
        "both": {"type": "multi_scenario", "inherits": "_base", "deterministic": True},
    }, base_env=base_env)
    explicit, inherited, both = specs["explicit"], specs["inherited"], specs["both"]
    assert (explicit.deterministic, explicit.env.co_player_fraction) == (False, 0.0)
    assert explicit.clean_applied == ("env.co_player_fraction",)
    assert explicit.clean_overridden == ("deterministic",)
    assert (inherited.deterministic, inherited.env.co_player_fraction) == (True, 0.25)
    assert inherited.clean_applied == ("deterministic",)
    assert inherited.clean_overridden == ("env.co_player_fraction",)
    assert both.clean_applied == ()
    assert both.clean_overridden == ("deterministic", "env.co_player_fraction")


def test_unknown_or_missing_type_lists_the_types():
    msg = error({"v": {"type": "multi_scenaro"}})
    assert msg.startswith("eval section 'v': config key 'type' = 'multi_scenaro' is not "
                          "allowed.")
    assert "Did you mean 'multi_scenario'?" in msg
    assert "Allowed values: " + ", ".join(EVALUATOR_TYPES) + "." in msg
    assert EVALUATOR_TYPES == ("multi_scenario", "human_replay", "behavior_class",
                               "adaptation", "planning", "realism")
    msg = error({"v": {"interval": 5}})
    assert "eval section 'v' has no 'type'" in msg and "template: true" in msg


def test_unknown_key_names_key_section_allowed_keys_and_suggestion():
    msg = error({"v": {"type": "multi_scenario", "num_scenario": 4}})
    assert msg.startswith("eval section 'v': unknown key 'num_scenario' for evaluator "
                          "type 'multi_scenario'. Did you mean 'num_scenarios'?")
    assert "Allowed keys: batch_size, clean, co_players, deterministic," in msg
    # Another type's key is unknown here, and the section that set it is named.
    msg = error({"_base": {"template": True, "num_trials": 3},
                 "v": {"type": "planning", "inherits": "_base"}})
    assert "unknown key 'num_trials' (set in section '_base') for evaluator type 'planning'" \
        in msg
    # Unknown nested keys name the full path.
    msg = error({"v": {"type": "planning", "render.view": ["ego"]}})
    assert "unknown config key 'render.view'" in msg and "Did you mean 'views'?" in msg


def test_dotted_keys_equal_nested_mappings_and_mix():
    dotted = {"type": "multi_scenario", "env.collision_behavior": "remove",
              "env.scenario.max_agents": 32, "render.views": ["ego"],
              "procedural.arm_length": 40.0}
    nested = {"type": "multi_scenario", "env": {"collision_behavior": "remove",
                                                "scenario": {"max_agents": 32}},
              "render": {"views": ["ego"]}, "procedural": {"arm_length": 40.0}}
    # Dotted keys inside a mapping expand too, and keys that set different settings
    # merge; two keys that set the same one are an error (issue 40: one was dropped).
    mixed = {"type": "multi_scenario", "env.collision_behavior": "remove",
             "env": {"scenario.max_agents": 32}, "render.views": ["ego"],
             "procedural": {"arm_length": 40.0}}
    clash = {"type": "multi_scenario", "env.collision_behavior": "remove",
             "env": {"collision_behavior": "stop"}}
    assert ("keys 'env.collision_behavior' and 'env' both set 'env.collision_behavior'"
            in error({"v": clash}))
    assert "keys 'render' and 'render.views' both set 'render.views'" in error(
        {"v": {"type": "planning", "render": {"views": ["scene"]}, "render.views": ["ego"]}})
    specs = specs_of({"dotted": dotted, "nested": nested, "mixed": mixed})
    for spec in specs.values():
        assert spec.env.collision_behavior == "remove"
        assert spec.env.scenario.max_agents == 32
        assert spec.render.views == ("ego",)
        assert spec.procedural.arm_length == 40.0
    assert specs["dotted"].env == specs["nested"].env == specs["mixed"].env
    assert specs["dotted"].resolved == specs["nested"].resolved == specs["mixed"].resolved
    assert "must be a name or a dotted path" in error({"v": {"type": "planning",
                                                              "env..x": 1}})


def test_bad_env_and_procedural_overrides_name_the_key_path():
    msg = error({"v": {"type": "multi_scenario", "env.collision_behavior": "explode"}})
    assert msg.startswith("eval section 'v': config key 'env.collision_behavior' = "
                          "'explode' is not allowed.")
    msg = error({"v": {"type": "multi_scenario", "env": {"colision_behavior": "stop"}}})
    assert "eval section 'v': unknown config key 'env.colision_behavior'" in msg
    assert "Did you mean 'collision_behavior'?" in msg
    msg = error({"v": {"type": "multi_scenario", "env.scenario.num_steps": 1}})
    assert "config key 'env.scenario.num_steps' = 1 is out of range" in msg
    msg = error({"v": {"type": "multi_scenario", "procedural.arm_length": 1.0}})
    assert "config key 'procedural.arm_length' = 1.0 is out of range" in msg
    msg = error({"v": {"type": "multi_scenario", "env": ["remove"]}})
    assert "config key 'env' must be a mapping of EnvConfig overrides" in msg


def test_overrides_merge_onto_the_base_configs():
    base_env = EnvConfig(goal_radius=5.0, collision_behavior="stop")
    base_procedural = ProceduralConfig(arm_length=80.0)
    spec = specs_of({"v": {"type": "multi_scenario", "env.collision_behavior": "remove"}},
                    base_env=base_env, base_procedural=base_procedural)["v"]
    assert (spec.env.goal_radius, spec.env.collision_behavior) == (5.0, "remove")
    assert spec.procedural == base_procedural


def test_type_params_defaults_and_checks():
    specs = specs_of({
        "p": {"type": "planning", "ttc_horizon": 2},
        "a": {"type": "adaptation", "env.goal_behavior": "trial", "trial_timeout": 20},
        "b": {"type": "behavior_class", "classes": ["hard_stop"]},
        "m": {"type": "multi_scenario"},
    })
    assert dict(specs["p"].params) == {"ttc_horizon": 2.0, "comfort_max_accel": 4.0,
                                       "comfort_max_jerk": 4.0, "progress_min_ratio": 0.2}
    assert dict(specs["a"].params) == {"num_trials": 3, "trial_timeout": 20,
                                       "confidence": 0.95}
    # The adaptation evaluator's trial keys are written into its env.
    assert (specs["a"].env.num_trials, specs["a"].env.trial_timeout) == (3, 20)
    # trial_timeout: null keeps the base env's (here a run's) and reports it.
    run_env = EnvConfig(goal_behavior="trial", num_trials=2, trial_timeout=40)
    kept = specs_of({"a": {"type": "adaptation"}}, base_env=run_env)["a"]
    assert (kept.env.num_trials, kept.env.trial_timeout) == (3, 40)
    assert kept.params["trial_timeout"] == 40
    assert dict(specs["b"].params) == {"classes": ("hard_stop",), "scenarios_per_class": 16}
    assert dict(specs["m"].params) == {}
    m = specs["m"]
    assert (m.enabled, m.interval, m.mode, m.seed, m.num_scenarios, m.batch_size,
            m.num_steps, m.scenarios) == (True, 0, "inline", 0, 64, 64, 0, None)
    assert m.render == RenderSpec()
    with pytest.raises(TypeError):
        m.params["x"] = 1

    trial = {"type": "adaptation", "env.goal_behavior": "trial"}
    assert "config key 'num_trials' = 1 is out of range" in error(
        {"a": {**trial, "num_trials": 1}})
    assert "config key 'confidence' = 1.0 is out of range; allowed (0.0, 1.0)" in error(
        {"a": {**trial, "confidence": 1.0}})
    assert "contradicts 'num_trials' = 3" in error({"a": {**trial, "env.num_trials": 4}})
    assert "only apply with goal_behavior: trial" in error({"a": {"type": "adaptation"}})
    assert "evaluator type 'behavior_class' needs the key 'classes'" in error(
        {"b": {"type": "behavior_class"}})
    assert "non-empty list of names" in error({"b": {"type": "behavior_class",
                                                     "classes": []}})
    assert "config key 'ttc_horizon' = 0 is out of range" in error(
        {"p": {"type": "planning", "ttc_horizon": 0}})
    assert "config key 'mode' = 'subproc' is not allowed. Did you mean 'subprocess'?" in \
        error({"m": {"type": "multi_scenario", "mode": "subproc"}})
    assert "config key 'enabled' must be true or false" in error(
        {"m": {"type": "multi_scenario", "enabled": "no"}})
    assert "config key 'render.width' = 255 must be even" in error(
        {"m": {"type": "multi_scenario", "render.width": 255}})


def test_render_is_capped_at_the_evaluated_scenarios():
    spec = specs_of({"v": {"type": "multi_scenario", "num_scenarios": 1,
                           "render": {"enabled": True, "num_scenarios": 4}}})["v"]
    assert spec.render.num_scenarios == 1


def test_scenario_paths_expand_variables(monkeypatch):
    monkeypatch.setenv("EVAL_DATA", "/data/womd")
    monkeypatch.delenv("EVAL_UNSET", raising=False)
    spec = specs_of({"v": {"type": "human_replay",
                           "scenarios": ["$EVAL_DATA/val", "/abs/shards"]}})["v"]
    assert spec.scenarios == ("/data/womd/val", "/abs/shards")
    msg = error({"v": {"type": "human_replay", "scenarios": ["${EVAL_UNSET}/val"]}})
    assert "environment variable 'EVAL_UNSET', which is not set" in msg


def test_specs_are_hashable_picklable_and_resolved_is_plain():
    sections = {"v": {"type": "behavior_class", "classes": ["lane_change"],
                      "env.collision_behavior": "remove", "interval": 7}}
    spec = specs_of(sections)["v"]
    again = specs_of(sections)["v"]
    assert spec == again and hash(spec) == hash(again)
    assert pickle.loads(pickle.dumps(spec)) == spec
    resolved = json.loads(json.dumps(spec.resolved))
    assert resolved["classes"] == ["lane_change"]
    assert resolved["env"]["collision_behavior"] == "remove"
    assert resolved["interval"] == 7
    # The resolved dict rebuilds the same evaluator.
    rebuilt = specs_of({"v": resolved})["v"]
    assert (rebuilt.env, rebuilt.procedural, rebuilt.params, rebuilt.render) == \
        (spec.env, spec.procedural, spec.params, spec.render)


def evaluators(intervals):
    return {name: {"type": "multi_scenario", "interval": interval, "enabled": enabled}
            for name, (interval, enabled) in intervals.items()}


def test_due_runs_only_enabled_evaluators_whose_interval_divides():
    specs = specs_of(evaluators({"e50": (50, True), "e100": (100, True),
                                 "asked": (0, True), "off": (10, False)}))
    assert specs["off"].enabled is False
    names = lambda it: [s.name for s in due(specs, it)]
    assert names(100) == ["e50", "e100"]
    assert names(50) == ["e50"]
    assert names(150) == ["e50"]
    assert names(10) == names(30) == names(1) == []
    assert [s.name for s in due(list(specs.values()), 200)] == ["e50", "e100"]
    with pytest.raises(ValueError, match="iteration must be >= 1"):
        due(specs, 0)


def test_select_suite_by_suite_name_evaluator_name_list_and_all():
    data = {"eval": evaluators({"a": (10, True), "b": (20, True), "c": (0, True),
                                "off": (5, False)}),
            "suites": {"fast": ["c", "a"], "single": "b"}}
    names = lambda suite: [s.name for s in select_suite(data, suite)]
    assert names("fast") == ["c", "a"]
    assert names("single") == ["b"]
    assert names("b") == ["b"]
    assert names(["b", "a"]) == ["b", "a"]
    assert names(None) == ["a", "b", "c"]
    # Named explicitly, a disabled evaluator is returned (flagged).
    assert [(s.name, s.enabled) for s in select_suite(data, "off")] == [("off", False)]

    with pytest.raises(ConfigError) as info:
        select_suite(data, "fats")
    assert str(info.value) == ("unknown suite or evaluator 'fats'. Did you mean 'fast'? "
                               "Suites: fast, single; evaluators: a, b, c, off.")
    with pytest.raises(ConfigError, match=re.escape(
            "the selection names unknown evaluator 'd'. Suites: fast, single;")):
        select_suite(data, ["a", "d"])
    with pytest.raises(ConfigError, match="names the suite 'fast' in a list"):
        select_suite(data, ["fast"])


def test_bad_suites_are_errors():
    sections = evaluators({"a": (10, True), "b": (0, True)})
    msg = error(sections, {"s": ["a", "bb"]})
    assert "suite 's' names unknown evaluator 'bb'. Did you mean 'b'?" in msg
    assert "has the name of an eval section" in error(sections, {"a": ["b"]})
    assert "lists an evaluator twice" in error(sections, {"s": ["a", "a"]})
    assert "must be a list of evaluator sections" in error(sections, {"s": {"a": 1}})


def test_default_yaml_loads_with_the_default_env():
    specs = load_suite_file(DEFAULT_YAML, base_env=EnvConfig())
    assert [(s.name, s.type, s.interval) for s in specs] == [
        ("validation", "multi_scenario", 50), ("human_replay", "human_replay", 100),
        ("adaptation", "adaptation", 0), ("planning", "planning", 100)]
    assert all(s.clean and s.deterministic and s.num_scenarios == 64 for s in specs)
    assert [s.name for s in load_suite_file(DEFAULT_YAML, "default")] == [
        "validation", "human_replay", "planning"]
    (adaptation,) = load_suite_file(DEFAULT_YAML, "adaptive")
    assert (adaptation.env.goal_behavior, adaptation.env.num_trials) == ("trial", 3)
    (planning,) = load_suite_file(DEFAULT_YAML, "planning")
    assert planning.env.control_mode == "sdc"
    (behavior,) = load_suite_file(DEFAULT_YAML, "behavior_class")
    assert not behavior.enabled
    assert behavior.params["classes"] == ("lane_change", "hard_stop", "unprotected_turn")
    with pytest.raises(ConfigError, match="template section"):
        load_suite_file(DEFAULT_YAML, "_base")


def test_suite_file_inherits_other_files(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "eval:\n  _base: {template: true, num_scenarios: 8}\n"
        "  val: {type: multi_scenario, inherits: _base, interval: 5}\n")
    (tmp_path / "run.yaml").write_text(
        "inherits: base.yaml\neval:\n  val: {interval: 10}\n"
        "  plan: {type: planning, inherits: val}\nsuites: {all: [val, plan]}\n")
    specs = load_suite_file(tmp_path / "run.yaml", "all")
    assert [(s.name, s.type, s.interval, s.num_scenarios) for s in specs] == [
        ("val", "multi_scenario", 10, 8), ("plan", "planning", 10, 8)]


# ---------------------------------------------------------------- a new evaluator type
@dataclasses.dataclass(frozen=True, kw_only=True)
class FirstStepsConfig(EvaluatorConfig):
    """The new type's own key."""

    first_steps: int = 3

    def __post_init__(self):
        super().__post_init__()
        check_int("first_steps", self.first_steps, 1, 20)


class FirstSteps(Evaluator):
    """Plays the first ``first_steps`` steps of every scenario."""

    type_name = "first_steps"
    Config = FirstStepsConfig

    def num_steps(self, env):
        return self.config.first_steps


@pytest.mark.slow  # CI budget: compiles a whole evaluator for a test-only type
def test_a_new_evaluator_type_is_one_class_and_one_registration():
    from test_eval import build  # tiny env and policy

    section = {"type": "first_steps", "num_scenarios": 3, "batch_size": 2, "seed": 7}
    assert "config key 'type' = 'first_steps' is not allowed" in error({"f": section})
    with registered_evaluator(FirstSteps):
        assert evaluator_types() == (*EVALUATOR_TYPES, "first_steps")
        with pytest.raises(ValueError, match="'first_steps' is already registered"):
            register_evaluator(FirstSteps)
        # The registry validates type names; the type's own key is checked by its config;
        # typos and other types' keys stay unknown.
        assert "Did you mean 'first_steps'?" in error({"f": {**section, "type": "first_step"}})
        assert "config key 'first_steps' = 0 is out of range" in error(
            {"f": {**section, "first_steps": 0}})
        assert ("unknown key 'first_step' for evaluator type 'first_steps'. "
                "Did you mean 'first_steps'?") in error({"f": {**section, "first_step": 2}})
        assert "unknown key 'num_trials'" in error({"f": {**section, "num_trials": 3}})
        env_config, procedural, policy, params = build()
        specs = specs_of({"_short": {"template": True, "first_steps": 2},
                          "f": {**section, "inherits": "_short"}},
                         base_env=env_config, base_procedural=procedural)
        spec = specs["f"]
        assert isinstance(spec.config, FirstStepsConfig) and spec.config.first_steps == 2
        assert spec.params == {"first_steps": 2} and spec.resolved["first_steps"] == 2
        (ev,) = make_evaluators([spec])
        assert isinstance(ev, FirstSteps)
        result = ev.run(policy, params)
        assert result.status == "ok", result.error
        assert result.type == "first_steps" and result.config == spec.resolved
        assert [e["scenario_id"] for e in result.episodes] == [0, 1, 2]
        assert all(e["end_step"] <= 2 for e in result.episodes)
    assert "first_steps" not in evaluator_types()
    with pytest.raises(ConfigError, match="unknown type 'first_steps'"):
        make_evaluators([spec])
    with pytest.raises(ValueError, match="not registered"):
        unregister_evaluator("first_steps")


def test_registration_refuses_bad_classes():
    class NoConfig(Evaluator):
        type_name = "no_config"
        Config = dict

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class TypedConfig(EvaluatorConfig):
        type: str = "x"

    class Structural(Evaluator):
        type_name = "structural"
        Config = TypedConfig

    class Unnamed(Evaluator):
        pass

    with pytest.raises(TypeError, match="EvaluatorConfig subclass"):
        register_evaluator(NoConfig)
    with pytest.raises(TypeError, match="reserves"):
        register_evaluator(Structural)
    with pytest.raises(ValueError, match="no type_name"):
        register_evaluator(Unnamed)
    assert evaluator_types() == EVALUATOR_TYPES


def test_configs_are_typed_and_the_adaptation_env_is_resolved_by_its_hook():
    spec = specs_of({"a": {"type": "adaptation", "env.goal_behavior": "trial",
                           "confidence": 0.9}})["a"]
    assert isinstance(spec.config, AdaptationConfig)
    assert (spec.config.num_trials, spec.config.confidence) == (3, 0.9)
    assert spec.env is spec.config.env and spec.env.num_trials == 3
    # Without the loader, the config is an ordinary strict config.
    with pytest.raises(ConfigError, match="unknown config key 'classes'"):
        AdaptationConfig.from_dict({"classes": ["x"]})


def test_command_line_set_writes_one_key_of_one_section():
    from jaxdrive.eval.cli import apply_section_overrides

    data = {"eval": {"realism": {"type": "realism", "num_rollouts": 8},
                     "other": {"type": "multi_scenario"}}}
    out = apply_section_overrides(data, ["realism.num_rollouts=32",
                                         "realism.env.scenario.max_agents=128",
                                         "realism.scenarios=[/data/a, /data/b]"])
    # The dotted rest of the key stays one key, as a file writes it; values are YAML.
    assert out["eval"]["realism"] == {"type": "realism", "num_rollouts": 32,
                                      "env.scenario.max_agents": 128,
                                      "scenarios": ["/data/a", "/data/b"]}
    assert out["eval"]["other"] == {"type": "multi_scenario"}
    assert data["eval"]["realism"]["num_rollouts"] == 8  # the input is left as it was
    specs = load_suite_specs(out)
    assert specs["realism"].config.num_rollouts == 32
    assert specs["realism"].env.scenario.max_agents == 128
    with pytest.raises(ConfigError, match="no section 'realsim'.*other, realism"):
        apply_section_overrides(data, ["realsim.num_rollouts=2"])
    with pytest.raises(ConfigError, match="SECTION.KEY=VALUE"):
        apply_section_overrides(data, ["num_rollouts=2"])
    with pytest.raises(ConfigError, match="not valid YAML"):
        apply_section_overrides(data, ["realism.num_rollouts={a: 1"])


def test_raw_parameters_without_an_env_warn_that_the_default_env_is_used():
    """``jaxdrive.eval.run`` with raw parameters: the policy reads any token counts, so an
    env other than the training one would not fail, it would score the policy on other
    observations; without ``env_config=`` the default env is used and a warning names the
    fix. With ``env_config=`` (or a run directory / LoadedPolicy) nothing is said."""
    import warnings

    from jaxdrive.eval.api import _policy_and_configs

    policy = object()
    with pytest.warns(UserWarning, match="without env_config= .* default env"):
        _, _, env, *_ = _policy_and_configs({"w": 1}, policy, None, None)
    assert env == EnvConfig()
    mine = EnvConfig.from_dict({"observation": {"num_partners": 7}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, params, env, *_ = _policy_and_configs({"w": 1}, policy, mine, None)
    assert env is mine and params == {"w": 1}
