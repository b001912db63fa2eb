"""The config reference: every key of a training run's config, generated from the
config dataclasses themselves (``RunConfig`` and the sections nested in it).

For each key: its dotted name, its type (the field's annotation), its default, what
values it takes, and its description (the ``Attributes:`` entry of its class's
docstring). The values come from the checks the class's ``__post_init__`` runs on its
defaults (``check_choice``, ``check_int``, ``check_range``), recorded while the default
is built, so the reference says what the code enforces, not what someone remembered to
write. ``docs/config.md`` is this module's output; ``tests/test_config_reference.py``
fails when the two differ.

    python -m jaxdrive.runs.reference [OUT.md]     # default: print to stdout
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import sys
import textwrap
import typing
from collections.abc import Iterator

from jaxdrive import config as config_module
from jaxdrive.config import ConfigBase
from jaxdrive.runs.config import RunConfig

HEADER = """# Config reference

Every key of a training config (`python -m jaxdrive.train --config FILE`, `--set
KEY=VALUE`), generated from the config classes by `python -m jaxdrive.runs.reference
docs/config.md` (a test fails when this file is out of date). "Takes" is what the
class's own checks enforce on the default; keys whose checks depend on other keys say
so in their description. Config files may set nested keys as sections or dotted paths
(`env.reward.goal: 1.0`), and `inherits:` other files ([training.md](training.md)).
Evaluation suites (`eval:` sections) reuse the `env` and `procedural` keys below
([evaluation.md](evaluation.md)).
"""


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: ``name`` dotted, ``type`` and ``default`` as written in YAML
    terms, ``takes`` the enforced values (may be empty), ``doc`` its description."""

    name: str
    type: str
    default: str
    takes: str
    doc: str


def attribute_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` from the ``Attributes:`` section of ``cls``'s docstring
    (an entry ``a, b: text`` documents both fields)."""
    doc = inspect.getdoc(cls) or ""
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
        return {}
    out: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []

    def flush():
        for n in names:
            out[n] = " ".join(text).strip()

    body = lines[start + 1:]
    first = next((line for line in body if line.strip()), "")
    indent = len(first) - len(first.lstrip())
    entry = re.compile(rf"^ {{{indent}}}([A-Za-z_][\w, ]*):(?:\s+(.*))?$")
    for line in body:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break  # the next section (Args:, a paragraph)
        m = entry.match(line)
        if m:
            flush()
            names = [n.strip() for n in m.group(1).split(",")]
            text = [m.group(2) or ""]
        elif names:
            text.append(line.strip())
    flush()
    return out


@contextlib.contextmanager
def _recording(found: dict[str, str]) -> Iterator[None]:
    """Within: ``jaxdrive.config``'s value checks record what they enforce into
    ``found`` (field name -> words) as well as checking."""
    originals = {n: getattr(config_module, n)
                 for n in ("check_choice", "check_int", "check_range", "check_interval")}

    def fmt(x):
        return f"{x:g}" if isinstance(x, float) else str(x)

    def bounds(kind, lo, hi, lo_open, hi_open):
        if hi is None:
            return f"{kind} {'>' if lo_open else '>='} {fmt(lo)}"
        if lo is None:
            return f"{kind} {'<' if hi_open else '<='} {fmt(hi)}"
        return f"{kind} in {'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}{')' if hi_open else ']'}"

    def field(name):  # "topology.straight" -> "straight", "interval[0]" -> "interval"
        return name.split("[")[0].split(".")[-1]

    def choice(name, value, allowed):
        found.setdefault(field(name), ", ".join(f"`{a}`" for a in allowed))
        return originals["check_choice"](name, value, allowed)

    def interval(kind):
        def check(name, value, lo=None, hi=None, *, lo_open=False, hi_open=False):
            if lo is not None or hi is not None:
                found.setdefault(field(name), bounds(kind, lo, hi, lo_open, hi_open))
            if kind == "integer":
                return originals["check_int"](name, value, lo, hi)
            if kind == "pair":
                return originals["check_interval"](name, value, lo, hi)
            return originals["check_range"](name, value, lo, hi, lo_open=lo_open,
                                            hi_open=hi_open)
        return check

    patched = {"check_choice": choice, "check_int": interval("integer"),
               "check_range": interval("number"), "check_interval": interval("pair")}
    modules = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("jaxdrive")]
    saved = []
    for m in modules:
        for name, fn in patched.items():
            if getattr(m, name, None) is originals[name]:
                saved.append((m, name))
                setattr(m, name, fn)
    try:
        yield
    finally:
        for m, name in saved:
            setattr(m, name, originals[name])


def _type_name(t) -> str:
    if isinstance(t, type) and not typing.get_args(t):
        return {"str": "string", "int": "integer", "float": "number",
                "bool": "true/false"}.get(t.__name__, t.__name__)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is tuple:
        inner = " or ".join(dict.fromkeys(_type_name(a) for a in args if a is not Ellipsis))
        return f"list of {inner}"
    if args:  # a union
        names = [("null" if a is type(None) else _type_name(a)) for a in args]
        return " or ".join(dict.fromkeys(names))
    return str(t)


def _yaml(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, ConfigBase):
        return "(section)"
    return str(value)


def keys(cls: type = RunConfig, prefix: str = "") -> list[Key]:
    """Every leaf key of ``cls`` and its nested config sections, in field order."""
    hints = typing.get_type_hints(cls)
    docs = attribute_docs(cls)
    takes: dict[str, str] = {}
    with _recording(takes):
        default = cls()
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        name = f"{prefix}{f.name}"
        t = hints[f.name]
        if isinstance(t, type) and issubclass(t, ConfigBase):
            out.extend(keys(t, name + "."))
            continue
        out.append(Key(name=name, type=_type_name(t), default=_yaml(getattr(default, f.name)),
                       takes=takes.get(f.name, ""), doc=docs.get(f.name, "")))
    return out


def _md(text: str) -> str:
    """reStructuredText literals (double backquotes) as Markdown code."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _md(text).replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """``docs/config.md``: one table per top-level section."""
    parts = [HEADER]
    by_section: dict[str, list[Key]] = {}
    for k in keys():
        by_section.setdefault(k.name.split(".")[0], []).append(k)
    for section, ks in by_section.items():
        cls = typing.get_type_hints(RunConfig)[section]
        summary = (inspect.getdoc(cls) or "").split("\n\n")[0].replace("\n", " ")
        summary = "" if summary.startswith("Attributes:") else _md(summary)
        parts.append(f"\n## `{section}`\n\n" + (f"{textwrap.fill(summary, 88)}\n\n" if summary
                                                   else "") +
                     "| key | type | default | takes | description |\n|---|---|---|---|---|")
        for k in ks:
            parts.append(f"| `{k.name}` | {_cell(k.type)} | `{_cell(k.default)}` | "
                         f"{_cell(k.takes)} | {_cell(k.doc)} |")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = markdown()
    if argv:
        from jaxdrive.files import atomic_write_text

        atomic_write_text(argv[0], text)
        print(f"wrote {argv[0]} ({len(keys())} keys)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
