"""Configuration plumbing: frozen dataclasses built from dicts with strict validation.

Every concern defines its own frozen dataclass next to its code (``ProceduralConfig``
in ``scenarios/procedural.py``, ``DynamicsConfig`` in ``sim/dynamics.py``, ...) and
inherits ``ConfigBase``. ``from_dict`` builds nested configs, rejects unknown keys by
name with the allowed ones listed, converts lists to tuples (so configs stay hashable
and usable as static jit arguments) and runs each class's ``__post_init__`` checks.

Config files may ``inherits:`` other files and spell nested keys as dotted paths
(``env.collision_behavior: remove``); ``Sections`` gives named sections in one file (the
``eval:`` sections of ``jaxdrive.eval.suite``) the same ``inherits``, plus templates.
``inherit`` and ``expand_dotted`` are the machinery both use.

The YAML presets (the repository's ``configs/``) ship inside the package as package data
``jaxdrive.presets``; ``resolve_config_path`` turns a ``--config`` argument (a file, or a
preset name such as ``quickstart`` or ``eval/default``) into a file, ``list_presets``
names them.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import pathlib
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the key and the fix."""


def suggest(name: str, allowed: Sequence[str]) -> str:
    """`` Did you mean 'X'?`` for the closest of ``allowed`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(allowed), n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def _to_hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_to_hashable(v) for v in value)
    return value


@dataclasses.dataclass(frozen=True)
class ConfigBase:
    """Base of every config dataclass: strict ``from_dict``, ``to_dict``, ``replace``."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = ""):
        """Build the config from a (nested) mapping; unknown keys are errors."""
        data = dict(data or {})
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            where = f" in '{path}'" if path else ""
            key = unknown[0]
            raise ConfigError(
                f"unknown config key '{path + '.' if path else ''}{key}'{where}."
                f"{suggest(key, fields)} Allowed keys: {', '.join(sorted(fields))}."
            )
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in data.items():
            sub = hints.get(name)
            sub_path = f"{path}.{name}" if path else name
            if isinstance(sub, type) and issubclass(sub, ConfigBase):
                if isinstance(value, sub):
                    kwargs[name] = value
                elif isinstance(value, Mapping):
                    kwargs[name] = sub.from_dict(value, sub_path)
                else:
                    raise ConfigError(
                        f"config key '{sub_path}' must be a mapping of {sub.__name__} "
                        f"fields, got {type(value).__name__}."
                    )
            else:
                kwargs[name] = _to_hashable(value)
        try:
            return cls(**kwargs)
        except ConfigError as e:
            if path and not str(e).startswith(f"'{path}"):
                raise ConfigError(f"'{path}': {e}") from None
            raise

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of the fields (sub-configs as dicts, tuples as lists), as
        ``from_dict`` reads it back."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, ConfigBase):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def replace(self, **changes):
        """A copy with ``changes`` applied (``dataclasses.replace``: the checks run again)."""
        return dataclasses.replace(self, **changes)


def check_range(
    name: str, value: float, lo: float | None = None, hi: float | None = None,
    *, lo_open: bool = False, hi_open: bool = False,
) -> None:
    """Raise ``ConfigError`` unless ``lo <= value <= hi`` (``lo < value`` if ``lo_open``,
    ``value < hi`` if ``hi_open``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config key '{name}' must be a number, got {value!r}.")
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and (value >= hi if hi_open else value > hi)
    if bad_lo or bad_hi:
        lo_s = "-inf" if lo is None else f"{lo}"
        hi_s = "inf" if hi is None else f"{hi}"
        opening = "(" if lo_open else "["
        closing = ")" if hi_open else "]"
        raise ConfigError(f"config key '{name}' = {value!r} is out of range; allowed "
                          f"{opening}{lo_s}, {hi_s}{closing}.")


def check_bool(name: str, value: Any) -> None:
    """Raise ``ConfigError`` unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ConfigError(f"config key '{name}' must be true or false, got {value!r}.")


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    """Raise ``ConfigError`` unless ``value`` is an int in ``[lo, hi]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config key '{name}' must be an integer, got {value!r}.")
    check_range(name, value, lo, hi)


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    """Raise ``ConfigError`` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(
            f"config key '{name}' = {value!r} is not allowed.{suggest(str(value), allowed)} "
            f"Allowed values: {', '.join(map(str, allowed))}."
        )


def check_interval(name: str, value: Any, lo: float | None = None, hi: float | None = None):
    """Raise ``ConfigError`` unless ``value`` is a pair ``(low, high)`` with low <= high."""
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ConfigError(f"config key '{name}' must be a pair [low, high], got {value!r}.")
    check_range(f"{name}[0]", value[0], lo, hi)
    check_range(f"{name}[1]", value[1], lo, hi)
    if value[0] > value[1]:
        raise ConfigError(f"config key '{name}' = {list(value)}: low must not exceed high.")


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["a.b=3", "c=x"]`` into a nested dict; values are parsed as YAML scalars."""
    import yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override '{pair}' must look like key.sub=value.")
        key, raw = pair.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; ``override`` wins."""
    out = dict(base)
    for k, v in override.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def expand_dotted(data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Dotted keys as nested mappings, at every depth: ``{"a.b": 1}`` -> ``{"a": {"b": 1}}``.

    A dotted key and a mapping that set the same leaf: the more specific key wins (a
    deeper key lands last); between equally specific keys, the later one. Keys the
    dotted one does not touch merge (``merge``).

    Args:
      data: a config mapping (a file's, a section's).
      where: how an error names the mapping (``config file 'x.yaml'``).

    Raises:
      ConfigError: a key that is not a string or has an empty part (``env..x``).
    """
    for key in data:
        if not isinstance(key, str) or not all(key.split(".")):
            raise ConfigError(f"{where}: key {key!r} must be a name or a dotted path "
                              "like env.collision_behavior.")
    out: dict[str, Any] = {}
    # Stable sort: fewer dots first, so a deeper key lands last and wins; ties keep order.
    for key in sorted(data, key=lambda k: k.count(".")):
        value = data[key]
        if isinstance(value, Mapping):
            value = expand_dotted(value, where)
        *heads, leaf = key.split(".")
        nested = {leaf: value}
        for head in reversed(heads):
            nested = {head: nested}
        out = merge(out, nested)
    return out


def parent_names(value: Any, where: str, noun: str) -> list[str]:
    """The parents an ``inherits:`` value names (a name or a list of names; None = none).

    Args:
      value: the ``inherits`` value as written.
      where: how an error names its owner (``eval section 'val'``).
      noun: what a parent is (``section name``, ``file name``).
    """
    parents = value or []
    if isinstance(parents, str):
        parents = [parents]
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
        raise ConfigError(f"{where}: 'inherits' must be a {noun} or a list of {noun}s, "
                          f"got {parents!r}.")
    return parents


K = typing.TypeVar("K")


def inherit(name: K, read: Callable[[K, tuple[K, ...]], tuple[Mapping[str, Any], list[K]]],
            what: str, show: Callable[[K], str] = str, chain: tuple[K, ...] = ()
            ) -> dict[str, Any]:
    """``name``'s mapping merged over its parents', recursively (config files, sections).

    Parents merge in order, then ``name``'s own keys; nested mappings merge key by key
    (``merge``), so the child wins at every level.

    Args:
      name: a file path or a section name.
      read: ``read(name, chain) -> (own keys without inherits, parent names)``; it raises
        ``ConfigError`` for a missing or bad ``name`` (``chain[-1]`` inherits it).
      what: the plural noun of a cycle error (``config files``).
      show: how a cycle error writes a name.
      chain: the names inheriting ``name``, outermost first.

    Raises:
      ConfigError: an inheritance cycle, naming the chain (``a -> b -> a``).
    """
    if name in chain:
        names = " -> ".join(show(n) for n in (*chain, name))
        raise ConfigError(f"{what} inherit in a cycle: {names}.")
    own, parents = read(name, chain)
    merged: dict[str, Any] = {}
    for parent in parents:
        merged = merge(merged, inherit(parent, read, what, show, (*chain, name)))
    return merge(merged, own)


def load_yaml(path: str | os.PathLike, dotted: bool = False) -> dict[str, Any]:
    """A YAML config file as a dict, with file inheritance resolved.

    A file may name parents with ``inherits: base.yaml`` (or a list, merged in order);
    paths are relative to the file that names them. Parents are merged first and the
    child wins key by key (nested mappings merge recursively). A missing file, invalid
    YAML, a non-mapping or an inheritance cycle is a ``ConfigError`` naming the files.

    Args:
      path: the file.
      dotted: expand dotted keys (``env.collision_behavior: remove``; ``expand_dotted``)
        in each file before it merges with its parents, so that a child's dotted key wins
        over a parent's mapping. Off for files whose mappings are keyed by names
        (``eval:`` sections expand their own keys).
    """

    def read(file: str, chain: tuple[str, ...]):
        import yaml

        try:
            with open(file) as f:
                data = yaml.safe_load(f) or {}
        except FileNotFoundError:
            by = f" (inherited by '{chain[-1]}')" if chain else ""
            raise ConfigError(f"config file '{file}' not found{by}.") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file '{file}' is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file '{file}' must hold a mapping of sections.")
        parents = parent_names(data.pop("inherits", None), f"config file '{file}'",
                               "file name")
        if dotted:
            data = expand_dotted(data, f"config file '{file}'")
        return data, [os.path.normpath(os.path.join(os.path.dirname(file), p))
                      for p in parents]

    return inherit(os.path.abspath(path), read, "config files", os.path.basename)


class Sections:
    """Named config sections of one mapping that inherit from each other (``eval:``).

    Each section is a mapping of settings whose dotted keys expand (``expand_dotted``).
    ``inherits`` (a section name or a list) merges the named sections under it, in
    order and recursively (``inherit``); ``template: true`` marks a section that is only
    inherited from (the flag itself is not inherited). Cycles, unknown parents and
    malformed sections are ``ConfigError`` s naming the section.

    Args:
      raw: section name -> mapping (None = empty).
      what: how errors name a section (``eval section``).

    Attributes:
      own: each section's own keys (dotted keys expanded), in the given order.
      templates: names of the template sections.
    """

    def __init__(self, raw: Mapping[str, Any], what: str = "section"):
        self.what = what
        self.own: dict[str, dict[str, Any]] = {}
        for name, body in raw.items():
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{what} names must be non-empty strings, got {name!r}.")
            if body is None:
                body = {}
            if not isinstance(body, Mapping):
                raise ConfigError(f"{what} '{name}' must be a mapping of settings, "
                                  f"got {type(body).__name__}.")
            self.own[name] = expand_dotted(body, f"{what} '{name}'")
        self.templates: list[str] = []
        for name, body in self.own.items():
            template = body.get("template", False)
            if not isinstance(template, bool):
                raise ConfigError(f"{what} '{name}': 'template' must be true or false, "
                                  f"got {template!r}.")
            if template:
                self.templates.append(name)
        self._resolved: dict[str, dict[str, Any]] = {}

    def parents(self, name: str) -> list[str]:
        """The sections ``name`` inherits, checked to exist."""
        parents = parent_names(self.own[name].get("inherits"), f"{self.what} '{name}'",
                               "section name")
        for parent in parents:
            if parent not in self.own:
                raise ConfigError(
                    f"{self.what} '{name}' inherits unknown section '{parent}'."
                    f"{suggest(parent, list(self.own))} "
                    f"Available sections: {', '.join(self.own)}.")
        return parents

    def resolve(self, name: str) -> dict[str, Any]:
        """The section merged over its parents (without ``inherits``/``template``)."""
        if name not in self._resolved:
            def read(section: str, chain: tuple[str, ...]):
                own = {k: v for k, v in self.own[section].items()
                       if k not in ("inherits", "template")}
                return own, self.parents(section)

            self._resolved[name] = inherit(name, read, f"{self.what}s")
        return self._resolved[name]

    def origin(self, name: str, key: str) -> str | None:
        """The section (``name`` or an ancestor) whose ``key`` the resolved ``name`` holds."""
        if key in self.own[name]:
            return name
        for parent in reversed(self.parents(name)):
            found = self.origin(parent, key)
            if found is not None:
                return found
        return None


PRESET_SUFFIX = ".yaml"


def presets_dir() -> pathlib.Path | None:
    """The directory of the presets, or None when there is none.

    An installed wheel holds them as package data ``jaxdrive.presets`` (``jaxdrive/presets/``,
    mapped from the repository's ``configs/`` in ``pyproject.toml``): that copy wins. An
    editable install or a source tree has no ``jaxdrive/presets/``; there it is the
    checkout's ``configs/`` next to the package.
    """
    from importlib import resources

    packaged = resources.files("jaxdrive") / "presets"
    if packaged.is_dir():
        if isinstance(packaged, os.PathLike):
            return pathlib.Path(packaged)
        return _extracted_presets(packaged)
    checkout = pathlib.Path(__file__).resolve().parent.parent / "configs"
    return checkout if checkout.is_dir() else None


_EXTRACTED: dict[str, pathlib.Path] = {}


def _extracted_presets(root) -> pathlib.Path:
    """A zipped install's presets (``importlib.resources`` traversables without real files)
    copied once per process into a temporary directory, so that a preset and the files it
    ``inherits:`` have real paths next to each other."""
    key = str(root)
    if key not in _EXTRACTED:
        import atexit
        import shutil
        import tempfile

        out = pathlib.Path(tempfile.mkdtemp(prefix="jaxdrive-presets-"))
        atexit.register(shutil.rmtree, out, True)

        def copy(src, dst: pathlib.Path) -> None:
            dst.mkdir(exist_ok=True)
            for item in src.iterdir():
                if item.is_dir():
                    copy(item, dst / item.name)
                elif item.name.endswith(PRESET_SUFFIX):
                    (dst / item.name).write_bytes(item.read_bytes())

        copy(root, out)
        _EXTRACTED[key] = out
    return _EXTRACTED[key]


def list_presets() -> list[str]:
    """The preset names, sorted: file paths under the presets directory without
    ``.yaml`` (``quickstart``, ``eval/default``, ...); empty when there are none."""
    root = presets_dir()
    if root is None:
        return []
    return sorted(p.relative_to(root).as_posix()[: -len(PRESET_SUFFIX)]
                  for p in root.rglob(f"*{PRESET_SUFFIX}") if p.is_file())


def resolve_config_path(name_or_path: str | os.PathLike) -> str:
    """The config file that ``name_or_path`` (a ``--config`` argument) names.

    An existing file path wins. Otherwise it is a preset name (``quickstart``,
    ``quickstart.yaml``, ``eval/default``; see ``list_presets``) and the result is that
    preset's file, whose ``inherits:`` resolve next to it. Neither is a ``ConfigError``
    naming the argument, listing the presets and suggesting the closest.
    """
    arg = os.fspath(name_or_path)
    if os.path.isfile(arg):
        return arg
    name = arg.replace("\\", "/")
    if name.endswith(PRESET_SUFFIX):
        name = name[: -len(PRESET_SUFFIX)]
    presets = list_presets()
    if name in presets:
        return str(presets_dir() / f"{name}{PRESET_SUFFIX}")
    if not presets:
        raise ConfigError(f"config '{arg}' is not a file, and no presets were found (the "
                          "jaxdrive package holds no jaxdrive/presets).")
    hint = suggest(name, presets) or suggest(os.path.basename(name), presets)
    raise ConfigError(f"config '{arg}' is neither a file nor a preset name.{hint} "
                      f"Presets: {', '.join(presets)}.")
