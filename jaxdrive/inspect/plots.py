"""PNG plots of an ``EpisodeProbe``: attention over the memory, and the cache's slots.

Drawn with matplotlib's object API on the Agg canvas (no display, no global pyplot
state). See ``docs/inspect.md`` for how to read them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from jaxdrive.files import atomic_open
from jaxdrive.inspect.probe import EpisodeProbe, attendable, by_position

# Slot states in the cache-occupancy image.
EMPTY, HELD, GARBAGE, OWN = 0, 1, 2, 3
SLOT_COLORS = ("#f2f2f2", "#4c72b0", "#d62728", "#f5b800")
SLOT_NAMES = ("empty", "held (attendable)", "garbage (written while removed)",
              "this step's own slot")
GARBAGE_RGBA = (0.84, 0.15, 0.16, 1.0)


def trial_starts(probe: EpisodeProbe) -> list[int]:
    """Steps that start trial 1, 2, ... (the step after each trial end)."""
    return [t for t in range(1, probe.num_steps) if probe.trial[t] != probe.trial[t - 1]]


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return path


def _mark_trials(ax, starts: list[int], both_axes: bool) -> None:
    for t in starts:
        ax.axvline(t - 0.5, color="black", lw=1.0, ls="--")
        if both_axes:
            ax.axhline(t - 0.5, color="black", lw=1.0, ls="--")


def plot_attention(probe: EpisodeProbe, path: Path) -> Path:
    """Heat maps query step x key step of the inspected agent's attention, one row per
    decoder layer: the mean over heads, then each head. Grey: no slot holds that step;
    red: garbage keys (exactly 0 weight); dashed lines: trial boundaries."""
    weights, garbage = by_position(probe)
    t_len, layers, heads, _ = weights.shape
    cols = heads + 1 if heads > 1 else 1
    fig = Figure(figsize=(3.6 * cols + 1.0, 3.4 * layers + 0.6), layout="constrained")
    axes = fig.subplots(layers, cols, squeeze=False)
    starts = trial_starts(probe)
    overlay = np.zeros((t_len, t_len, 4), np.float32)
    overlay[garbage] = GARBAGE_RGBA
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")
    for layer in range(layers):
        # Every head holds the same keys, so a plain mean keeps NaN where none is held.
        panels = [("mean over heads", weights[:, layer].mean(axis=1))] if heads > 1 else []
        panels += [(f"head {h}", weights[:, layer, h]) for h in range(heads)]
        for col, (name, w) in enumerate(panels):
            ax = axes[layer, col]
            im = ax.imshow(np.ma.masked_invalid(w), cmap=cmap, vmin=0.0,
                           vmax=max(float(np.nanmax(w)) if np.isfinite(w).any() else 1.0,
                                    1e-6),
                           origin="upper", interpolation="nearest", aspect="auto")
            ax.imshow(overlay, origin="upper", interpolation="nearest", aspect="auto")
            _mark_trials(ax, starts, both_axes=True)
            ax.set_title(f"layer {layer}, {name}", fontsize=9)
            ax.set_xlabel("key: episode step in memory")
            if col == 0:
                ax.set_ylabel("query: episode step")
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    fig.legend(handles=[Patch(color=GARBAGE_RGBA, label="garbage key (weight 0)"),
                        Patch(color="#d9d9d9", label="not in memory"),
                        Patch(fill=False, ls="--", label="trial boundary")],
               loc="outside lower center", ncol=3, fontsize=8)
    fig.suptitle(f"temporal-decoder attention of agent {probe.agent} over its memory",
                 fontsize=10)
    return _save(fig, path)


def slot_states(probe: EpisodeProbe) -> np.ndarray:
    """(T, S) int: ``EMPTY``, ``HELD``, ``GARBAGE`` or ``OWN`` for every slot after
    each step's write."""
    pos, garbage = probe.slot_pos, probe.slot_garbage
    states = np.where(pos < 0, EMPTY, np.where(garbage, GARBAGE, HELD))
    return np.where(pos == probe.query_pos[:, None], OWN, states)


def plot_cache(probe: EpisodeProbe, path: Path) -> Path:
    """Cache occupancy of the inspected agent: held, attendable and garbage slot counts
    per step (top; shaded: steps the agent was removed), and every slot's state per step
    (bottom)."""
    states = slot_states(probe)
    horizon = states.shape[1]
    t = np.arange(probe.num_steps)
    can = attendable(probe.slot_pos, probe.slot_garbage, probe.query_pos, horizon)
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(1, 1.4))
    top.plot(t, (states != EMPTY).sum(axis=1), label="held slots", color="#4c72b0")
    top.plot(t, can.sum(axis=1), label="attendable slots", color="#2ca02c", ls=":")
    top.plot(t, (states == GARBAGE).sum(axis=1), label="garbage slots", color="#d62728")
    removed = probe.removed[:, probe.agent]
    for s in np.flatnonzero(removed):
        top.axvspan(s - 0.5, s + 0.5, color="#d62728", alpha=0.12, lw=0)
    _mark_trials(top, trial_starts(probe), both_axes=False)
    top.set_ylabel("slots")
    top.set_ylim(0, horizon + 1)
    top.legend(fontsize=8, loc="upper left")
    top.set_title(f"KV cache of agent {probe.agent} (horizon {horizon} slots); shaded: "
                  "steps observed while removed", fontsize=10)
    bottom.imshow(states.T, cmap=ListedColormap(SLOT_COLORS), vmin=-0.5, vmax=3.5,
                  origin="lower", interpolation="nearest", aspect="auto")
    _mark_trials(bottom, trial_starts(probe), both_axes=False)
    bottom.set_xlabel("episode step")
    bottom.set_ylabel("cache slot")
    fig.legend(handles=[Patch(color=c, label=n) for c, n in
                        zip(SLOT_COLORS, SLOT_NAMES, strict=True)],
               loc="outside lower center", ncol=4, fontsize=8)
    return _save(fig, path)
