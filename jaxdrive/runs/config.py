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
    population:  PopulationConfig (train N partner runs into one population directory,
                 ``jaxdrive.train.population``; ``train.co_players`` accepts it)

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
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    read_yaml_file,
    resolve_config_path,
)
from jaxdrive.env import EnvConfig
from jaxdrive.models.policy import PolicyConfig
from jaxdrive.render.record import VideoConfig
from jaxdrive.scenarios.procedural import ProceduralConfig

LR_SCHEDULES = ("constant", "linear")
OBJECTIVES = ("ppo", "bc")
AUX_TARGETS = ("goal", "nearest_vehicle")
SUBPROCESS_DEVICES = ("cpu", "same")  # EvaluationConfig.subprocess_device


@dataclasses.dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """PPO and the length of the run.

    Attributes:
      objective: ``ppo`` (self-play reinforcement learning) or ``bc`` (behaviour
        cloning: the learner's agents drive by the expert, ``log_replay``'s inverse
        dynamics of their logs in the env's action space, and the policy is fitted to
        the expert's actions by maximum likelihood; steps where the log has no next
        state carry no label). Validation always drives by the policy.
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
      lr_schedule: ``constant`` (the learning rate throughout) or ``linear`` (from
        ``learning_rate`` to 0 over the run's updates).
      max_grad_norm: global gradient-norm clip.
      adam_eps: Adam epsilon.
      gamma, gae_lambda: discount and GAE lambda.
      clip_eps: PPO ratio clip.
      value_clip_eps: clip of the value update around the rollout value (null = off).
      value_coef, entropy_coef: loss weights.
      aux_goal_coef: weight of the auxiliary goal loss (needs ``policy.aux_goal``): the
        mean squared error of the policy's goal prediction against the true goal rows of
        the ego features, which the env computes even when ``observation.goal`` hides
        them (a training target only; the policy never observes it). 0 = off.
      aux_target: what the auxiliary head predicts: ``goal`` (the goal rows, above) or
        ``nearest_vehicle`` (where the nearest other vehicle among the env's agent rows
        is, even beyond ``observation.partner_radius``:
        ``jaxdrive.env.observation.nearest_vehicle_features``; background objects of
        packed rows, ``env.max_controlled``, are not candidates; the narrow-passing task
        of ``docs/adaptation.md``).
      ema_alpha: weight of the old value in the per-agent EMA of episode metrics.
      co_players: run directories (or checkpoints directories) of frozen partner
        policies for co-player agents (``env.co_player_fraction``), or population
        directories (``population.yaml``: each stands for its members' run directories,
        ``expand_co_players``). With M partners, env ``i`` of ``num_envs`` is driven by
        member ``i * M // num_envs`` for the whole run (``num_envs`` must be a multiple
        of M); empty = co-players act with the learner's current parameters (their
        steps are still never trained on). One string is a list of one
        (``--set train.co_players=runs/a``); it is never split into characters.
      init_from: a run directory (or its ``checkpoints/``) whose policy parameters start
        this run instead of fresh ones (the optimiser, environments and step count start
        afresh): a curriculum's next stage, or fine-tuning on other scenes. The policy
        and the observation sizes must give parameters of the same shapes (checked,
        naming the first that differs). Ignored by ``--resume``, which continues from
        the run's own checkpoint.
      init_checkpoint: which checkpoint of ``init_from``: ``best`` (by validation goal
        rate; the newest intact one when the run has none) or ``last``.
      bc_policy: a run directory (e.g. one trained with ``objective: bc``) whose frozen
        policy (its best checkpoint) regularises PPO towards human driving: human-
        regularised PPO (Cornelisse & Vinitsky 2024, arXiv 2403.19648) minimises
        ``(1 - bc_kl_coef) * L_PPO + bc_kl_coef * KL(pi_bc || pi)`` over the valid steps.
        It must be an MLP policy with the learner's observation sizes and action space.
      bc_kl_coef: lambda of that objective, in [0, 1); 0 = plain PPO.
      dense_rows: run the policy's scene encoder only on the agent rows that matter
        (learner: ego agents not removed; co-players: their own rows), gathered into a
        buffer of fixed capacity, in the rollout and in the PPO epochs
        (``jaxdrive.models.dense``). ``auto``: buffers of 1/4, 1/2 and 3/4 of the rows,
        the smallest that holds the live rows runs (batches under 256 rows run whole:
        each buffer size is one more compiled copy of the policy); a number in (0, 1]: one buffer of
        that share; ``off``: every row. A step or minibatch with more live rows than the
        largest buffer runs the whole batch (nothing is dropped);
        ``rollout/dense_overflow_steps`` and ``loss/dense_overflow_minibatches`` count
        those. On a mesh of several devices each device packs its own rows into its
        share of every buffer (batches under 256 rows per device run whole with
        ``auto``); co-players run every row there.
      shuffle_groups: how each epoch's minibatches are drawn. The agent rows are cut
        into this many contiguous groups, each shuffled on its own, and every minibatch
        takes an equal share of every group (a stratified shuffle; 1 = one shuffle of
        all rows). On a mesh each device holds whole groups, so a minibatch is gathered
        where its rows live and the memory per device follows the rows per device, not
        the job. Results depend on the groups, not on the device count: 8 devices equal
        one device with ``shuffle_groups: 8`` (up to float rounding). ``auto``: the
        number of devices. Rows per group must be a multiple of ``minibatches``, and the
        groups 1 or a multiple of the devices (1 on several devices: the whole batch is
        gathered onto every device, as before this option existed).
      pool_shards: how the envs draw their scenes. The pool's scenes are cut into this
        many contiguous shards and the envs into as many contiguous blocks; the envs of
        block k draw (at every reset) from shard k only. On a mesh each device holds
        whole shards and their envs, so the pool's memory per device is the pool over
        the devices. Results depend on the shards, not on the device count: 8 devices
        equal one device with ``pool_shards: 8``. ``auto``: the number of devices (1, the
        whole pool for every env, on one device). Must divide ``num_envs`` and the pool
        (``num_scenes``, or ``data.pool_size`` with ``data.path``), and be 1 or a
        multiple of the devices (1 on several devices: the pool whole on every device).
      stop_check_every: in a multi-process job, the processes agree whether any of them
        was asked to stop (Ctrl-C, SIGTERM) after every this many iterations (and after
        the last), with one small collective; between two such iterations each process
        dispatches its next iteration before reading the last one's metrics, as one
        process always does, so the devices do not wait for the hosts' logging. A stop
        then takes effect after at most this many more iterations: size it so that they
        fit the scheduler's signal lead time (``docs/scale.md``). One process: ignored
        (its stop is seen after the iteration in progress).
    """

    objective: str = "ppo"
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
    aux_goal_coef: float = 0.0
    aux_target: str = "goal"
    ema_alpha: float = 0.9
    co_players: tuple[str, ...] = ()
    init_from: str | None = None
    init_checkpoint: str = "best"
    bc_policy: str | None = None
    bc_kl_coef: float = 0.0
    dense_rows: str | float | bool = "auto"
    shuffle_groups: str | int = "auto"
    pool_shards: str | int = "auto"
    stop_check_every: int = 4

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
        check_choice("objective", self.objective, OBJECTIVES)
        check_range("max_grad_norm", self.max_grad_norm, 0.0, None, lo_open=True)
        check_range("adam_eps", self.adam_eps, 0.0, 1.0, lo_open=True)
        check_range("gamma", self.gamma, 0.0, 1.0)
        check_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        check_range("clip_eps", self.clip_eps, 0.0, 10.0, lo_open=True)
        if self.value_clip_eps is not None:
            check_range("value_clip_eps", self.value_clip_eps, 0.0, None, lo_open=True)
        check_range("value_coef", self.value_coef, 0.0, 1e6)
        check_range("entropy_coef", self.entropy_coef, 0.0, 1e6)
        check_range("aux_goal_coef", self.aux_goal_coef, 0.0, 1e6)
        check_choice("aux_target", self.aux_target, AUX_TARGETS)
        check_range("ema_alpha", self.ema_alpha, 0.0, 1.0)
        if self.ema_alpha >= 1.0:
            raise ConfigError("config key 'ema_alpha' must be < 1 (1 would never update).")
        if self.dense_rows is False:  # YAML reads a bare off as false
            object.__setattr__(self, "dense_rows", "off")
        if isinstance(self.dense_rows, bool) or not (
                self.dense_rows in ("auto", "off") or (
                    isinstance(self.dense_rows, int | float) and 0 < self.dense_rows <= 1)):
            raise ConfigError(f"config key 'dense_rows' must be auto, off or a share of the "
                              f"agent rows in (0, 1], got {self.dense_rows!r}.")
        if self.shuffle_groups != "auto":
            if isinstance(self.shuffle_groups, bool) or not isinstance(self.shuffle_groups,
                                                                       int):
                raise ConfigError("config key 'shuffle_groups' must be auto or a positive "
                                  f"integer, got {self.shuffle_groups!r}.")
            check_int("shuffle_groups", self.shuffle_groups, 1, 1_000_000)
        if self.pool_shards != "auto":
            if isinstance(self.pool_shards, bool) or not isinstance(self.pool_shards, int):
                raise ConfigError("config key 'pool_shards' must be auto or a positive "
                                  f"integer, got {self.pool_shards!r}.")
            check_int("pool_shards", self.pool_shards, 1, 1_000_000)
        if isinstance(self.co_players, str):  # one directory is a list of one
            object.__setattr__(self, "co_players", (self.co_players,))
        if not isinstance(self.co_players, tuple):
            raise ConfigError("config key 'co_players' must be a list of run directories, "
                              f"got {self.co_players!r}.")
        for i, path in enumerate(self.co_players):
            check_path(f"co_players[{i}]", path, optional=False)
        check_int("stop_check_every", self.stop_check_every, 1, 1_000_000)
        check_path("init_from", self.init_from)
        check_choice("init_checkpoint", self.init_checkpoint, ("best", "last"))
        check_path("bc_policy", self.bc_policy)
        check_range("bc_kl_coef", self.bc_kl_coef, 0.0, 1.0, hi_open=True)
        if self.bc_kl_coef > 0 and self.bc_policy is None:
            raise ConfigError(f"config key 'bc_kl_coef' = {self.bc_kl_coef} needs "
                              "'bc_policy': the run directory of the frozen reference "
                              "policy (e.g. trained with objective: bc).")
        if self.bc_kl_coef > 0 and self.objective != "ppo":
            raise ConfigError("config key 'bc_kl_coef' regularises PPO; with objective: "
                              f"{self.objective} set it to 0.")


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


POPULATION_MANIFEST = "population.yaml"


def flat_items(data: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested or dotted mapping -> sorted (dotted key, value) pairs (lists as tuples)."""
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(flat_items(value, path + "."))
        else:
            out.append((path, _frozen(value)))
    return sorted(out)


def _frozen(value: Any) -> Any:
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class PopulationConfig(ConfigBase):
    """A population of partner policies trained by one command
    (``python -m jaxdrive.train --config FILE --population N``,
    ``jaxdrive.train.population``): N member runs in one population directory with a
    manifest (``population.yaml``), usable as ``train.co_players`` or an evaluator's
    ``co_players``.

    Attributes:
      size: members to train; 0 = an ordinary single run.
      members: per-member overrides, a list of at most ``size`` mappings of run-config
        keys (nested or dotted, e.g. ``{env.reward.speed_target: 3.0}``); members
        without an entry use the config as it is. Member ``i`` also trains with
        ``train.seed + i`` and ``validation.seed + i`` unless its overrides set them.
        Stored as sorted ``(dotted key, value)`` pairs.
    """

    size: int = 0
    members: tuple = ()

    def __post_init__(self):
        check_int("size", self.size, 0, 1024)
        if not isinstance(self.members, tuple):
            raise ConfigError("config key 'members' must be a list of mappings of run-config "
                              f"keys (one per member), got {self.members!r}.")
        members = []
        for i, m in enumerate(self.members):
            if isinstance(m, Mapping):
                m = tuple(flat_items(expand_dotted(m, f"config key 'members[{i}]'")))
            if not isinstance(m, tuple) or not all(
                    isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in m):
                raise ConfigError(f"config key 'members[{i}]' must be a mapping of run-config "
                                  f"keys to values, got {m!r}.")
            if any(k == "population" or k.startswith("population.") for k, _ in m):
                raise ConfigError(f"config key 'members[{i}]' cannot set population keys.")
            members.append(m)
        object.__setattr__(self, "members", tuple(members))
        if len(self.members) > self.size:
            raise ConfigError(f"config key 'members' lists {len(self.members)} members but "
                              f"'size' is {self.size}; set size >= {len(self.members)} (or "
                              f"--population {len(self.members)}).")

    def overrides(self, i: int) -> dict[str, Any]:
        """Member ``i`` 's overrides as a dotted mapping (lists as lists)."""
        return {k: _plain(v) for k, v in self.members[i]} if i < len(self.members) else {}

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "members": [self.overrides(i)
                                               for i in range(len(self.members))]}


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
    population: PopulationConfig = PopulationConfig()

    def __post_init__(self):
        slots = self.train.num_envs * self.env.num_rows
        if slots % self.train.minibatches:
            raise ConfigError(
                f"config key 'train.minibatches' = {self.train.minibatches} must divide the "
                f"agent rows train.num_envs x env.max_controlled (else env.scenario.max_agents) "
                f"= {slots}; pick a "
                "divisor or change num_envs.")
        if self.validation.every and self.validation.seed == self.train.seed:
            raise ConfigError(
                "config key 'validation.seed' equals 'train.seed': the validation scenes "
                "would be the training scenes; pick another validation.seed.")
        if self.train.aux_goal_coef > 0 and not self.policy.aux_goal:
            raise ConfigError(
                f"config key 'train.aux_goal_coef' = {self.train.aux_goal_coef} needs the "
                "policy's goal head: set policy.aux_goal: true (or aux_goal_coef: 0).")
        for i in range(self.population.size):
            member_config(self, i)  # each member's config is checked up front

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if self.population == PopulationConfig():
            # Ordinary runs save the config they saved before populations existed.
            del out["population"]
        return out

    @property
    def steps_per_iteration(self) -> int:
        """Agent-steps per training iteration (B x C x T; C = ``env.num_rows``)."""
        t = self.train
        return t.num_envs * self.env.num_rows * t.rollout_steps

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


def member_config(config: RunConfig, i: int) -> RunConfig:
    """The run config of population member ``i``: ``config`` with no population, member
    ``i`` 's overrides, and seeds ``train.seed + i`` / ``validation.seed + i`` (unless the
    overrides set them).

    Raises:
      ConfigError: naming ``population.members[i]`` and the key at fault.
    """
    pop = config.population
    data = config.to_dict()
    data.pop("population", None)
    data["train"]["seed"] = config.train.seed + i
    data["validation"]["seed"] = config.validation.seed + i
    try:
        return RunConfig.from_dict(merge(data, expand_dotted(pop.overrides(i),
                                                             "population.members")))
    except ConfigError as e:
        raise ConfigError(f"config key 'population.members[{i}]': {e}") from None


def read_population(path: str | os.PathLike, key: str = "train.co_players") -> list[dict]:
    """The members of a population directory, from its manifest: dicts with ``name``,
    ``run_dir`` (absolute or relative to ``path``, resolved here) and ``overrides``.

    Raises:
      ConfigError: naming ``key``: no manifest, a damaged one, or an incomplete
        population (fewer members trained than its ``size``).
    """
    path = Path(path)
    manifest = path / POPULATION_MANIFEST
    if not manifest.is_file():
        raise ConfigError(f"config key '{key}': {path} has no {POPULATION_MANIFEST}: it is "
                          "not a population directory (train one with python -m "
                          "jaxdrive.train --config FILE --population N) nor a run directory "
                          "(config.yaml); name run directories or a population directory.")
    data = read_yaml_file(str(manifest))
    members = data.get("members") if isinstance(data, Mapping) else None
    if (not isinstance(members, list) or not members
            or not all(isinstance(m, Mapping) and isinstance(m.get("run_dir"), str)
                       for m in members)):
        raise ConfigError(f"config key '{key}': {manifest} lists no members (each needs a "
                          "run_dir); retrain the population.")
    size = data.get("size", len(members))
    if len(members) < size:
        raise ConfigError(f"config key '{key}': population {path} is incomplete ({len(members)} "
                          f"of {size} members trained); finish or retrain it.")
    return [{**m, "run_dir": str(path / m["run_dir"])} for m in members]


def expand_co_players(paths: Sequence[str], key: str = "train.co_players") -> tuple[str, ...]:
    """``paths`` with each population directory replaced by its members' run
    directories, in manifest order (run and checkpoints directories stay).

    Raises:
      ConfigError: naming ``key[i]`` for a directory that is neither a run, checkpoints
        nor population directory (a path that does not exist is kept: loading it says so).
    """
    out: list[str] = []
    for i, p in enumerate(paths):
        path = Path(p)
        name = f"{key}[{i}]"
        if (path / POPULATION_MANIFEST).is_file():
            out.extend(m["run_dir"] for m in read_population(path, name))
        elif (not path.is_dir() or (path / "config.yaml").is_file()
              or (path.parent / "config.yaml").is_file()):
            out.append(str(p))
        else:
            read_population(path, name)  # raises, naming the key
    return tuple(out)
