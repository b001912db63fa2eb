"""``EnvConfig``: everything static about an environment (shapes, behaviours, models)."""

from __future__ import annotations

import dataclasses

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_choice,
    check_int,
    check_interval,
    check_range,
)
from jaxdrive.env.observation import ObservationConfig
from jaxdrive.env.rewards import RewardConfig
from jaxdrive.scenarios.base import ScenarioConfig
from jaxdrive.scenarios.road_index import RoadIndexConfig
from jaxdrive.sim.behaviors import COLLISION_BEHAVIORS, GOAL_BEHAVIORS, OFFROAD_BEHAVIORS
from jaxdrive.sim.dynamics import DynamicsConfig
from jaxdrive.types import ObjectType

CONTROL_MODES = ("all", "sdc", "fraction")
OBJECT_TYPE_NAMES = {t.name.lower(): int(t) for t in ObjectType if t != ObjectType.UNSET}


@dataclasses.dataclass(frozen=True)
class EnvConfig(ConfigBase):
    """Everything static about an environment (shapes, behaviours, model choices).

    Attributes:
      scenario, dynamics, observation, reward, road_index: per-concern configs.
      control_mode: ``all`` valid objects of ``controlled_types`` (self-play); ``sdc``
        only the self-driving car (everyone else replays the log); ``fraction`` each
        controllable object with probability ``controlled_fraction`` (the SDC always).
        Objects that start within ``goal_radius`` of their goal are never controlled.
      controlled_fraction: with ``control_mode: fraction``, the probability that each
        controllable object (but the SDC, always controlled) is controlled.
      controlled_types: object types the policy may drive (``vehicle``, ``pedestrian``,
        ``cyclist``, ``other``).
      collision_behavior: ``ignore`` (only counted), ``stop`` (the agent freezes in place
        and terminates), ``remove`` (the agent leaves the scene and terminates).
      offroad_behavior: ``ignore`` (an off-road step is only counted and paid for) or
        ``collision`` (it also ends the agent as a collision does, per
        ``collision_behavior``; metrics still count it as off-road, not as a collision).
      goal_behavior: ``respawn`` (back to its initial pose, same goal), ``new_goal`` (a new
        goal on a lane ahead), ``stop`` (freezes at the goal and terminates), ``remove``
        (leaves the scene at the goal and terminates, as GPUDrive removes finished
        vehicles: no frozen obstacle where a log ends mid-lane), ``trial``
        (removed until the trial ends; multi-trial episodes, see the module doc).
      num_trials: K, trials per episode under ``trial`` (1 = an ordinary episode).
      trial_timeout: steps per trial under ``trial``; ``None`` = ``episode_length``
        (default the rest of the log).
      co_player_fraction: each controlled agent but one (the SDC if controlled, else the
        first) is a co-player (``Role.CO_PLAYER``, driven by a frozen partner policy and
        never scored) with this probability; the rest are ego agents.
      goal_radius: metres from the goal that count as reaching it.
      new_goal_distance: [low, high] metres for ``new_goal`` sampling.
      init_step: logged step at which episodes start (10 = 1.1 s of history in WOMD).
      episode_length: steps per episode; ``None`` = the rest of the log
        (``num_steps - 1 - init_step``).
      static_threshold: a non-controlled object that moves less than this many metres
        over the episode in its log (and starts slower than this in m/s) is held
        static instead of replayed.
      max_controlled: C, agent rows per environment: the controlled agents it steps,
        observes and rewards (``None``: one row per object slot, ``scenario.max_agents``).
        With C rows, the SDC and then the other controlled objects in slot order take
        the rows; every other object (experts, static objects, and controllable objects
        beyond C, which replay their log) stays in the scene as background that the
        rows see as partners and collide with, at no observation cost. Real scenes keep
        all their objects (``max_agents`` 128) while paying for the few that drive.
    """

    scenario: ScenarioConfig = ScenarioConfig()
    dynamics: DynamicsConfig = DynamicsConfig()
    observation: ObservationConfig = ObservationConfig()
    reward: RewardConfig = RewardConfig()
    road_index: RoadIndexConfig = RoadIndexConfig()
    control_mode: str = "all"
    controlled_fraction: float = 0.5
    controlled_types: tuple[str, ...] = ("vehicle",)
    collision_behavior: str = "ignore"
    offroad_behavior: str = "ignore"
    goal_behavior: str = "stop"
    num_trials: int = 1
    trial_timeout: int | None = None
    co_player_fraction: float = 0.0
    goal_radius: float = 2.0
    new_goal_distance: tuple[float, float] = (10.0, 60.0)
    init_step: int = 10
    episode_length: int | None = None
    static_threshold: float = 0.5
    max_controlled: int | None = None

    def __post_init__(self):
        check_choice("control_mode", self.control_mode, CONTROL_MODES)
        check_range("controlled_fraction", self.controlled_fraction, 0.0, 1.0)
        if not isinstance(self.controlled_types, tuple) or not self.controlled_types:
            raise ConfigError(
                "config key 'controlled_types' must be a non-empty list of object types, "
                f"e.g. [vehicle]; got {self.controlled_types!r}."
            )
        for name in self.controlled_types:
            check_choice("controlled_types", name, tuple(OBJECT_TYPE_NAMES))
        check_choice("collision_behavior", self.collision_behavior, COLLISION_BEHAVIORS)
        check_choice("offroad_behavior", self.offroad_behavior, OFFROAD_BEHAVIORS)
        check_choice("goal_behavior", self.goal_behavior, GOAL_BEHAVIORS)
        check_range("goal_radius", self.goal_radius, 0.0, None, lo_open=True)
        check_interval("new_goal_distance", self.new_goal_distance, 0.0, None)
        check_range("static_threshold", self.static_threshold, 0.0, None)
        t = self.scenario.num_steps
        check_int("init_step", self.init_step, 0, t - 2)
        if self.episode_length is not None:
            check_int("episode_length", self.episode_length, 1, t - 1 - self.init_step)
        check_int("num_trials", self.num_trials, 1, 1024)
        check_range("co_player_fraction", self.co_player_fraction, 0.0, 1.0)
        if self.max_controlled is not None:
            check_int("max_controlled", self.max_controlled, 1, self.scenario.max_agents)
        if self.trial_timeout is not None:
            check_int("trial_timeout", self.trial_timeout, 1, t - 1 - self.init_step)
        if self.goal_behavior != "trial" and (self.num_trials != 1
                                              or self.trial_timeout is not None):
            raise ConfigError(
                "config keys 'num_trials' / 'trial_timeout' only apply with "
                f"goal_behavior: trial (got goal_behavior: {self.goal_behavior}); set "
                "goal_behavior: trial or remove them."
            )
        # Zero road slots leave the policy's road tokens empty (a division by zero in
        # the model); one is the least that works.
        check_int("observation.num_road", self.observation.num_road, 1, None)
        if self.observation.num_road > self.road_index.road_per_cell:
            raise ConfigError(
                f"config key 'observation.num_road' = {self.observation.num_road} exceeds "
                f"'road_index.road_per_cell' = {self.road_index.road_per_cell}; raise "
                "road_per_cell or lower num_road."
            )

    def describe_rows(self) -> str:
        """The agent rows per env in words: '16 agent rows (128 object slots)' with packed
        rows (``max_controlled``), else '128 agent slots'."""
        slots = self.scenario.max_agents
        if self.max_controlled is None:
            return f"{slots} agent slots"
        return f"{self.max_controlled} agent rows ({slots} object slots)"

    @property
    def num_rows(self) -> int:
        """C: agent rows per environment (``max_controlled``, else ``scenario.max_agents``)."""
        return (self.scenario.max_agents if self.max_controlled is None
                else self.max_controlled)

    @property
    def num_episode_steps(self) -> int:
        """() int: steps per episode: ``episode_length``, else the rest of the log after
        ``init_step`` (``scenario.num_steps - 1 - init_step``)."""
        if self.episode_length is not None:
            return self.episode_length
        return self.scenario.num_steps - 1 - self.init_step

    @property
    def trial_length(self) -> int:
        """Steps per trial before the timeout (the episode length outside trial mode)."""
        return self.trial_timeout if self.trial_timeout is not None else self.num_episode_steps
