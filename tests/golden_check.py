"""Comparison of a golden case with its recorded file (used by the test_golden_* modules)."""

from __future__ import annotations

import os

import golden_cases
import numpy as np
import pytest

# Places where merging duplicated code legitimately reorders a floating-point sum; each
# is named with the tolerance it needs (none so far: every array is bit-identical).
TOLERANCES: dict[str, float] = {}
# On a machine unlike the recording one (``golden_cases.machine``: another CPU vendor or
# generation, or jax version) XLA emits other vector code, so float sums round
# differently: the goldens recorded on this workplace's AMD machines differ by at most
# 1.1e-6 on its Intel ones, the model goldens by at most 9.5e-7 between two AMD
# generations. There floats must agree to this relative / absolute tolerance; integers
# and booleans (sampled actions, events, counts) still exactly.
OTHER_MACHINE_RTOL = 1e-5
OTHER_MACHINE_ATOL = 1e-5


def same_machine(name: str) -> bool:
    """Whether case ``name`` was recorded on a machine like this one: every key of
    ``golden_cases.machine()`` equal (a record missing a key counts as another machine)."""
    recorded = golden_cases.recorded_machines().get(name, {})
    return all(recorded.get(k) == v for k, v in golden_cases.machine().items())


def check_case(name: str) -> None:
    """Recompute case ``name`` and require every array to equal the recorded one bit for
    bit (same names, shapes, dtypes and bytes; NaNs equal NaNs). On a machine unlike the
    recording one (``same_machine``), floats within ``OTHER_MACHINE_RTOL`` /
    ``OTHER_MACHINE_ATOL`` instead; everything else still bit for bit."""
    exact = same_machine(name)
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
        if not exact and g.dtype.kind in "fc":
            if not np.allclose(g, w, rtol=OTHER_MACHINE_RTOL, atol=OTHER_MACHINE_ATOL,
                               equal_nan=True):
                err = np.abs(g.astype(np.float64) - w)
                bad.append(f"{key}: max |diff| {np.nanmax(err):.3g} beyond the other-machine "
                           f"tolerance (rtol {OTHER_MACHINE_RTOL}, atol {OTHER_MACHINE_ATOL})")
        elif tol is not None:
            if not np.allclose(g, w, rtol=0.0, atol=tol, equal_nan=True):
                bad.append(f"{key}: max |diff| {np.nanmax(np.abs(g - w)):.3g} > {tol}")
        elif not np.array_equal(g, w, equal_nan=g.dtype.kind in "fc"):
            where = np.argwhere(~((g == w) | ((g != g) & (w != w))))
            diff = ""
            if g.dtype.kind in "fc":
                diff = f", max |diff| {np.nanmax(np.abs(g.astype(np.float64) - w)):.3g}"
            bad.append(f"{key}: {len(where)} entries differ (first at {where[0].tolist()}"
                       f"{diff})")
    where_run = "" if exact else (
        f" (compared with tolerance: recorded on {golden_cases.recorded_machines()[name]}, "
        f"running on {golden_cases.machine()})")
    assert not bad, f"{name}{where_run}: " + "; ".join(bad)
