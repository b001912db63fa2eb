"""Tiny scene sizes shared by the evaluation and command-line tests.

The procedural scene generator and the road index are compiled once per scenario,
procedural and road-index config (and scene count); modules that use these same settings
get them from the persistent compilation cache that the xdist workers share instead of
compiling them again.
"""

SCENARIO = {"max_agents": 4, "num_steps": 40}
ROAD_INDEX = {"road_per_cell": 20, "grid_size": 8}
OBSERVATION = {"num_partners": 3, "num_road": 20}
PROCEDURAL = {"num_agents": [2, 4], "topology": {"straight": 1.0, "curve": 0.0,
                                                 "t_junction": 0.0, "intersection": 0.0}}
NUM_SCENES = 5


def cli_overrides(procedural: dict | None = None) -> list[str]:
    """``--set KEY=VALUE`` arguments selecting the tiny sizes (``procedural``: keys that
    replace the shared procedural settings)."""
    out = []
    flat = {**{f"env.scenario.{k}": v for k, v in SCENARIO.items()},
            **{f"env.road_index.{k}": v for k, v in ROAD_INDEX.items()},
            **{f"env.observation.{k}": v for k, v in OBSERVATION.items()},
            "procedural.num_agents": PROCEDURAL["num_agents"],
            **{f"procedural.topology.{k}": v for k, v in PROCEDURAL["topology"].items()},
            **{f"procedural.{k}": v for k, v in (procedural or {}).items()}}
    for k, v in flat.items():
        out += ["--set", f"{k}={v}"]
    return out
