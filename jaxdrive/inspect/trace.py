"""The per-step event trace of an ``EpisodeProbe`` as text, and its summary.

One line per step on which something happened to a controlled agent: a goal reached, a
collision or off-road starting, a removal (the agent's next observation is removed, so
its memory marks that step garbage), and the end of a trial (by timeout or because every
controlled agent was removed) or of the episode.
"""

from __future__ import annotations

import numpy as np

from jaxdrive.inspect.probe import EpisodeProbe


def _onsets(flags: np.ndarray) -> np.ndarray:
    """(T, A) bool -> (T, A) bool: true where a flag turns on (or is on at step 0)."""
    before = np.concatenate([np.zeros_like(flags[:1]), flags[:-1]])
    return flags & ~before


def _who(probe: EpisodeProbe, i: int) -> str:
    role = "ego" if probe.ego[i] else "co-player"
    tags = [role] + (["sdc"] if probe.sdc[i] else []) + (["inspected"] if i == probe.agent
                                                       else [])
    return f"agent {i} ({', '.join(tags)})"


def trial_lengths(probe: EpisodeProbe) -> list[int]:
    """Steps each trial lasted (the last one possibly cut by the end of the recording)."""
    out = []
    for k in range(int(probe.trial.max()) + 1 if probe.num_steps else 0):
        out.append(int(np.sum(probe.trial == k)))
    return out


def event_lines(probe: EpisodeProbe, trial_length: int) -> list[str]:
    """The trace, one line per step with events (``trial_length``: the trial timeout in
    steps, to tell a timeout from an early end)."""
    c = probe.controlled
    goal = _onsets(probe.goal_reached) & c
    hit = _onsets(probe.collided) & c
    off = _onsets(probe.offroad) & c
    # Removed in observation t+1 but not in t; a trial restart clears removals.
    nxt = np.concatenate([probe.removed[1:], np.zeros_like(probe.removed[:1])])
    removal = nxt & ~probe.removed & c & ~probe.trial_done[:, None]
    lines = []
    for t in range(probe.num_steps):
        events = []
        for name, flags in (("goal reached", goal), ("collision", hit), ("off-road", off),
                            ("removed", removal)):
            events += [f"{_who(probe, i)}: {name}" for i in np.flatnonzero(flags[t])]
        if probe.trial_done[t]:
            k = int(probe.trial[t])
            why = ("timeout" if probe.trial_step[t] + 1 >= trial_length
                   else "every controlled agent removed")
            events.append(f"trial {k} ended after {int(probe.trial_step[t]) + 1} steps "
                          f"({why})")
        if probe.episode_done[t]:
            events.append("episode ended")
        if events:
            lines.append(f"step {t:4d}  trial {int(probe.trial[t])}  "
                         f"t_in_trial {int(probe.trial_step[t]):4d}  | " + "; ".join(events))
    return lines


def summary_lines(probe: EpisodeProbe) -> list[str]:
    """A few lines: steps and trials, goals per trial of the ego agents, collisions,
    off-road onsets and the inspected agent's removed (garbage) steps."""
    c, ego = probe.controlled, probe.ego & probe.controlled
    goal = _onsets(probe.goal_reached)
    lines = [f"steps: {probe.num_steps}, trials: {len(trial_lengths(probe))} "
             f"(lengths {trial_lengths(probe)}), episode finished: "
             f"{bool(probe.episode_done.any())}",
             f"controlled agents: {int(c.sum())} ({int(ego.sum())} ego), inspected: "
             f"{_who(probe, probe.agent)}"]
    per_trial = [int(np.sum(goal[probe.trial == k][:, ego]))
                 for k in range(len(trial_lengths(probe)))]
    lines.append(f"ego goals per trial: {per_trial}")
    lines.append(f"collisions: {int(np.sum(_onsets(probe.collided)[:, c]))}, off-road: "
                 f"{int(np.sum(_onsets(probe.offroad)[:, c]))}")
    a = probe.agent
    lines.append(f"inspected agent removed (garbage) steps: {int(probe.removed[:, a].sum())}")
    if probe.has_memory:
        held = probe.slot_pos[-1] >= 0
        lines.append(f"cache at the last step: {int(held.sum())} of {held.size} slots held, "
                     f"{int((held & probe.slot_garbage[-1]).sum())} garbage")
    return lines


def trace_text(probe: EpisodeProbe, trial_length: int, header: list[str]) -> str:
    """The whole trace file: ``header`` lines, the summary, then the per-step events."""
    body = event_lines(probe, trial_length) or ["(no events)"]
    return "\n".join([*header, "", "summary:", *("  " + s for s in summary_lines(probe)),
                      "", "events:", *body]) + "\n"
