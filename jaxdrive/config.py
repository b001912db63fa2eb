"""Configuration plumbing: frozen dataclasses built from dicts with strict validation.

Every concern defines its own frozen dataclass next to its code (``ProceduralConfig``
in ``scenarios/procedural/config.py``, ``DynamicsConfig`` in ``sim/dynamics.py``, ...) and
inherits ``ConfigBase``. ``from_dict`` builds nested configs, rejects unknown keys by
name with the allowed ones listed, converts lists to tuples (so configs stay hashable
and usable as static jit arguments) and runs each class's ``__post_init__`` checks.

Config files may ``inherits:`` other files and spell nested keys as dotted paths
(``env.collision_behavior: remove``); ``Sections`` gives named sections in one file (the
``eval:`` sections of ``jaxdrive.eval.suite``) the same ``inherits``, plus templates.
``inherit`` and ``expand_dotted`` are the machinery both use.

Every input error is a ``ConfigError`` naming the key (or the file, or the ``--set``
argument) and the fix, never a traceback from deeper in:

- ``from_dict`` checks each value against its field's type (``check_type``): floats are
  finite and within float32 (NaN, inf, 1e39 and 1e-320 are refused), ints within int64, strings
  (names, paths) are strings, lists hold elements of their type; one string given for a
  list of strings is a list of one (``train.co_players: runs/a``), never split.
- YAML is read by ``yaml_load``: safe (Python tags refused), YAML 1.2 floats (``1e-3`` is
  a float, not a string), a key twice in one mapping is an error, alias expansion is
  bounded (``MAX_YAML_NODES``; an alias bomb fails at once) and recursive aliases are
  refused. A config file that is missing, a directory, not UTF-8, invalid YAML or empty
  is an error; an empty file is refused with a hint (write ``{}`` for all defaults).
- ``parse_overrides`` (``--set``) refuses empty key parts, values that are not YAML
  (``train.num_envs==``, ``{a: 1``) and a key inside a value an earlier override set
  to a non-mapping (``x=1`` then ``x.y=2``).
- Names used as one path component (``logging.run_name``, eval section names) pass
  ``check_name`` (``jaxdrive.files.safe_name``).

The YAML presets (the repository's ``configs/``) ship inside the package as package data
``jaxdrive.presets``; ``resolve_config_path`` turns a ``--config`` argument (a file, or a
preset name such as ``quickstart`` or ``eval/default``) into a file, ``list_presets``
names them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import math
import os
import pathlib
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from jaxdrive.files import UnsafeNameError, safe_name

# Largest magnitude of a float config value: the device computes in float32, where
# anything beyond is inf.
FLOAT32_MAX = 3.4028234663852886e38
# Smallest normal float32: a nonzero float config value below it is 0 or loses its
# precision on the device (1e-320 became 0).
FLOAT32_TINY = 1.1754943508222875e-38
# Int config values must fit in int64 (what NumPy and JAX hold them in).
INT64_MAX = 2**63 - 1


class ConfigError(ValueError):
    """A configuration value or key is invalid; the message names the key and the fix."""


def suggest(name: str, allowed: Sequence[str]) -> str:
    """`` Did you mean 'X'?`` for the closest of ``allowed`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(str(name), [str(a) for a in allowed], n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def _to_hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_to_hashable(v) for v in value)
    return value


def _in_section(path: str, error: ConfigError) -> ConfigError:
    """``error`` of a key of section ``path`` prefixed with the section (``'train': ...``)
    unless it names it already."""
    if path and not str(error).startswith(f"'{path}"):
        return ConfigError(f"'{path}': {error}")
    return error


@dataclasses.dataclass(frozen=True)
class ConfigBase:
    """Base of every config dataclass: strict ``from_dict``, ``to_dict``, ``replace``."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, path: str = ""):
        """Build the config from a (nested) mapping; unknown keys are errors.

        Every value is checked against its field's type first (``check_type``): a float
        field holds a finite number, an int field an int, a string field (names, paths)
        a string, a list field a list of such values (one string reads as a list of
        one); then the class's ``__post_init__`` checks ranges and relations.

        Args:
          data: the section's keys (None = all defaults).
          path: the dotted path of this section in the whole config (for messages).

        Raises:
          ConfigError: naming the key (``'train': config key 'gamma' ...``, or the full
          dotted path) and the fix; also for a missing required key.
        """
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"config section '{path or cls.__name__}' must be a mapping "
                              f"of {cls.__name__} keys, got {type(data).__name__}.")
        data = dict(data or {})
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(data) - set(fields), key=str)
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
                try:
                    kwargs[name] = check_type(name, _to_hashable(value), sub)
                except ConfigError as e:
                    raise _in_section(path, e) from None
        missing = [name for name, f in fields.items() if name not in kwargs
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise ConfigError(f"config key '{path + '.' if path else ''}{missing[0]}' is "
                              f"required ({cls.__name__} has no default for it); set it.")
        try:
            return cls(**kwargs)
        except ConfigError as e:
            raise _in_section(path, e) from None

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


_CHECK_LOGS: list[list[tuple]] = []  # open ``recorded_checks`` blocks


@contextlib.contextmanager
def recorded_checks() -> Iterator[list[tuple]]:
    """Within: each value check below also appends what it enforces to the yielded list,
    as ``(key name, kind, *what)``: ``("k", "choice", allowed)``, ``("k", "integer" |
    "number" | "pair", lo, hi, lo_open, hi_open)`` (an integer or a pair also records
    the number checks it runs after its own). The config reference reads them
    (``jaxdrive.runs.reference``)."""
    log: list[tuple] = []
    _CHECK_LOGS.append(log)
    try:
        yield log
    finally:
        _CHECK_LOGS.remove(log)


def _record(*event) -> None:
    for log in _CHECK_LOGS:
        log.append(event)


def check_range(
    name: str, value: float, lo: float | None = None, hi: float | None = None,
    *, lo_open: bool = False, hi_open: bool = False,
) -> None:
    """Raise ``ConfigError`` unless ``lo <= value <= hi`` (``lo < value`` if ``lo_open``,
    ``value < hi`` if ``hi_open``)."""
    _record(name, "number", lo, hi, lo_open, hi_open)
    check_number(name, value)
    bad_lo = lo is not None and (value <= lo if lo_open else value < lo)
    bad_hi = hi is not None and (value >= hi if hi_open else value > hi)
    if bad_lo or bad_hi:
        lo_s = "-inf" if lo is None else f"{lo}"
        hi_s = "inf" if hi is None else f"{hi}"
        opening = "(" if lo_open else "["
        closing = ")" if hi_open else "]"
        raise ConfigError(f"config key '{name}' = {_clip(value)} is out of range; allowed "
                          f"{opening}{lo_s}, {hi_s}{closing}.")


def check_number(name: str, value: Any, limit: float | None = None) -> None:
    """Raise ``ConfigError`` unless ``value`` is a finite int or float (not a bool) of
    magnitude at most ``limit`` (default: ``INT64_MAX`` for an int, ``FLOAT32_MAX`` for a
    float; beyond float32 a value is inf on the device). NaN and inf are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config key '{name}' must be a number, got {_clip(value)}.")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config key '{name}' = {_clip(value)} must be a finite number "
                          "(NaN and inf are not allowed); give a number.")
    if limit is None:
        limit = INT64_MAX if isinstance(value, int) else FLOAT32_MAX
    if abs(value) > limit:
        raise ConfigError(f"config key '{name}' = {_clip(value)} is too large in magnitude "
                          f"(at most {limit:.4g}); give a smaller number.")
    if isinstance(value, float) and limit == FLOAT32_MAX and 0 < abs(value) < FLOAT32_TINY:
        raise ConfigError(f"config key '{name}' = {_clip(value)} is too small in magnitude "
                          f"for float32 (below {FLOAT32_TINY:.4g} it is 0 or loses its "
                          "precision on the device); give 0 or a larger number.")


def check_bool(name: str, value: Any) -> None:
    """Raise ``ConfigError`` unless ``value`` is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ConfigError(f"config key '{name}' must be true or false, got {_clip(value)}.")


def check_int(name: str, value: Any, lo: int | None = None, hi: int | None = None) -> None:
    """Raise ``ConfigError`` unless ``value`` is an int in ``[lo, hi]``."""
    _record(name, "integer", lo, hi, False, False)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config key '{name}' must be an integer, got {_clip(value)}.")
    check_range(name, value, lo, hi)


# Seeds everywhere (config keys and command-line options): what a JAX key and the
# generators take.
MAX_SEED = 2**31 - 1


def int_arg(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` ``type`` for an integer option in ``[low, high]``: anything else is
    a usage error (exit 2) naming the bounds, before any work."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_clip(text)} is not an integer") from None
        if (low is not None and value < low) or (high is not None and value > high):
            lo = "" if low is None else f">= {low}"
            hi = "" if high is None else f"<= {high:,}"
            bounds = " and ".join(x for x in (lo, hi) if x)
            raise argparse.ArgumentTypeError(f"{_clip(value)} is out of range: it must be "
                                             f"{bounds}")
        return value

    return parse


def finite_float_arg(text: str) -> float:
    """An ``argparse`` ``type`` for a finite float option (NaN and infinities are usage
    errors)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{_clip(text)} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def check_choice(name: str, value: Any, allowed: Sequence[str]) -> None:
    """Raise ``ConfigError`` unless ``value`` is one of ``allowed``."""
    _record(name, "choice", tuple(allowed))
    if value not in allowed:
        hint = suggest(value, allowed) if isinstance(value, str) else ""
        raise ConfigError(
            f"config key '{name}' = {_clip(value)} is not allowed.{hint} "
            f"Allowed values: {', '.join(map(str, allowed))}."
        )


def check_interval(name: str, value: Any, lo: float | None = None, hi: float | None = None):
    """Raise ``ConfigError`` unless ``value`` is a pair ``(low, high)`` with low <= high."""
    _record(name, "pair", lo, hi, False, False)
    if not (isinstance(value, tuple) and len(value) == 2):
        raise ConfigError(f"config key '{name}' must be a pair [low, high], got {_clip(value)}.")
    check_range(f"{name}[0]", value[0], lo, hi)
    check_range(f"{name}[1]", value[1], lo, hi)
    if value[0] > value[1]:
        raise ConfigError(f"config key '{name}' = {list(value)}: low must not exceed high.")


def check_name(name: str, value: Any) -> None:
    """Raise ``ConfigError`` unless ``value`` is safe as one file or directory name
    (``jaxdrive.files.safe_name``: no separators, ``..``, absolute paths or NUL)."""
    try:
        safe_name(value, f"config key '{name}'")
    except UnsafeNameError as e:
        raise ConfigError(f"{e}.") from None


_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def url_problem(value: str) -> str | None:
    """Why ``value`` cannot be used as a path (it names a URL such as ``gs://bucket/x``,
    which would become a local directory ``gs:/bucket/x``); None for a local path."""
    if not _URL.match(value):
        return None
    scheme = value.split("://", 1)[0]
    return (f"{_clip(value)} is a {scheme}:// URL: jaxdrive reads and writes local paths "
            "only (object stores are not supported yet); mount the bucket (e.g. gcsfuse "
            "for gs://, s3fs or mountpoint-s3 for s3://) on every host and give the "
            "mounted path")


# Linux's NAME_MAX and PATH_MAX: longer names fail in every file call (ENAMETOOLONG).
MAX_NAME_BYTES, MAX_PATH_BYTES = 255, 4095


def local_path_arg(text: str) -> str:
    """An ``argparse`` ``type`` for a path option: an empty path (a shell variable that
    was never set: it would read as the option left out), a URL (see ``url_problem``),
    a NUL, a name of more than 255 bytes or a path of more than 4,095 are usage
    errors."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (is a shell variable unset?)")
    problem = url_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    raw = os.fsencode(text)
    if b"\x00" in raw:
        raise argparse.ArgumentTypeError(f"{_clip(text)} contains a NUL byte")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES or len(raw) > MAX_PATH_BYTES:
        raise argparse.ArgumentTypeError(
            f"{_clip(text)} is too long for a path ({len(raw):,} bytes, a name of "
            f"{longest:,}; at most {MAX_NAME_BYTES} a name and {MAX_PATH_BYTES:,} in all)")
    return text


def check_path(name: str, value: Any, optional: bool = True) -> None:
    """Raise ``ConfigError`` unless ``value`` is a non-empty local path string without NUL
    (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str) or not value or "\x00" in value:
        none = " or null" if optional else ""
        raise ConfigError(f"config key '{name}' must be a path (a non-empty string{none}), "
                          f"got {_clip(value)}; quote a path that YAML would read as a number.")
    problem = url_problem(value)
    if problem:
        raise ConfigError(f"config key '{name}' = {problem}.")


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


def check_type(name: str, value: Any, hint: Any) -> Any:
    """``value`` checked against a field's type hint; returns it, with one string given
    for a list of strings read as a list of one (``co_players: runs/a``).

    Checked: ``bool``, ``int`` (not bool, within int64), ``float`` (an int or float,
    finite, within float32: ``check_number``), ``str``, ``X | None``, tuples of those
    (``tuple[str, ...]``, ``tuple[float, float]``; lists arrive as tuples). Other hints
    (config sections, ``Any``) pass unchecked.

    Raises:
      ConfigError: naming ``name`` (``train.co_players[1]`` for an element).
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return value
        rest = [a for a in args if a is not type(None)]
        return check_type(name, value, rest[0]) if len(rest) == 1 else value
    if hint is bool:
        check_bool(name, value)
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{name}' must be an integer, got {_clip(value)}.")
        check_number(name, value)
    elif hint is float:
        check_number(name, value, FLOAT32_MAX)
    elif hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key '{name}' must be a string, got {_clip(value)}; quote "
                              "it in YAML if it looks like a number.")
    elif origin is tuple:
        return _check_tuple(name, value, args)
    return value


def _check_tuple(name: str, value: Any, args: tuple) -> tuple:
    """``check_type`` for ``tuple[T, ...]`` (any length) and ``tuple[A, B]`` (fixed)."""
    variadic = len(args) == 2 and args[1] is Ellipsis
    if variadic and args[0] is str and isinstance(value, str):
        value = (value,)
    if not isinstance(value, tuple):
        raise ConfigError(f"config key '{name}' must be a list, got {_clip(value)}.")
    if variadic:
        elems = [args[0]] * len(value)
    else:
        elems = list(args)
        if len(value) != len(elems):
            kinds = ", ".join(_type_name(a) for a in elems)
            raise ConfigError(f"config key '{name}' must be a list of {len(elems)} values "
                              f"[{kinds}], got {_clip(list(value))}.")
    return tuple(check_type(f"{name}[{i}]", v, t) for i, (v, t) in
                 enumerate(zip(value, elems, strict=True)))


# Alias expansion is bounded: a few hundred bytes of nested aliases ("billion laughs")
# would otherwise expand to billions of values in the merges that follow.
MAX_YAML_NODES = 100_000


class YamlLimitError(yaml.YAMLError):
    """A YAML document that is too large once expanded, recursive, or has a key twice."""


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no Python tags) with YAML 1.2 floats (``1e-3``, which the 1.1
    resolver reads as a string) and duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlLimitError(f"key {key!r} appears twice (lines {seen[key]} and "
                                     f"{line}); keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _expanded_size(node: yaml.Node, memo: dict[int, int], stack: set[int]) -> int:
    """Nodes ``node`` stands for with every alias expanded (memoised: linear time)."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in stack:
        raise YamlLimitError("an alias refers to a node that contains it (a recursive "
                             "structure); write the values out")
    stack.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    for child in children:
        size += _expanded_size(child, memo, stack)
        if size > MAX_YAML_NODES:
            raise YamlLimitError(f"the document expands to more than {MAX_YAML_NODES:,} "
                                 "values (nested aliases?); write it out or use inherits:")
    stack.discard(key)
    memo[key] = size
    return size


def yaml_load(text: str) -> Any:
    """One YAML document parsed safely: no Python tags, YAML 1.2 floats (``1e-3``),
    duplicate keys refused, alias expansion bounded by ``MAX_YAML_NODES``.

    Raises:
      yaml.YAMLError: invalid YAML; ``YamlLimitError`` for a duplicate key, a recursive
        alias or a document too large once expanded; RecursionError for nesting deeper
        than the parser's stack.
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set())
        try:
            return loader.construct_document(node)
        except ValueError as e:  # an impossible date, an int of 5000 digits
            raise YamlLimitError(f"a value cannot be read: {e}") from None
    finally:
        loader.dispose()


def _yaml_problem(e: BaseException, lines: bool = True) -> str:
    """A YAML error in one line: the problem, and where (``lines``) when it is known."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, yaml.MarkedYAMLError) and e.problem:
        mark = e.problem_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if lines and mark else ""
        return f"{e.problem}{at}"
    return str(e)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Turn ``["a.b=3", "c=x"]`` into a nested dict; values are parsed as YAML (``yaml_load``).

    A later override of the same key wins; an override whose key goes through a value
    an earlier one set to a non-mapping (``x=1`` then ``x.y=2``) is an error.

    Raises:
      ConfigError: naming the override, for a missing ``=``, an empty key part
        (``a..b``, ``=3``), a value that is not valid YAML (``{a: 1``, ``=``) or such a
        conflict.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        if not isinstance(pair, str) or "=" not in pair:
            raise ConfigError(f"override {_clip(pair)} must look like key.sub=value.")
        key, raw = pair.split("=", 1)
        parts = key.strip().split(".")
        if not all(p.strip() for p in parts):
            raise ConfigError(f"override {_clip(pair)}: the key {_clip(key.strip())} must be "
                              "a name or a dotted path like train.num_envs (no empty parts).")
        try:
            value = yaml_load(raw)
        except (yaml.YAMLError, RecursionError) as e:
            raise ConfigError(
                f"override {_clip(pair)}: the value is not valid YAML "
                f"({_yaml_problem(e, lines=False)}); write key=value with one '=', and "
                "quote a string value that holds YAML syntax.") from None
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                head = ".".join(parts[: i + 1])
                raise ConfigError(f"override {_clip(pair)} sets a key inside '{head}', which "
                                  f"an earlier override set to {_clip(child)}; drop one of "
                                  "them.")
            node = child
        node[parts[-1]] = value
    return out


def _clip(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages."""
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python converts
        return "<a number too long to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


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

    Keys that set different leaves merge (``merge``): ``env.x: 1`` beside ``env: {y: 2}``.

    Args:
      data: a config mapping (a file's, a section's).
      where: how an error names the mapping (``config file 'x.yaml'``).

    Raises:
      ConfigError: a key that is not a string or has an empty part (``env..x``); two
        keys that set the same setting (``train.seed: 4`` beside ``train: {seed: 5}``),
        which would silently drop one of them.
    """
    for key in data:
        if not isinstance(key, str) or not all(key.split(".")):
            raise ConfigError(f"{where}: key {key!r} must be a name or a dotted path "
                              "like env.collision_behavior.")
    _check_one_key_per_setting(data, where)
    out: dict[str, Any] = {}
    # Keys set different settings (checked above); shallow first keeps merges simple.
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


def _leaf_paths(key: str, value: Any) -> list[str]:
    """The dotted paths of the settings ``key: value`` sets (its nested leaves)."""
    if isinstance(value, Mapping) and value:
        return [p for k, v in value.items() if isinstance(k, str)
                for p in _leaf_paths(f"{key}.{k}", v)]
    return [key]


def _check_one_key_per_setting(data: Mapping[str, Any], where: str) -> None:
    """``ConfigError`` when two keys of ``data`` set the same setting (or one sets a
    value where another sets settings inside it)."""
    owner: dict[str, str] = {}
    for key, value in data.items():
        for path in _leaf_paths(key, value):
            for other_path, other_key in owner.items():
                if other_key != key and (path == other_path
                                         or path.startswith(other_path + ".")
                                         or other_path.startswith(path + ".")):
                    raise ConfigError(
                        f"{where}: keys '{other_key}' and '{key}' both set "
                        f"'{min(path, other_path, key=len)}'; keep one of them (one would "
                        "be dropped).")
            owner[path] = key


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
                          f"got {_clip(parents)}.")
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


def read_yaml_file(file: str, inherited_by: str | None = None) -> dict[str, Any]:
    """One YAML config file as a mapping (``yaml_load``: safe, bounded, no duplicate keys).

    Args:
      file: the path.
      inherited_by: the file that ``inherits:`` it, for messages.

    Raises:
      ConfigError: naming the file, when it is missing, a directory, unreadable, not
        UTF-8, not valid YAML, empty (no keys: write ``{}`` for all defaults) or not a
        mapping.
    """
    by = f" (inherited by '{inherited_by}')" if inherited_by else ""
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file '{file}' not found{by}.") from None
    except IsADirectoryError:
        raise ConfigError(f"config file '{file}'{by} is a directory; give a YAML file "
                          "(or a preset name).") from None
    except OSError as e:
        raise ConfigError(f"config file '{file}'{by} cannot be read: "
                          f"{e.strerror or e}.") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file '{file}'{by} is not UTF-8 text (byte "
                          f"0x{raw[e.start]:02x} at offset {e.start}); save it as UTF-8."
                          ) from None
    try:
        data = yaml_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"config file '{file}' is not valid YAML: "
                          f"{_yaml_problem(e)}") from None
    if data is None:
        raise ConfigError(f"config file '{file}'{by} is empty. Write '{{}}' in it to mean "
                          "all defaults, or leave out --config.")
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{file}' must hold a mapping of sections, got "
                          f"{type(data).__name__}.")
    return data


def load_yaml(path: str | os.PathLike, dotted: bool = False) -> dict[str, Any]:
    """A YAML config file as a dict, with file inheritance resolved.

    A file may name parents with ``inherits: base.yaml`` (or a list, merged in order);
    paths are relative to the file that names them. Parents are merged first and the
    child wins key by key (nested mappings merge recursively). A missing or unreadable
    file, invalid YAML (``read_yaml_file``), an empty file, a non-mapping or an
    inheritance cycle is a ``ConfigError`` naming the files.

    Args:
      path: the file.
      dotted: expand dotted keys (``env.collision_behavior: remove``; ``expand_dotted``)
        in each file before it merges with its parents, so that a child's dotted key wins
        over a parent's mapping. Off for files whose mappings are keyed by names
        (``eval:`` sections expand their own keys).
    """

    def read(file: str, chain: tuple[str, ...]):
        data = read_yaml_file(file, chain[-1] if chain else None)
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
    if os.path.isdir(arg):
        raise ConfigError(f"config '{arg}' is a directory; give a YAML file or a preset "
                          f"name (presets: {', '.join(presets) or 'none'}).")
    if not presets:
        raise ConfigError(f"config '{arg}' is not a file, and no presets were found (the "
                          "jaxdrive package holds no jaxdrive/presets).")
    hint = suggest(name, presets) or suggest(os.path.basename(name), presets)
    raise ConfigError(f"config '{arg}' is neither a file nor a preset name.{hint} "
                      f"Presets: {', '.join(presets)}.")
