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
   section and at any depth (``jaxdrive.config.expand_dotted``, as in run config files).
   Two keys of one section that set the same setting (a dotted key and a mapping) are
   an error naming both.
2. ``inherits`` (a section name or a list) resolves recursively: parents merge in order,
   then the section itself, nested mappings merging key by key
   (``jaxdrive.config.Sections``, the machinery of file ``inherits:``). ``template:
   true`` marks a section that is only inherited from; it is not inherited.
3. ``type`` picks the evaluator class from the registry
   (``jaxdrive.eval.evaluators.EVALUATORS``); the section may hold the keys of that
   class's ``Config`` (``EvaluatorConfig`` and the type's own) and no others.
4. The ``clean`` macro (default true) puts ``CLEAN_SETTINGS`` under the resolved values:
   a setting the section or a parent states explicitly wins and is recorded as
   overridden. Partners named explicitly (``co_players``) keep the co-players: then
   ``env.co_player_fraction`` is left to the section or the base env (recorded as
   overridden). It runs once, after inheritance, so a child's ``clean: false`` also
   drops the settings of a clean template.
5. The type's ``Config`` checks the keys and fills the defaults; ``env`` overrides
   (after the type's ``resolve_env`` hook) and ``procedural`` overrides merge onto the
   base configs given to the loader and are validated by building ``EnvConfig`` and
   ``ProceduralConfig``; the result is ``EvaluatorSpec.config``.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    Sections,
    check_bool,
    check_choice,
    expand_dotted,
    load_yaml,
    merge,
    resolve_config_path,
    suggest,
)
from jaxdrive.env import EnvConfig

# The registry, with the built-in types registered.
from jaxdrive.eval.evaluators import EVALUATOR_TYPES, EVALUATORS, STRUCTURAL_KEYS
from jaxdrive.eval.spec import (
    MODES,
    EvaluatorConfig,
    EvaluatorSpec,
    RenderSpec,
    check_partners,
)
from jaxdrive.files import UnsafeNameError, safe_name
from jaxdrive.scenarios.procedural import ProceduralConfig

__all__ = ["CLEAN_SETTINGS", "EVALUATOR_TYPES", "MODES", "EvaluatorConfig", "EvaluatorSpec",
           "RenderSpec", "due", "evaluator_types", "load_suite_file", "load_suite_specs",
           "select_suite"]

# Training-only randomisation that evaluation turns off unless a section says otherwise.
CLEAN_SETTINGS = {"deterministic": True, "env.co_player_fraction": 0.0}

# Keys holding nested configs, built onto the loader's bases.
_NESTED = ("env", "procedural", "render")


def evaluator_types() -> tuple[str, ...]:
    """The registered evaluator types, in registration order (``EVALUATOR_TYPES`` are
    the built-in ones)."""
    return tuple(EVALUATORS)


def _allowed_keys(config_classes: Iterable[type[EvaluatorConfig]]) -> list[str]:
    fields = {f.name for c in config_classes for f in dataclasses.fields(c)}
    return sorted(fields | set(STRUCTURAL_KEYS))


def _has_path(data: Mapping[str, Any], dotted: str) -> bool:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


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


def _build_spec(name: str, sections: Sections, base_env: EnvConfig,
                base_procedural: ProceduralConfig) -> EvaluatorSpec:
    values = sections.resolve(name)
    type_ = values.get("type")
    if type_ is None:
        raise ConfigError(f"eval section '{name}' has no 'type'; set type: one of "
                          f"{', '.join(evaluator_types())} (or template: true if it is only "
                          "inherited from).")
    check_choice("type", type_, evaluator_types())
    cls = EVALUATORS[type_]
    allowed = _allowed_keys([cls.Config])
    for key in values:
        if key not in allowed:
            origin = sections.origin(name, key)
            set_in = f" (set in section '{origin}')" if origin not in (None, name) else ""
            raise ConfigError(f"unknown key '{key}'{set_in} for evaluator type '{type_}'."
                              f"{suggest(key, allowed)} Allowed keys: {', '.join(allowed)}.")
    values = {k: ({} if k in _NESTED and v is None else v) for k, v in values.items()}

    clean = values.get("clean", True)
    check_bool("clean", clean)
    applied, overridden = [], []
    if clean:
        partners = bool(values.get("co_players"))
        for dotted, value in CLEAN_SETTINGS.items():
            if _has_path(values, dotted) or (partners and dotted == "env.co_player_fraction"):
                overridden.append(dotted)
            else:
                applied.append(dotted)
                values = merge(expand_dotted({dotted: value}, "CLEAN_SETTINGS"), values)

    for f in dataclasses.fields(cls.Config):
        if (f.name not in values and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise ConfigError(f"evaluator type '{type_}' needs the key '{f.name}'.")
    own = {k: v for k, v in values.items() if k not in ("type", *_NESTED)}
    # The section's own keys are checked before the type's env hook reads them.
    checked = cls.Config.from_dict(own)
    env_overrides = cls.resolve_env(values.get("env", {}), checked)
    config = cls.Config.from_dict({
        **own,
        "env": _build_config(EnvConfig, base_env, env_overrides, "env"),
        "procedural": _build_config(ProceduralConfig, base_procedural,
                                    values.get("procedural", {}), "procedural"),
        "render": _build_config(RenderSpec, RenderSpec(), values.get("render", {}), "render"),
    })
    check_partners(config)
    return EvaluatorSpec(name=name, type=type_, config=config, clean_applied=tuple(applied),
                         clean_overridden=tuple(overridden))


def _load(data: Mapping[str, Any], base_env: EnvConfig | None,
          base_procedural: ProceduralConfig | None):
    if not isinstance(data, Mapping):
        raise ConfigError(f"an eval config must be a mapping, got {type(data).__name__}.")
    base_env = EnvConfig() if base_env is None else base_env
    base_procedural = ProceduralConfig() if base_procedural is None else base_procedural
    raw = data.get("eval")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("config key 'eval' must be a mapping of evaluator sections, "
                          f"got {type(raw).__name__}.")
    for name in raw:
        # Section names become directory names (videos, results); keep them one name.
        if isinstance(name, str) and name:
            try:
                safe_name(name, "eval section")
            except UnsafeNameError as e:
                raise ConfigError(f"{e}.") from None
    sections = Sections(raw, "eval section")
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


def _check_template(name: str, sections: Sections) -> None:
    # Values of a template may only make sense in its children; its keys must exist.
    values = sections.resolve(name)
    type_ = values.get("type")
    if type_ is not None:
        check_choice("type", type_, evaluator_types())
    allowed = _allowed_keys(c.Config for c in EVALUATORS.values())
    for key in values:
        if key not in allowed:
            raise ConfigError(f"unknown key '{key}' in template.{suggest(key, allowed)} "
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
    raise ConfigError(f"{where} names unknown evaluator '{name}'.{suggest(name, list(specs))} "
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
                          f"{suggest(suite, [*suites, *specs])} " + _listing(specs, suites))
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
