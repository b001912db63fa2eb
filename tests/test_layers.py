"""The package's imports read top to bottom: no cycles, no import against the layer order.

Reads every module's imports from its source (AST; function-level imports included,
``if TYPE_CHECKING:`` blocks left out) and checks them against ``LAYERS``. A module may
import from its own package or from a lower layer, never from a higher layer or from
another package of its own layer. Command-line modules (``cli``, ``__main__``) are edges:
they sit above every layer.
"""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "jaxdrive")

# Lowest first. Each entry is a top-level module or package of jaxdrive.
LAYERS = (
    # atomic writes and safe names; the data mesh; multi-process setup; the compile cache
    ("files", "parallel", "distributed", "signals", "compile_cache"),
    ("command",),  # how every command line ends (stops, unexpected errors, --debug)
    # shared pytrees, config plumbing, box/segment math, k-nearest selection
    ("types", "config", "geometry", "selection"),
    ("resources",),  # host-memory estimates checked before the work
    ("scenarios",),  # procedural generator, scenario shapes, road index, device pool
    ("data",),  # host readers of real scenes (WOMD, JSON), shards, datasets
    ("sim",),  # dynamics models, multi-trial bookkeeping
    ("metrics",),  # per-step metrics and their reductions
    ("env",),  # observations, rewards, the Env composing the simulator
    ("models",),  # policies: encoders, KV cache, heads
    ("agents",),  # controllers, actors, rollouts
    ("render",),  # on-device raster, recordings, video
    ("telemetry",),  # EMA statistics, writers
    ("runs",),  # run config, checkpoints, load_policy
    ("eval",),  # evaluators, suites, results
    ("train",),  # PPO, the training loop
    ("bench", "simulate", "autotune", "inspect"),  # command-line edges
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(PACKAGE_DIR))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _modules() -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(PACKAGE_DIR):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                out[_module_name(path)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, source: str) -> list[tuple[str, int]]:
    """(imported jaxdrive module, line) pairs; ``from pkg import sub`` names the
    submodule when ``sub`` is one."""
    tree = ast.parse(source)
    package = module if MODULES[module].endswith("__init__.py") else module.rpartition(".")[0]
    found = []

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - child.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    found.append((sub if sub in MODULES else base, child.lineno))
            visit(child)

    visit(tree)
    return [(m, line) for m, line in found if m == "jaxdrive" or m.startswith("jaxdrive.")]


def _graph() -> dict[str, list[tuple[str, int]]]:
    graph = {}
    for module, path in MODULES.items():
        with open(path) as f:
            graph[module] = _imports(module, f.read())
    return graph


EDGE = "<command line>"
RANK[EDGE] = len(LAYERS)


def _top(module: str) -> str | None:
    """The layer name of a module: its top-level package, or the edge for a CLI."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    if parts[-1] in ("cli", "__main__"):
        return EDGE
    return parts[1]


def layer_violations(graph) -> list[str]:
    bad = []
    for module, imports in graph.items():
        src = _top(module)
        if src is None:
            continue
        if src not in RANK:
            bad.append(f"{module}: package '{src}' has no layer in LAYERS")
            continue
        for target, line in imports:
            dst = _top(target)
            if dst is None or dst == src:
                continue
            if dst not in RANK:
                bad.append(f"{module}:{line} imports {target}, which has no layer")
            elif RANK[dst] >= RANK[src]:
                bad.append(f"{module}:{line} imports {target}: '{dst}' is not below '{src}'")
    return bad


def cycles(graph) -> list[list[str]]:
    """Every import cycle found by depth-first search (each reported once)."""
    edges = {m: sorted({t for t, _ in imps if t in graph and t != m})
             for m, imps in graph.items()}
    state, stack, found = {}, [], []

    def dfs(m):
        state[m] = 1
        stack.append(m)
        for t in edges[m]:
            if state.get(t) == 1:
                found.append(stack[stack.index(t):] + [t])
            elif t not in state:
                dfs(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            dfs(m)
    return found


def test_every_import_goes_down_the_layers():
    bad = layer_violations(_graph())
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_no_import_cycles():
    found = cycles(_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


@pytest.mark.parametrize("source, expect", [
    # An upward import (the simulator importing the trainer) is caught...
    ("from jaxdrive.train.ppo import PPO\n", "'train' is not below 'sim'"),
    # ... also when hidden in a function ...
    ("def f():\n    from jaxdrive.eval import evaluator\n", "'eval' is not below 'sim'"),
    # ... but not under TYPE_CHECKING, and not an import from a lower layer.
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from jaxdrive.models.policy import Policy\n", None),
    ("from jaxdrive.scenarios.pool import ScenarioPool\n", None),
])
def test_the_checker_catches_upward_imports(source, expect):
    graph = _graph()
    graph["jaxdrive.sim.dynamics"] = _imports("jaxdrive.sim.dynamics", source)
    bad = [b for b in layer_violations(graph) if b.startswith("jaxdrive.sim.dynamics")]
    if expect is None:
        assert not bad
    else:
        assert any(expect in b for b in bad), bad


def test_the_checker_catches_cycles():
    graph = {"jaxdrive.a": [("jaxdrive.b", 1)], "jaxdrive.b": [("jaxdrive.c", 1)],
             "jaxdrive.c": [("jaxdrive.a", 3)], "jaxdrive.d": [("jaxdrive.a", 1)]}
    assert cycles(graph) == [["jaxdrive.a", "jaxdrive.b", "jaxdrive.c", "jaxdrive.a"]]
