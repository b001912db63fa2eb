"""The environment layer: config, state and time-step pytrees, observations, rewards and
the ``Env`` that composes the simulator's functions into ``reset`` / ``step``.

- ``config``: ``EnvConfig`` (shapes, behaviours, model choices; validated).
- ``state``: ``EnvParams`` (traced: the scenario pool, reward weights), ``EnvState``,
  ``TimeStep``, ``EpisodeStats``.
- ``observation``: ego-frame observations (``observe``).
- ``rewards``: rewards derived from the step's metrics.
- ``environment``: ``Env`` (reset, step, batched step with auto-reset).
"""

from jaxdrive.env.config import COLLISION_BEHAVIORS, CONTROL_MODES, GOAL_BEHAVIORS, EnvConfig
from jaxdrive.env.environment import REMOVED_XY, Env, episode_steps
from jaxdrive.env.state import EnvParams, EnvState, StepInfo, TimeStep
from jaxdrive.metrics.episode import EpisodeStats

__all__ = ["COLLISION_BEHAVIORS", "CONTROL_MODES", "GOAL_BEHAVIORS", "REMOVED_XY", "Env",
           "EnvConfig", "EnvParams", "EnvState", "EpisodeStats", "StepInfo", "TimeStep",
           "episode_steps"]
