"""Configuration of a training run: one YAML file, one section per concern.

    env:         EnvConfig keys (jaxdrive.env)
    procedural:  ProceduralConfig keys (the training and validation scenes)
    policy:      PolicyConfig keys (jaxdrive.models.policy)
    train:       TrainConfig (PPO and run length)
    validation:  ValidationConfig (periodic held-out rollouts)
    checkpoint:  CheckpointConfig
    logging:     LoggingConfig (console, metrics.jsonl, wandb)
    video:       VideoConfig (jaxdrive.render.record; videos every ``video.every``
                 iterations into RUN_DIR/videos/train/VIEW/, logged to wandb)
    evaluation:  EvaluationConfig (evaluator suites run during training, jaxdrive.eval)
    data:        DataConfig (train on converted real scenes instead of procedural ones)

Files may ``inherits:`` other files (``jaxdrive.config.load_yaml``) and spell nested keys
as dotted paths (``env.collision_behavior: remove``, also inside a section, as in
``eval:`` sections); a preset name
(``quickstart``, ``selfplay_gpu``, ...; ``jaxdrive.config.list_presets``) names a file
shipped with the package; ``--set a.b=c`` overrides any key. Unknown keys are errors
that name the key and the allowed ones; so are values of the wrong type, NaN or inf,
path keys that are not strings, and names that would leave their directory
(``logging.run_name``). An empty config file is an error (write ``{}`` to mean all
defaults, or give no ``--config``); one string for a list key is a list of one.
"""

from __future__ import annotations

import dataclasses

from jaxdrive.config import (
    ConfigBase,
    ConfigError,
    check_choice,
    check_int,
    check_name,
    check_path,
    check_range,
    expand_dotted,
    load_yaml,
    merge,
    resolve_config_path,
)
from jaxdrive.env import EnvConfig
from jaxdrive.models.policy import PolicyConfig
from jaxdrive.render.record import VideoConfig
from jaxdrive.scenarios.procedural import ProceduralConfig

LR_SCHEDULES = ("constant", "linear")
SUBPROCESS_DEVICES = ("cpu", "same")  # EvaluationConfig.subprocess_device


@dataclasses.dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """PPO and the length of the run.

    Attributes:
      seed: seeds the training scenes, the initial parameters and every sample.
      total_steps: agent-steps to train for (env steps x agent slots); the run stops at
        the first iteration boundary at or past it.
      num_scenes: procedural scenes in the training pool.
      num_envs: B, parallel environments (each with ``scenario.max_agents`` slots).
      rollout_steps: T, steps per environment per iteration (the PPO segment length).
      epochs: PPO passes over each rollout.
      minibatches: per epoch; agent rows (B x A) are split into this many groups of
        whole (T,) sequences, so B x A must be divisible by it.
      learning_rate: Adam step size; ``lr_schedule`` ``linear`` decays it to 0.
      max_grad_norm: global gradient-norm clip.
      adam_eps: Adam epsilon.
      gamma, gae_lambda: discount and GAE lambda.
      clip_eps: PPO ratio clip.
      value_clip_eps: clip of the value update around the rollout value (null = off).
      value_coef, entropy_coef: loss weights.
      ema_alpha: weight of the old value in the per-agent EMA of episode metrics.
      co_players: run directories (or checkpoints directories) of frozen partner
        policies for co-player agents (``env.co_player_fraction``), one chosen per env
        and episode; empty = co-players act with the learner's current parameters
        (their steps are still never trained on). One string is a list of one
        (``--set train.co_players=runs/a``); it is never split into characters.
    """

    seed: int = 0
    total_steps: int = 10_000_000
    num_scenes: int = 256
    num_envs: int = 64
    rollout_steps: int = 32
    epochs: int = 4
    minibatches: int = 4
    learning_rate: float = 3e-4
    lr_schedule: str = "constant"
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    value_clip_eps: float | None = None
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    ema_alpha: float = 0.9
    co_players: tuple[str, ...] = ()

    def __post_init__(self):
        check_int("seed", self.seed, 0, 2**31 - 1)
        check_int("total_steps", self.total_steps, 1, None)
        check_int("num_scenes", self.num_scenes, 1, 10_000_000)
        check_int("num_envs", self.num_envs, 1, 10_000_000)
        check_int("rollout_steps", self.rollout_steps, 1, 100_000)
        check_int("epochs", self.epochs, 1, 1000)
        check_int("minibatches", self.minibatches, 1, 1_000_000)
        check_range("learning_rate", self.learning_rate, 0.0, 1.0, lo_open=True)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_range("max_grad_norm", self.max_grad_norm, 0.0, None, lo_open=True)
        check_range("adam_eps", self.adam_eps, 0.0, 1.0, lo_open=True)
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        check_range("clip_eps", self.clip_eps, 0.0, 10.0, lo_open=True)
        if self.value_clip_eps is not None:
            check_range("value_clip_eps", self.value_clip_eps, 0.0, None, lo_open=True)
        check_range("value_coef", self.value_coef, 0.0, 1e6)
        check_range("entropy_coef", self.entropy_coef, 0.0, 1e6)
        check_range("ema_alpha", self.ema_alpha, 0.0, 1.0)
        if self.ema_alpha >= 1.0:
            raise ConfigError("config key 'ema_alpha' must be < 1 (1 would never update).")
        if isinstance(self.co_players, str):  # one directory is a list of one
            object.__setattr__(self, "co_players", (self.co_players,))
        if not isinstance(self.co_players, tuple):
            raise ConfigError("config key 'co_players' must be a list of run directories, "
                              f"got {self.co_players!r}.")
        for i, path in enumerate(self.co_players):
            check_path(f"co_players[{i}]", path, optional=False)


@dataclasses.dataclass(frozen=True)
class ValidationConfig(ConfigBase):
    """Periodic deterministic rollouts (mode actions) on held-out procedural scenes.

    Attributes:
      every: validate every this many iterations (0 = never; the run's end always
        validates unless 0).
      num_scenes: held-out scenes, each played once from its start for one episode.
      seed: seed of the held-out scenes (must differ from ``train.seed``).
    """

    every: int = 50
    num_scenes: int = 64
    seed: int = 1_000_003

    def __post_init__(self):
        check_int("every", self.every, 0, None)
        check_int("num_scenes", self.num_scenes, 1, 1_000_000)
        check_int("seed", self.seed, 0, 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(ConfigBase):
    """Attributes:
      every: save every this many iterations (0 = only at the end and on Ctrl-C).
      keep_last: checkpoints kept besides the best (by ``val/goal_rate``).
    """

    every: int = 100
    keep_last: int = 3

    def __post_init__(self):
        check_int("every", self.every, 0, None)
        check_int("keep_last", self.keep_last, 1, 1000)


@dataclasses.dataclass(frozen=True)
class LoggingConfig(ConfigBase):
    """Attributes:
      every: write metrics every this many iterations.
      output_dir: parent of the timestamped run directories.
      run_name: prefix of the run directory name (default: the config file's name); one
        path component (no '/', '..'), so that the run stays inside ``output_dir``.
      wandb: ``off``, ``online``, ``offline`` or ``env`` (use ``WANDB_MODE``, default
        online; falls back to off with a warning when wandb is missing or cannot start).
      wandb_project, wandb_entity: wandb destination.
    """

    every: int = 1
    output_dir: str = "runs"
    run_name: str | None = None
    wandb: str = "off"
    wandb_project: str = "jaxdrive"
    wandb_entity: str | None = None

    def __post_init__(self):
        check_int("every", self.every, 1, None)
        check_path("output_dir", self.output_dir, optional=False)
        if self.run_name is not None:
            check_name("run_name", self.run_name)
        check_choice("wandb", self.wandb, ("off", "online", "offline", "env"))


@dataclasses.dataclass(frozen=True)
class EvaluationConfig(ConfigBase):
    """Attributes:
      suite_file: an eval config (``eval:`` sections): a file or a preset name, e.g.
        ``eval/default`` (``configs/eval/default.yaml``); None = no evaluators during
        training (``validation`` still runs).
      suite: suite or evaluator name in that file (None = every enabled evaluator).
        Evaluators run when their ``interval`` divides the iteration, and at the end.
      subprocess_device: where ``mode: subprocess`` evaluators run
        (``jaxdrive.eval.manager.child_environment``): ``cpu`` (default) hides every
        accelerator from the child (``JAX_PLATFORMS=cpu``, ``CUDA_VISIBLE_DEVICES=""``);
        ``same`` puts it on the training process's accelerator (GPU) without
        preallocation and capped at ``subprocess_memory_fraction`` of its memory. ``cpu``
        is the default because it is the only placement that cannot fail or slow the
        training: the trainer preallocates most of its GPU's memory (75% by default),
        a child with JAX's defaults would try to take 75% more, and a TPU is held by one
        process. Choose ``same`` on a GPU with room to spare (cap the trainer too, with
        ``XLA_PYTHON_CLIENT_MEM_FRACTION``), when evaluating on the CPU is too slow.
      subprocess_memory_fraction: with ``same``, the fraction (0, 1] of the accelerator's
        memory the child may use (``XLA_PYTHON_CLIENT_MEM_FRACTION``); unused with
        ``cpu``.
    """

    suite_file: str | None = None
    suite: str | None = None
    subprocess_device: str = "cpu"
    subprocess_memory_fraction: float = 0.2

    def __post_init__(self):
        check_path("suite_file", self.suite_file)
        check_choice("subprocess_device", self.subprocess_device, SUBPROCESS_DEVICES)
        check_range("subprocess_memory_fraction", self.subprocess_memory_fraction, 0.0, 1.0,
                    lo_open=True)


@dataclasses.dataclass(frozen=True)
class DataConfig(ConfigBase):
    """Training scenes from a converted dataset (``python -m jaxdrive.data convert``).

    Attributes:
      path: shard directory; None = procedural training scenes (``procedural``).
      pool_size: scenes in the env's device pool at a time (replaces train.num_scenes).
      refresh_every: every this many iterations the pool is replaced by the next
        ``pool_size`` scenes (prepared ahead by a background thread) and every env
        restarts on it; 0 = keep the first pool.
      subset: behaviour-class subset of the dataset to train on.
      seed: shuffle seed of the scene stream.
      validation_path: scenes for ``validation`` (its first ``num_scenes``); None =
        procedural held-out scenes.
    """

    path: str | None = None
    pool_size: int = 256
    refresh_every: int = 0
    subset: str | None = None
    seed: int = 0
    validation_path: str | None = None

    def __post_init__(self):
        check_path("path", self.path)
        check_path("validation_path", self.validation_path)
        check_int("pool_size", self.pool_size, 1, 10_000_000)
        check_int("refresh_every", self.refresh_every, 0, None)
        check_int("seed", self.seed, 0, 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class RunConfig(ConfigBase):
    """A whole training run (see the module doc for the sections)."""

    env: EnvConfig = EnvConfig()
    procedural: ProceduralConfig = ProceduralConfig()
    policy: PolicyConfig = PolicyConfig()
    train: TrainConfig = TrainConfig()
    validation: ValidationConfig = ValidationConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    logging: LoggingConfig = LoggingConfig()
    video: VideoConfig = VideoConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    data: DataConfig = DataConfig()

    def __post_init__(self):
        slots = self.train.num_envs * self.env.scenario.max_agents
        if slots % self.train.minibatches:
            raise ConfigError(
                f"config key 'train.minibatches' = {self.train.minibatches} must divide the "
                f"agent rows train.num_envs x env.scenario.max_agents = {slots}; pick a "
                "divisor or change num_envs.")
        if self.validation.every and self.validation.seed == self.train.seed:
            raise ConfigError(
                "config key 'validation.seed' equals 'train.seed': the validation scenes "
                "would be the training scenes; pick another validation.seed.")

    @property
    def steps_per_iteration(self) -> int:
        """Agent-steps per training iteration (B x A x T)."""
        t = self.train
        return t.num_envs * self.env.scenario.max_agents * t.rollout_steps

    @property
    def num_iterations(self) -> int:
        """() int: training iterations covering ``train.total_steps`` (rounded up)."""
        return -(-self.train.total_steps // self.steps_per_iteration)


def load_run_config(path: str | None, overrides: dict | None = None) -> RunConfig:
    """The YAML file or preset (``resolve_config_path``; ``inherits:`` resolved, dotted
    keys expanded in each file) with ``overrides`` (nested or dotted keys) merged on top,
    checked."""
    if path:
        path = resolve_config_path(path)
    data = load_yaml(path, dotted=True) if path else {}
    data = merge(data, expand_dotted(overrides or {}, "overrides"))
    where = f" (in {path})" if path else ""
    try:
        return RunConfig.from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{e}{where}") from None
