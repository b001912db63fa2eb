"""Evaluation suites from config: named evaluator sections resolved into ``EvaluatorSpec``.

A config (a run config or a standalone eval file) holds an ``eval:`` mapping of named
sections and optionally ``suites:`` (suite name -> list of section names)::

    eval:
      _base: {template: true, num_scenarios: 64}
      validation: {type: multi_scenario, inherits: _base, interval: 50,
                   env.collision_behavior: remove}
    suites:
      default: [validation]

Resolution of one section, in this order:

1. Dotted keys (``env.collision_behavior: remove``) expand to nested mappings, per
   section and at any depth. When a dotted key and a mapping set the same leaf, the
   more specific key wins; between equally specific keys, the later one.
2. ``inherits`` (a section name or a list) resolves recursively: parents merge in order,
   then the section itself, nested mappings merging key by key (``config.merge``).
   ``template: true`` marks a section that is only inherited from; it is not inherited.
3. The ``clean`` macro (default true) puts ``CLEAN_SETTINGS`` under the resolved values:
   a setting the section or a parent states explicitly wins and is recorded as
   overridden. It runs once, after inheritance, so a child's ``clean: false`` also
   drops the settings of a clean template.
4. Defaults fill the remaining keys; ``env`` and ``procedural`` overrides merge onto the
   base configs given to the loader and are validated by building ``EnvConfig`` and
   ``ProceduralConfig``; the type's own keys are validated into ``params``.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    _suggest,
    check_choice,
    check_int,
    check_range,
    load_yaml,
    merge,
    resolve_config_path,
)
from jaxdrive.env import EnvConfig
from jaxdrive.render.raster import VIEWS
from jaxdrive.scenarios.procedural import ProceduralConfig

MODES = ("inline", "subprocess")

# Training-only randomisation that evaluation turns off unless a section says otherwise.
CLEAN_SETTINGS = {"deterministic": True, "env.co_player_fraction": 0.0}

_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class RenderSpec(ConfigBase):
    """Videos an evaluator records besides its metrics.

    Attributes:
      enabled: record videos at all.
      views: ``scene`` and/or ``ego`` (one video per scenario per view).
      num_scenarios: scenarios recorded (at most the evaluator's ``num_scenarios``).
      steps: frames per video; 0 = one whole episode.
      width, height: pixels (even: the H.264 encoder needs it).
    """

    enabled: bool = False
    views: tuple[str, ...] = ("scene",)
    num_scenarios: int = 2
    steps: int = 0
    width: int = 256
    height: int = 256

    def __post_init__(self):
        _bool("enabled", self.enabled)
        if (not isinstance(self.views, tuple) or not self.views
                or len(set(self.views)) != len(self.views)):
            raise ConfigError(f"config key 'views' = {self.views!r} must list distinct "
                              f"views out of {list(VIEWS)}.")
        for view in self.views:
            check_choice("views", view, VIEWS)
        check_int("num_scenarios", self.num_scenarios, 1)
        check_int("steps", self.steps, 0)
        for name in ("width", "height"):
            check_int(name, getattr(self, name), 2, 8192)
            if getattr(self, name) % 2:
                raise ConfigError(f"config key '{name}' = {getattr(self, name)} must be even "
                                  "(H.264 video needs even frame sizes).")


class Params(Mapping):
    """Read-only, hashable mapping of an evaluator type's own keys (defaults filled)."""

    __slots__ = ("_data",)

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()):
        object.__setattr__(self, "_data", dict(items))

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __setattr__(self, name, value):
        raise AttributeError("Params is read-only.")

    def __reduce__(self):
        return (Params, (self._data,))

    def __repr__(self) -> str:
        return f"Params({self._data!r})"


@dataclasses.dataclass(frozen=True)
class EvaluatorSpec:
    """One resolved evaluator section.

    Attributes:
      name: the section name.
      type: one of ``EVALUATOR_TYPES``.
      enabled: false keeps the evaluator out of ``due`` and of the default selection.
      interval: run every this many training iterations; 0 = only when asked.
      mode: ``inline`` (in the training process) or ``subprocess``.
      clean: whether the clean macro was on.
      deterministic: act with the policy's mode instead of sampling.
      seed: seed of the evaluation's scenes and actions.
      num_scenarios: scenarios evaluated; batch_size: envs run in parallel.
      num_steps: steps per scenario; 0 = one whole episode.
      env, procedural: the resolved configs the evaluator runs with.
      scenarios: scene files / shard directories (``$VAR`` and ``~`` expanded), or None
        for procedural scenes.
      render: videos to record.
      params: the type's own keys, defaults filled.
      clean_applied, clean_overridden: dotted keys of ``CLEAN_SETTINGS`` the macro set,
        and those an explicit value won over.
      resolved: plain dict of every key above but ``name`` (full ``env``/``procedural``),
        for results files; not part of equality or the hash.
    """

    name: str
    type: str
    enabled: bool
    interval: int
    mode: str
    clean: bool
    deterministic: bool
    seed: int
    num_scenarios: int
    batch_size: int
    num_steps: int
    env: EnvConfig
    procedural: ProceduralConfig
    scenarios: tuple[str, ...] | None
    render: RenderSpec
    params: Params
    clean_applied: tuple[str, ...]
    clean_overridden: tuple[str, ...]
    resolved: dict[str, Any] = dataclasses.field(compare=False, repr=False)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config key '{name}' must be true or false, got {value!r}.")
    return value


def _int(lo: int | None = None) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        check_int(name, value, lo)
        return value
    return check


def _optional_int(lo: int) -> Callable[[str, Any], int | None]:
    def check(name: str, value: Any) -> int | None:
        if value is not None:
            check_int(name, value, lo)
        return value
    return check


def _float(lo: float, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False) -> Callable[[str, Any], float]:
    def check(name: str, value: Any) -> float:
        check_range(name, value, lo, hi, lo_open=lo_open)
        if hi_open and value >= hi:
            raise ConfigError(f"config key '{name}' = {value!r} is out of range; allowed "
                              f"{'(' if lo_open else '['}{lo}, {hi}).")
        return float(value)
    return check


def _names(name: str, value: Any) -> tuple[str, ...]:
    if (not isinstance(value, list | tuple) or not value
            or not all(isinstance(v, str) and v for v in value)):
        raise ConfigError(f"config key '{name}' must be a non-empty list of names, "
                          f"got {value!r}.")
    return tuple(value)


def _mode(name: str, value: Any) -> str:
    check_choice(name, value, MODES)
    return value


def _scenarios(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) and p for p in value):
        raise ConfigError(f"config key '{name}' must be null (procedural scenes) or a list "
                          f"of scene files / shard directories, got {value!r}.")
    paths = []
    for path in value:
        # A literal '$USER' in a path fails far from the config; expand it or say so here.
        expanded = os.path.expandvars(os.path.expanduser(path))
        unset = re.search(r"\$\{?(\w+)", expanded)
        if unset:
            raise ConfigError(f"config key '{name}': path {path!r} uses the environment "
                              f"variable '{unset[1]}', which is not set.")
        paths.append(expanded)
    return tuple(paths)


# Keys every type accepts: default and checker (env, procedural, render are built apart).
_COMMON = {
    "enabled": (True, _bool),
    "interval": (0, _int(0)),
    "clean": (True, _bool),
    "deterministic": (False, _bool),
    "seed": (0, _int(0)),
    "num_scenarios": (64, _int(1)),
    "batch_size": (64, _int(1)),
    "num_steps": (0, _int(0)),
    "mode": ("inline", _mode),
    "scenarios": (None, _scenarios),
}
_STRUCTURAL = ("type", "inherits", "template", "env", "procedural", "render")

_TYPE_PARAMS: dict[str, dict[str, tuple[Any, Callable[[str, Any], Any]]]] = {
    "multi_scenario": {},
    "human_replay": {},
    "behavior_class": {
        "classes": (_REQUIRED, _names),
        "scenarios_per_class": (16, _int(1)),
    },
    "adaptation": {
        "num_trials": (3, _int(2)),
        "trial_timeout": (None, _optional_int(1)),
        "confidence": (0.95, _float(0.0, 1.0, lo_open=True, hi_open=True)),
    },
    "planning": {
        "ttc_horizon": (1.0, _float(0.0, lo_open=True)),
        "comfort_max_accel": (4.0, _float(0.0, lo_open=True)),
        "comfort_max_jerk": (4.0, _float(0.0, lo_open=True)),
        "progress_min_ratio": (0.2, _float(0.0, 1.0)),
    },
}
EVALUATOR_TYPES = tuple(_TYPE_PARAMS)


def _allowed_keys(type_: str | None) -> list[str]:
    params = (_TYPE_PARAMS[type_] if type_ is not None
              else {k: v for p in _TYPE_PARAMS.values() for k, v in p.items()})
    return sorted({*_COMMON, *_STRUCTURAL, *params})


def _expand_dotted(body: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` at every depth; more specific keys win."""
    for key in body:
        if not isinstance(key, str) or not all(key.split(".")):
            raise ConfigError(f"{where}: key {key!r} must be a name or a dotted path "
                              "like env.collision_behavior.")
    out: dict[str, Any] = {}
    # Stable sort: fewer dots first, so a deeper key lands last and wins; ties keep order.
    for key in sorted(body, key=lambda k: k.count(".")):
        value = body[key]
        if isinstance(value, Mapping):
            value = _expand_dotted(value, where)
        *heads, leaf = key.split(".")
        nested = {leaf: value}
        for head in reversed(heads):
            nested = {head: nested}
        out = merge(out, nested)
    return out


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    return _expand_dotted({dotted: value}, "CLEAN_SETTINGS")


def _has_path(data: Mapping[str, Any], dotted: str) -> bool:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _parents(name: str, body: Mapping[str, Any]) -> list[str]:
    parents = body.get("inherits") or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(f"eval section '{name}': 'inherits' must be a section name or a "
                          f"list of section names, got {parents!r}.")
    return parents


class _Sections:
    """The raw sections of an ``eval:`` mapping and their inheritance resolution."""

    def __init__(self, raw: Any):
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError("config key 'eval' must be a mapping of evaluator sections, "
                              f"got {type(raw).__name__}.")
        self.own: dict[str, dict[str, Any]] = {}
        for name, body in raw.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"eval section names must be non-empty strings, got {name!r}.")
            if body is None:
                body = {}
            if not isinstance(body, Mapping):
                raise ConfigError(f"eval section '{name}' must be a mapping of settings, "
                                  f"got {type(body).__name__}.")
            self.own[name] = _expand_dotted(body, f"eval section '{name}'")
        self.templates = []
        for name, body in self.own.items():
            template = body.get("template", False)
            if not isinstance(template, bool):
                raise ConfigError(f"eval section '{name}': 'template' must be true or false, "
                                  f"got {template!r}.")
            if template:
                self.templates.append(name)
        self._cache: dict[str, dict[str, Any]] = {}

    def resolve(self, name: str, chain: tuple[str, ...] = ()) -> dict[str, Any]:
        """The section merged over its parents (without ``inherits``/``template``)."""
        if name in chain:
            raise ConfigError("eval sections inherit in a cycle: "
                              + " -> ".join(chain + (name,)) + ".")
        if name in self._cache:
            return self._cache[name]
        body = self.own[name]
        resolved: dict[str, Any] = {}
        for parent in _parents(name, body):
            if parent not in self.own:
                raise ConfigError(
                    f"eval section '{name}' inherits unknown section '{parent}'."
                    f"{_suggest(parent, list(self.own))} "
                    f"Available sections: {', '.join(self.own)}.")
            resolved = merge(resolved, self.resolve(parent, chain + (name,)))
        own = {k: v for k, v in body.items() if k not in ("inherits", "template")}
        self._cache[name] = merge(resolved, own)
        return self._cache[name]

    def origin(self, name: str, key: str) -> str | None:
        """The section (``name`` or an ancestor) whose ``key`` the resolved ``name`` holds."""
        if key in self.own[name]:
            return name
        for parent in reversed(_parents(name, self.own[name])):
            found = self.origin(parent, key)
            if found is not None:
                return found
        return None


def _qualify(message: str) -> str:
    # from_dict reports "'env': config key 'x' ..."; name the full path 'env.x' instead.
    return re.sub(r"^'([\w.]+)': config key '", r"config key '\1.", message)


def _build_config(cls, base: ConfigBase, overrides: Any, key: str):
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"config key '{key}' must be a mapping of {cls.__name__} "
                          f"overrides, got {overrides!r}.")
    try:
        return cls.from_dict(merge(base.to_dict(), overrides), path=key)
    except ConfigError as e:
        raise ConfigError(_qualify(str(e))) from None


def _build_spec(name: str, sections: _Sections, base_env: EnvConfig,
                base_procedural: ProceduralConfig) -> EvaluatorSpec:
    values = sections.resolve(name)
    type_ = values.get("type")
    if type_ is None:
        raise ConfigError(f"eval section '{name}' has no 'type'; set type: one of "
                          f"{', '.join(EVALUATOR_TYPES)} (or template: true if it is only "
                          "inherited from).")
    check_choice("type", type_, EVALUATOR_TYPES)
    allowed = _allowed_keys(type_)
    for key in values:
        if key not in allowed:
            origin = sections.origin(name, key)
            set_in = f" (set in section '{origin}')" if origin not in (None, name) else ""
            raise ConfigError(f"unknown key '{key}'{set_in} for evaluator type '{type_}'."
                              f"{_suggest(key, allowed)} Allowed keys: {', '.join(allowed)}.")
    values = {k: ({} if k in ("env", "procedural", "render") and v is None else v)
              for k, v in values.items()}

    clean = _bool("clean", values.get("clean", True))
    applied, overridden = [], []
    if clean:
        for dotted, value in CLEAN_SETTINGS.items():
            if _has_path(values, dotted):
                overridden.append(dotted)
            else:
                applied.append(dotted)
                values = merge(_nest(dotted, value), values)

    common = {key: check(key, values.get(key, default))
              for key, (default, check) in _COMMON.items()}
    params = {}
    for key, (default, check) in _TYPE_PARAMS[type_].items():
        if key not in values and default is _REQUIRED:
            raise ConfigError(f"evaluator type '{type_}' needs the key '{key}'.")
        params[key] = check(key, values.get(key, default))

    env_overrides = values.get("env", {})
    if type_ == "adaptation":
        env_overrides = _adaptation_env(env_overrides, params)
    env = _build_config(EnvConfig, base_env, env_overrides, "env")
    if type_ == "adaptation":
        params["trial_timeout"] = env.trial_timeout
    procedural = _build_config(ProceduralConfig, base_procedural,
                               values.get("procedural", {}), "procedural")
    render = _build_config(RenderSpec, RenderSpec(), values.get("render", {}), "render")
    if render.num_scenarios > common["num_scenarios"]:
        render = render.replace(num_scenarios=common["num_scenarios"])

    resolved = {"type": type_, **common, "env": env.to_dict(),
                "procedural": procedural.to_dict(), "render": render.to_dict(), **params}
    resolved = copy.deepcopy({k: list(v) if isinstance(v, tuple) else v
                              for k, v in resolved.items()})
    return EvaluatorSpec(
        name=name, type=type_, env=env, procedural=procedural, render=render,
        params=Params(params), clean_applied=tuple(applied),
        clean_overridden=tuple(overridden), resolved=resolved, **common)


def _adaptation_env(overrides: Any, params: Mapping[str, Any]) -> Any:
    """Write ``num_trials``/``trial_timeout`` into the env, so ``spec.env`` is what runs."""
    if not isinstance(overrides, Mapping):
        return overrides
    # trial_timeout: null keeps the env's own (a run's), where None = the episode length.
    wanted = {"num_trials": params["num_trials"]}
    if params["trial_timeout"] is not None:
        wanted["trial_timeout"] = params["trial_timeout"]
    for key, value in wanted.items():
        if key in overrides and overrides[key] != value:
            raise ConfigError(f"config key 'env.{key}' = {overrides[key]!r} contradicts "
                              f"'{key}' = {value!r}; an adaptation evaluator sets "
                              f"env.{key} from '{key}', so set only that.")
    return merge(overrides, wanted)


def _load(data: Mapping[str, Any], base_env: EnvConfig | None,
          base_procedural: ProceduralConfig | None):
    if not isinstance(data, Mapping):
        raise ConfigError(f"an eval config must be a mapping, got {type(data).__name__}.")
    base_env = EnvConfig() if base_env is None else base_env
    base_procedural = ProceduralConfig() if base_procedural is None else base_procedural
    sections = _Sections(data.get("eval"))
    specs: dict[str, EvaluatorSpec] = {}
    for name in sections.own:
        try:
            if name in sections.templates:
                _check_template(name, sections)
            else:
                specs[name] = _build_spec(name, sections, base_env, base_procedural)
        except ConfigError as e:
            if str(e).startswith("eval section"):
                raise
            raise ConfigError(f"eval section '{name}': {e}") from None
    suites = _suites(data.get("suites"), specs, sections.templates)
    return specs, sections.templates, suites


def _check_template(name: str, sections: _Sections) -> None:
    # Values of a template may only make sense in its children; its keys must exist.
    values = sections.resolve(name)
    type_ = values.get("type")
    if type_ is not None:
        check_choice("type", type_, EVALUATOR_TYPES)
    allowed = _allowed_keys(None)
    for key in values:
        if key not in allowed:
            raise ConfigError(f"unknown key '{key}' in template.{_suggest(key, allowed)} "
                              f"Allowed keys: {', '.join(allowed)}.")


def _suites(raw: Any, specs: Mapping[str, EvaluatorSpec],
            templates: Sequence[str]) -> dict[str, tuple[str, ...]]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("config key 'suites' must map suite names to lists of evaluator "
                          f"sections, got {type(raw).__name__}.")
    suites = {}
    for suite, members in raw.items():
        if suite in specs or suite in templates:
            raise ConfigError(f"suite '{suite}' has the name of an eval section; rename one "
                              "so that a name selects one thing.")
        if isinstance(members, str):
            members = [members]
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"suite '{suite}' must be a list of evaluator sections, "
                              f"got {members!r}.")
        for member in members:
            _check_evaluator(member, specs, templates, f"suite '{suite}'", tuple(raw))
        if len(set(members)) != len(members):
            raise ConfigError(f"suite '{suite}' lists an evaluator twice: {members}.")
        suites[suite] = tuple(members)
    return suites


def _listing(specs: Mapping[str, EvaluatorSpec], suites: Sequence[str]) -> str:
    return (f"Suites: {', '.join(suites) or 'none'}; "
            f"evaluators: {', '.join(specs) or 'none'}.")


def _check_evaluator(name: str, specs: Mapping[str, EvaluatorSpec],
                     templates: Sequence[str], where: str, suites: Sequence[str] = ()):
    if name in specs:
        return
    if name in templates:
        raise ConfigError(f"{where} names '{name}', a template section: templates are only "
                          "inherited from, never run.")
    if name in suites:
        raise ConfigError(f"{where} names the suite '{name}' in a list, which holds "
                          "evaluator sections only; select the suite by its name alone.")
    raise ConfigError(f"{where} names unknown evaluator '{name}'.{_suggest(name, list(specs))} "
                      + _listing(specs, suites))


def load_suite_specs(data: Mapping[str, Any], base_env: EnvConfig | None = None,
                     base_procedural: ProceduralConfig | None = None
                     ) -> dict[str, EvaluatorSpec]:
    """Every evaluator section of ``data['eval']`` resolved, templates left out.

    Args:
      data: a config mapping holding ``eval:`` and optionally ``suites:`` (other keys,
        such as a run config's ``env:``, are ignored).
      base_env: the env evaluators override (a run's env); default ``EnvConfig()``.
      base_procedural: likewise for procedural scenes; default ``ProceduralConfig()``.

    Returns:
      ``{section name: EvaluatorSpec}`` in file order, disabled evaluators included.

    Raises:
      ConfigError: naming the section and the key for any invalid section or suite.
    """
    return _load(data, base_env, base_procedural)[0]


def select_suite(data: Mapping[str, Any], suite: str | Sequence[str] | None,
                 base_env: EnvConfig | None = None,
                 base_procedural: ProceduralConfig | None = None) -> list[EvaluatorSpec]:
    """The evaluators a suite selection names.

    Args:
      data, base_env, base_procedural: as for ``load_suite_specs``.
      suite: a name in ``suites:``, the name of one evaluator section, a list of
        evaluator section names, or None for every enabled evaluator.

    Returns:
      Specs in the suite's (or list's) order, else in file order. Evaluators named
      explicitly are returned even when disabled (``spec.enabled`` says so).
    """
    specs, templates, suites = _load(data, base_env, base_procedural)
    if suite is None:
        return [spec for spec in specs.values() if spec.enabled]
    if isinstance(suite, str):
        if suite in suites:
            return [specs[name] for name in suites[suite]]
        if suite in specs:
            return [specs[suite]]
        if suite in templates:
            _check_evaluator(suite, specs, templates, "the selection")
        raise ConfigError(f"unknown suite or evaluator '{suite}'."
                          f"{_suggest(suite, [*suites, *specs])} " + _listing(specs, suites))
    if not isinstance(suite, list | tuple) or not all(isinstance(n, str) for n in suite):
        raise ConfigError(f"a suite selection must be a name or a list of evaluator names, "
                          f"got {suite!r}.")
    for name in suite:
        _check_evaluator(name, specs, templates, "the selection", tuple(suites))
    return [specs[name] for name in suite]


def load_suite_file(path: str | os.PathLike, suite: str | Sequence[str] | None = None,
                    base_env: EnvConfig | None = None,
                    base_procedural: ProceduralConfig | None = None
                    ) -> list[EvaluatorSpec]:
    """``select_suite`` on a YAML file read with ``load_yaml`` (file ``inherits:`` works);
    ``path`` may be a preset name (``eval/default``, ``jaxdrive.config.resolve_config_path``).

    The file's own ``env:``/``procedural:`` sections, if any, are not used as the bases:
    pass ``base_env``/``base_procedural`` explicitly.
    """
    return select_suite(load_yaml(resolve_config_path(path)), suite, base_env,
                        base_procedural)


def due(specs: Iterable[EvaluatorSpec] | Mapping[str, EvaluatorSpec],
        iteration: int) -> list[EvaluatorSpec]:
    """The enabled specs whose ``interval`` (> 0) divides ``iteration`` (>= 1), in order."""
    iteration = operator.index(iteration)
    if iteration < 1:
        raise ValueError(f"iteration must be >= 1, got {iteration}.")
    if isinstance(specs, Mapping):
        specs = specs.values()
    return [s for s in specs if s.enabled and s.interval > 0 and iteration % s.interval == 0]
