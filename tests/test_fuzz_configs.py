"""Property-based fuzzing of config input (issue 15): run-config dicts, YAML files,
``--set`` lists and evaluator suites.

The property, for every generated input: either a ``ConfigError`` whose message names
an offending key (a part of a generated key, or the file), or a valid config whose
every float is finite (within float32) and every int within int64, and which reads
back unchanged (``from_dict(to_dict())``, and through a YAML file). Never any other
exception.

Keys are drawn from the real schema (every leaf and section of ``RunConfig`` and of
the evaluator configs), from near-miss typos of them and from random text; values are
plausible (the default, scaled, negated, zero) or arbitrary (None, bools, huge ints,
NaN, inf, strings, path-like strings, nested lists and dicts).

Examples per test: ``JAXDRIVE_FUZZ_EXAMPLES`` (default 100, derandomised so that CI
sees the same inputs every run). The ``slow`` tests run 20x as many, randomised:
``python -m pytest -m slow tests/test_fuzz_configs.py``. Add
``--hypothesis-show-statistics`` to see the counts of valid configs and of errors.
No JAX compilation: configs are plain Python.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
import typing
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxdrive.config import ConfigBase, ConfigError, parse_overrides
from jaxdrive.eval.evaluators import EVALUATORS, STRUCTURAL_KEYS
from jaxdrive.eval.suite import load_suite_specs
from jaxdrive.files import UnsafeNameError, safe_name
from jaxdrive.runs.config import RunConfig, load_run_config

# As jaxdrive.config's bounds; spelled out so that this file also runs on older trees.
FLOAT32_MAX = 3.4028234663852886e38
INT64_MAX = 2**63 - 1
EXAMPLES = int(os.environ.get("JAXDRIVE_FUZZ_EXAMPLES", "100"))
_COMMON = dict(deadline=None, database=None, print_blob=True,
               suppress_health_check=list(HealthCheck))
FAST = settings(max_examples=EXAMPLES, derandomize=True, **_COMMON)
LONG = settings(max_examples=20 * EXAMPLES, **_COMMON)


# --- the schema ---------------------------------------------------------------------------

def _schema(cls: type[ConfigBase], prefix: str = "") -> tuple[list, list]:
    """(leaves, sections) of ``cls``: leaves as (dotted path, default), sections as paths."""
    leaves, sections = [], []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        if isinstance(hint, type) and issubclass(hint, ConfigBase):
            sections.append(path)
            sub_leaves, sub_sections = _schema(hint, f"{path}.")
            leaves += sub_leaves
            sections += sub_sections
        else:
            default = f.default if f.default is not dataclasses.MISSING else None
            leaves.append((path, default))
    return leaves, sections


RUN_LEAVES, RUN_SECTIONS = _schema(RunConfig)
EVAL_TYPES = list(EVALUATORS)
# Per evaluator type: the leaves and sections of its Config (env, procedural, render).
EVAL_SCHEMA = {name: _schema(cls.Config) for name, cls in EVALUATORS.items()}


# --- strategies -----------------------------------------------------------------------------

NASTY_STRINGS = ["", " ", "..", "../x", "../../etc", "/abs/path", "a/b", "a\\b", "x\x00y",
                 "nan", "1e-3", "=", "{a: 1", "[1, 2", "&a *a", "!!python/name:os.system",
                 "vehicle", "scene", "ego", "transformer", "linear", "remove", "trial",
                 "multi_scenario", "~", "$HOME/x", "é", "\u202e"]

EXTREMES = [math.nan, math.inf, -math.inf, 1e39, -1e39, 2**63, -(2**64), 10**30]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**70), 2**70), st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e3, 1e3), st.sampled_from([1e39, -1e39, 1e308, 5e-324]),
    st.text(max_size=8), st.sampled_from(NASTY_STRINGS),
)


def _nested(children):
    names = st.one_of(st.text(max_size=6), st.sampled_from([p for p, _ in RUN_LEAVES]))
    return st.lists(children, max_size=3) | st.dictionaries(names, children, max_size=3)


anything = st.recursive(scalars, _nested, max_leaves=6)


def _plausible(default: Any) -> st.SearchStrategy:
    """Values near a field's default: what a user would likely write."""
    if isinstance(default, bool):
        return st.booleans()
    if isinstance(default, int | float):
        factors = st.sampled_from([1, 2, 0.5, -1, 0, 10, 0.1, 3])
        out = factors.map(lambda k: type(default)(default * k) if default else k)
        return out | st.sampled_from([0, 1, -1, 2, 8, 64])
    if isinstance(default, tuple):
        if default and isinstance(default[0], int | float):
            return st.lists(st.floats(0, 200) | st.integers(0, 200), min_size=2,
                            max_size=2).map(sorted)
        return st.lists(st.sampled_from(NASTY_STRINGS), max_size=3)
    if isinstance(default, str):
        return st.sampled_from([default, default.upper(), default + "x", ""])
    return scalars


def _typo(text: str, where: int, op: int) -> str:
    """A near miss of ``text``: one character dropped, doubled, swapped or changed."""
    if not text:
        return "x"
    i = where % len(text)
    return [text[:i] + text[i + 1:], text[:i] + text[i] + text[i:],
            text[:i] + text[i + 1:i + 2] + text[i:i + 1] + text[i + 2:],
            text[:i] + "_" + text[i + 1:]][op % 4]


@st.composite
def entry(draw, leaves=RUN_LEAVES, sections=RUN_SECTIONS) -> tuple[str, Any]:
    """One (dotted key, value) pair: a real key or a near miss, a plausible or any value."""
    kind = draw(st.integers(0, 9))
    if kind < 6:
        key, default = draw(st.sampled_from(leaves))
        if kind == 3:  # a user's NaN, inf or overflow
            value = draw(st.sampled_from(EXTREMES))
        else:
            value = draw(_plausible(default)) if kind < 3 else draw(anything)
    elif kind < 8:
        key, _ = draw(st.sampled_from(leaves))
        key = _typo(key, draw(st.integers(0, 99)), draw(st.integers(0, 3)))
        value = draw(anything)
    elif sections:
        key, value = draw(st.sampled_from(sections)), draw(anything)
    else:
        key, value = draw(st.text(max_size=10)), draw(anything)
    return key, value


run_overrides = st.lists(entry(), min_size=1, max_size=3).map(dict)


# --- the property ---------------------------------------------------------------------------

def _tokens(data: Any) -> set[str]:
    """Every key part in ``data`` (dotted keys split), recursively; for messages."""
    out: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            out |= {p for p in str(key).split(".") if p}
            out |= _tokens(value)
    elif isinstance(data, list | tuple):
        for value in data:
            out |= _tokens(value)
    return out or {""}


def _walk_numbers(value: Any, path: str = "") -> None:
    """Asserts every float in a config is finite and float32-sized, every int int64."""
    if isinstance(value, ConfigBase):
        for f in dataclasses.fields(value):
            _walk_numbers(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _walk_numbers(v, f"{path}[{i}]")
    elif isinstance(value, float):
        assert abs(value) <= FLOAT32_MAX, (path, value)  # also False for NaN
    elif isinstance(value, int) and not isinstance(value, bool):
        assert abs(value) <= INT64_MAX, (path, value)


KINDS = [  # (statistics label, message pattern), first match wins
    ("--set syntax", r"^override "),
    ("unsafe name", r"file or directory name"),
    ("file or YAML", r"not valid YAML|UTF-8|is empty|directory|not found|must hold a map"),
    ("unknown key", r"unknown (config )?key|unknown section|unknown evaluator|no 'type'"),
    ("NaN, inf or too large", r"finite number|too large"),
    ("wrong type", r"must be (a|an|true|null) |must be a mapping|is required"),
    ("range or relation", r"."),
]


def _kind(message: str) -> str:
    return next(label for label, pattern in KINDS if re.search(pattern, message))


def _check_error(error: ConfigError, names: set[str]) -> None:
    message = str(error)
    event(f"ConfigError: {_kind(message)}")
    assert len(message) < 2000, message[:300]
    assert any(n in message for n in names), (names, message)


def _check_valid(config: RunConfig) -> None:
    event("valid RunConfig")
    _walk_numbers(config)
    assert RunConfig.from_dict(config.to_dict()) == config


def _property_overrides(overrides: dict) -> None:
    try:
        config = load_run_config(None, overrides)
    except ConfigError as e:
        _check_error(e, _tokens(overrides))
    else:
        _check_valid(config)


@FAST
@given(run_overrides)
def test_fuzz_run_config_dicts(overrides):
    _property_overrides(overrides)


@pytest.mark.slow
@LONG
@given(run_overrides)
def test_fuzz_run_config_dicts_long(overrides):
    _property_overrides(overrides)


# --- YAML files -----------------------------------------------------------------------------

_TMP = tempfile.mkdtemp(prefix="jaxdrive-fuzz-")


@st.composite
def yaml_texts(draw) -> str:
    """A YAML dump of generated overrides, sometimes damaged: a character inserted or a
    line duplicated (a duplicate key), an alias chain, bytes that are not UTF-8."""
    text = yaml.safe_dump(draw(run_overrides), allow_unicode=True)
    damage = draw(st.integers(0, 5))
    lines = text.splitlines(keepends=True)
    if damage == 1:
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(list(":{}[]&*!|>'\"#%@`-\t\n "))) + text[i:]
    elif damage == 2:
        text = "".join(lines + lines[:1])
    elif damage == 3:
        text = text + "x: &a [1, 2]\ny: [*a, *a]\n"
    elif damage == 4:
        text = draw(st.sampled_from(["", "# c\n", "[1, 2]\n", "7\n", "{}\n", "inherits: .\n"]))
    elif damage == 5:
        text = text + "\udcff"
    return text


def _property_yaml(text: str) -> None:
    path = os.path.join(_TMP, "fuzz.yaml")
    with open(path, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
    try:
        config = load_run_config(path)
    except ConfigError as e:
        _check_error(e, {"fuzz.yaml"})
        return
    _check_valid(config)
    # What a run writes as config.yaml reads back the same.
    with open(path, "w") as f:
        yaml.safe_dump(config.to_dict(), f)
    assert load_run_config(path) == config


@FAST
@given(yaml_texts())
def test_fuzz_yaml_files(text):
    _property_yaml(text)


@pytest.mark.slow
@LONG
@given(yaml_texts())
def test_fuzz_yaml_files_long(text):
    _property_yaml(text)


# --- --set lists ------------------------------------------------------------------------------

RAW_CHARS = st.text(alphabet=list("{}[]:,&*!|>'\"#%@`-=.~ 0123456789eEnaifxy\\/_"),
                    max_size=10)


def _flow(value: Any) -> str:
    """``value`` as one line of YAML flow style (as a user types it after ``=``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


@st.composite
def set_pair(draw) -> str:
    """One ``--set`` argument: mostly ``key=value`` as a user writes it, else a
    mangled key (``a.``, ``.a``, ``a..b``, random), separator (``==``, none, spaced) or
    a YAML-looking value."""
    key, value = draw(entry())
    if draw(st.integers(0, 3)):
        return f"{key}={_flow(value)}"
    key = draw(st.sampled_from([key, key + ".", "." + key, key.replace(".", ".."),
                                draw(st.text(max_size=6))]))
    sep = draw(st.sampled_from(["=", "==", "", " = "]))
    raw = draw(st.one_of(RAW_CHARS, st.just(_flow(value))))
    return f"{key}{sep}{raw}"


def _property_set(pairs: list[str]) -> None:
    try:
        overrides = parse_overrides(pairs)
    except ConfigError as e:
        _check_error(e, {"override"})
        return
    _property_overrides(overrides)


@FAST
@given(st.lists(set_pair(), min_size=1, max_size=3))
def test_fuzz_set_lists(pairs):
    _property_set(pairs)


@pytest.mark.slow
@LONG
@given(st.lists(set_pair(), min_size=1, max_size=3))
def test_fuzz_set_lists_long(pairs):
    _property_set(pairs)


# --- evaluator suites -------------------------------------------------------------------------

SECTION_NAMES = ["validation", "planning", "_base", "v2", "validation", "planning",
                 "../../x", "a/b", "..", "", "x y"]


@st.composite
def eval_section(draw, names: list[str]) -> dict:
    """One ``eval:`` section: a type (or a near miss, or none), keys of that type's
    config (dotted ``env.``/``procedural.``/``render.`` keys included), ``inherits`` of
    other sections, ``template``."""
    type_ = draw(st.sampled_from(EVAL_TYPES))
    leaves, sections = EVAL_SCHEMA[type_]
    body = dict(draw(st.lists(entry(leaves, sections), max_size=3)))
    kind = draw(st.integers(0, 7))
    if kind < 6:
        body["type"] = type_
    elif kind == 6:
        body["type"] = _typo(type_, draw(st.integers(0, 20)), draw(st.integers(0, 3)))
    if draw(st.integers(0, 3)) == 0:
        body["inherits"] = draw(st.sampled_from(names) | st.lists(st.sampled_from(names),
                                                                    max_size=2))
    if draw(st.integers(0, 4)) == 0:
        body["template"] = draw(st.booleans() | scalars)
    if type_ == "behavior_class" and draw(st.integers(0, 3)):
        body["classes"] = draw(st.lists(st.sampled_from(NASTY_STRINGS), min_size=1,
                                        max_size=2))
    return body


@st.composite
def suite_dicts(draw) -> dict:
    names = draw(st.lists(st.sampled_from(SECTION_NAMES) | st.text(max_size=5),
                          min_size=1, max_size=2, unique=True))
    data = {"eval": {name: draw(eval_section(names)) for name in names}}
    if draw(st.integers(0, 3)) == 0:
        data["suites"] = draw(st.dictionaries(
            st.sampled_from(["default", "all", *names]),
            st.sampled_from(names) | st.lists(st.sampled_from(names), max_size=3)
            | scalars, max_size=2))
    return data


def _property_suite(data: dict) -> None:
    try:
        specs = load_suite_specs(data)
    except ConfigError as e:
        _check_error(e, _tokens(data) | {"eval", "suite"})
        return
    event(f"valid suite of {len(specs)}")
    for name, spec in specs.items():
        try:
            safe_name(name, "eval section")
        except UnsafeNameError:
            pytest.fail(f"unsafe section name {name!r} accepted")
        _walk_numbers(spec.config)
        again = load_suite_specs({"eval": {name: spec.resolved}})[name]
        assert again.config == spec.config


@FAST
@given(suite_dicts())
def test_fuzz_eval_suites(data):
    _property_suite(data)


@pytest.mark.slow
@LONG
@given(suite_dicts())
def test_fuzz_eval_suites_long(data):
    _property_suite(data)


def test_schema_is_covered():
    # The fuzzers draw from the whole schema, not a stale copy of it.
    assert len(RUN_LEAVES) > 100 and "train.learning_rate" in dict(RUN_LEAVES)
    assert "env.observation.num_road" in dict(RUN_LEAVES)
    assert set(STRUCTURAL_KEYS) == {"type", "inherits", "template"}
    eval_keys = {k for leaves, _ in EVAL_SCHEMA.values() for k, _ in leaves}
    assert {"classes", "confidence", "ttc_horizon", "env.goal_radius"} <= eval_keys
