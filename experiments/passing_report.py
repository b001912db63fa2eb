"""The narrow-passing results table from ``python -m jaxdrive.eval --config eval/passing``
results files: per partner member, the ego's trial scores and deltas with 95% CIs, its
cache-wiped control, the oracle's and the memoryless baseline's trial-0 scores, and the
share of the oracle's advantage over trial 0 that the ego recovers by trial 1 and 2,
``(score_k - score_0) / (oracle_0 - score_0)``. Every delta is recomputed on the host
from the results' trial records (counted episodes) and must equal the evaluator's.

    python experiments/passing_report.py --ego EGO.json --oracle ORACLE.json \
        [--mlp MLP.json] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _load(path):
    """The ``evaluators`` of an ``eval`` results file; exits (code 2) naming the file when
    it is missing or not a results file."""
    try:
        with open(path) as f:
            data = json.load(f)
        evaluators = data["evaluators"]
        if not isinstance(evaluators, dict):
            raise TypeError("'evaluators' is not a mapping")
        return evaluators
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: {path}: not a results file of python -m jaxdrive.eval ({e}); pass "
              "the --out file of an eval/passing run", file=sys.stderr)
        raise SystemExit(2) from None


def _host_scores(ev, actor):
    """(S, K) trial scores of the counted episodes (start step 0) of ``actor``."""
    rows = sorted((t for t in ev["trials"] if t["actor"] == actor and t["start_step"] == 0),
                  key=lambda t: t["scenario_id"])
    return np.array([t["trial_score"] for t in rows], np.float64)


def member_row(ego, oracle, mlp=None) -> dict:
    """One partner member's numbers; raises if the evaluator's deltas differ from the
    host's."""
    m = ego["metrics"]
    for prefix, actor in (("", "memory"), ("control/", "no_memory")):
        s = _host_scores(ego, actor)
        for k in (1, 2):
            host = float(np.mean(s[:, k] - s[:, 0]))
            got = m[f"{prefix}ada_delta_trial_{k}_minus_0"]
            if abs(host - got) > 1e-6:
                raise ValueError(f"{prefix}delta {k}: evaluator {got} != host {host}")
    score = [m[f"trial_{k}_score"] for k in range(3)]
    oracle0 = oracle["metrics"]["trial_0_score"]
    gap = oracle0 - score[0]
    ci = lambda p, k: (m[f"{p}ada_delta_trial_{k}_minus_0"],
                       m[f"{p}ada_delta_trial_{k}_minus_0_ci_low"],
                       m[f"{p}ada_delta_trial_{k}_minus_0_ci_high"])
    row = {"scenarios": int(m["scenarios_scored"]), "trial_scores": score,
           "delta_1": ci("", 1), "delta_2": ci("", 2), "control_delta_1": ci("control/", 1),
           "control_delta_2": ci("control/", 2),
           "oracle_trial_scores": [oracle["metrics"][f"trial_{k}_score"] for k in range(3)],
           "oracle_share_1": (score[1] - score[0]) / gap if gap > 0 else float("nan"),
           "oracle_share_2": (score[2] - score[0]) / gap if gap > 0 else float("nan")}
    if mlp is not None:
        row["mlp_trial_scores"] = [mlp["metrics"][f"trial_{k}_score"] for k in range(3)]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ego", required=True)
    p.add_argument("--oracle", required=True)
    p.add_argument("--mlp")
    p.add_argument("--json")
    args = p.parse_args()
    ego, oracle = _load(args.ego), _load(args.oracle)
    mlp = _load(args.mlp) if args.mlp else {}
    rows = {name: member_row(ev, oracle[name], mlp.get(name)) for name, ev in ego.items()
            if name in oracle}
    f = lambda t: f"{t[0]:+.3f} [{t[1]:+.3f}, {t[2]:+.3f}]"
    print("| partner | trial scores 0 / 1 / 2 | delta 1 - 0 [95% CI] | delta 2 - 0 [95% CI] "
          "| control delta 1 - 0 | oracle trial 0 | MLP trial 0 | share of oracle's "
          "advantage by trial 1 / 2 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        mlp0 = f"{r['mlp_trial_scores'][0]:.3f}" if "mlp_trial_scores" in r else "-"
        print(f"| {name} | {' / '.join(f'{x:.3f}' for x in r['trial_scores'])} | "
              f"{f(r['delta_1'])} | {f(r['delta_2'])} | {f(r['control_delta_1'])} | "
              f"{r['oracle_trial_scores'][0]:.3f} | {mlp0} | "
              f"{r['oracle_share_1']:.2f} / {r['oracle_share_2']:.2f} |")
    print("every delta equals the host's recomputation from the trial records")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
