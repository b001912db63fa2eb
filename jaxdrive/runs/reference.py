"""The config reference: every key of a training run's config, generated from the
config dataclasses themselves (``RunConfig`` and the sections nested in it).

For each key: its dotted name, its type (the field's annotation), its default, what
values it takes, and its description (the ``Attributes:`` entry of its class's
docstring). The values come from the checks the class's ``__post_init__`` runs on its
defaults (``check_choice``, ``check_int``, ``check_range``, ``check_interval``),
recorded while the default is built (``jaxdrive.config.recorded_checks``), so the
reference says what the code enforces, not what someone remembered to write.
``docs/config.md`` is this module's output; ``tests/test_config_reference.py`` fails
when the two differ.

    python -m jaxdrive.runs.reference [OUT.md]     # default: print to stdout
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import textwrap
import typing

from jaxdrive.config import ConfigBase, local_path_arg, recorded_checks
from jaxdrive.files import atomic_write_text, check_writable_file
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


def _takes(events: list[tuple]) -> dict[str, str]:
    """``recorded_checks`` events -> {field name: what its first check enforces}."""
    def fmt(x):
        return f"{x:g}" if isinstance(x, float) else str(x)

    out: dict[str, str] = {}
    for name, kind, *what in events:
        field = name.split("[")[0].split(".")[-1]  # "topology.curve", "interval[0]"
        if kind == "choice":
            words = ", ".join(f"`{a}`" for a in what[0])
        else:
            lo, hi, lo_open, hi_open = what
            if lo is None and hi is None:
                continue
            if hi is None:
                words = f"{kind} {'>' if lo_open else '>='} {fmt(lo)}"
            elif lo is None:
                words = f"{kind} {'<' if hi_open else '<='} {fmt(hi)}"
            else:
                words = (f"{kind} in {'(' if lo_open else '['}{fmt(lo)}, {fmt(hi)}"
                         f"{')' if hi_open else ']'}")
        out.setdefault(field, words)
    return out


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
    with recorded_checks() as events:
        default = cls()
    takes = _takes(events)
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


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m jaxdrive.runs.reference",
                                description="Write the config reference (docs/config.md).")
    p.add_argument("out", nargs="?", type=local_path_arg, help="the Markdown file to write "
                   "(default: print it)")
    a = p.parse_args(argv)
    text = markdown()
    if a.out is None:
        sys.stdout.write(text)
        return 0
    try:
        atomic_write_text(check_writable_file(a.out), text)
    except OSError as e:  # OutputError included
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out} ({len(keys())} keys)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m jaxdrive.runs.reference``; returns the exit code."""
    from jaxdrive.command import run_command

    return run_command(_main, "runs.reference", argv, compilation_cache=False)


if __name__ == "__main__":
    raise SystemExit(main())
