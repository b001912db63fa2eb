"""Comparison of a golden case with its recorded file (used by the test_golden_* modules)."""

from __future__ import annotations

import os

import golden_cases
import numpy as np
import pytest

# Places where merging duplicated code legitimately reorders a floating-point sum; each
# is named with the tolerance it needs (none so far: every array is bit-identical).
TOLERANCES: dict[str, float] = {}


def check_case(name: str) -> None:
    """Recompute case ``name`` and require every array to equal the recorded one bit for
    bit (same names, shapes, dtypes and bytes; NaNs equal NaNs)."""
    path = golden_cases.path(name)
    if not os.path.exists(path):
        pytest.fail(f"golden file {path} is missing; record it with "
                    f"python tests/golden_cases.py {name}")
    want = dict(np.load(path))
    got = golden_cases.all_cases()[name]()
    assert sorted(got) == sorted(want), (
        f"{name}: arrays differ in names: missing {sorted(set(want) - set(got))}, "
        f"new {sorted(set(got) - set(want))}")
    bad = []
    for key in sorted(want):
        w, g = want[key], np.asarray(got[key])
        if w.shape != g.shape or w.dtype != g.dtype:
            bad.append(f"{key}: {g.dtype}{g.shape} != recorded {w.dtype}{w.shape}")
            continue
        tol = TOLERANCES.get(f"{name}:{key}")
        if tol is not None:
            if not np.allclose(g, w, rtol=0.0, atol=tol, equal_nan=True):
                bad.append(f"{key}: max |diff| {np.nanmax(np.abs(g - w)):.3g} > {tol}")
        elif not np.array_equal(g, w, equal_nan=g.dtype.kind in "fc"):
            where = np.argwhere(~((g == w) | ((g != g) & (w != w))))
            diff = ""
            if g.dtype.kind in "fc":
                diff = f", max |diff| {np.nanmax(np.abs(g.astype(np.float64) - w)):.3g}"
            bad.append(f"{key}: {len(where)} entries differ (first at {where[0].tolist()}"
                       f"{diff})")
    assert not bad, f"{name}: " + "; ".join(bad)
