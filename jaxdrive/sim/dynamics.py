"""Agent dynamics: a kinematic bicycle model and a local-frame delta model, one interface.

Every function is pure JAX and written for arbitrary leading shapes ``(..., A)``, so it
works unbatched, under ``jax.vmap`` over environments and under ``jax.jit``. All float
outputs are float32.

Interface (``DynamicsModel``): a frozen, hashable dataclass per model (safe to close over or
pass as a static jit argument) with

- ``name: str``, ``action_dim: int``, ``num_actions: int`` (discrete grid size);
- ``step(state, action, length) -> AgentState``: ``action`` (..., A, action_dim) float32 is
  clipped to ``[action_low, action_high]``; ``valid`` is passed through unchanged and every
  slot is stepped (masking invalid or non-controlled slots is the caller's job);
- ``action_grid() -> (num_actions, action_dim)``: the Cartesian product of per-component bins
  (first component varies slowest, so ``index = i0 * n1 * n2 + i1 * n2 + i2``);
- ``action_low`` / ``action_high``: (action_dim,) float32 bounds of continuous actions;
- ``inverse(prev, next_xy, next_yaw, next_speed, length) -> (..., A, action_dim)``: the
  continuous action that best reproduces a logged transition;
- ``action_from_accel_curvature(accel, curvature, speed, length) -> (..., A, action_dim)``:
  the continuous action that best realises a target acceleration and path curvature (what
  built-in controllers such as lane following produce), clipped to the action bounds.

Models, each configured by its own section of ``DynamicsConfig``:

- ``"bicycle"`` (``BicycleModel``, ``dynamics.bicycle``: ``BicycleConfig``): action
  ``(accel m/s^2, steer rad)``; see ``BicycleModel``.
- ``"delta_local"`` (``DeltaLocalModel``, ``dynamics.delta_local``: ``DeltaLocalConfig``):
  action ``(dx m, dy m, dyaw rad)`` per step in the agent's frame; see ``DeltaLocalModel``.

``DynamicsConfig`` holds the keys common to every model (``model``, ``dt``,
``action_space``) and one section per model; the sections of models not selected are
validated but unused. New models are added with ``register(name, factory)``;
``make_dynamics(config)`` builds the one named by ``DynamicsConfig.model``. An ``Env`` may
also be given a model object directly (``Env(config, dynamics=model)``; see
``check_model``). ``apply_action`` steps with either discrete indices or continuous
actions according to ``DynamicsConfig.action_space``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.config import ConfigBase, ConfigError, check_choice, check_int, check_range
from jaxdrive.types import AgentState

F32 = jnp.float32

ACTION_SPACES = ("discrete", "continuous")

# Floor on the box length used for the wheelbase: padded slots carry length 0, and the yaw
# rate divides by the rear-axle distance.
MIN_LENGTH = 0.1
# Below this |average speed| (m/s) the yaw change says nothing about the steering angle, so
# ``BicycleModel.inverse`` returns steer 0 there.
MIN_INVERSE_SPEED = 1e-3


def wrap_angle(angle: jax.Array) -> jax.Array:
    """Wrap angles (any shape, radians) to ``(-pi, pi]``."""
    angle = jnp.asarray(angle, F32)
    pi = jnp.asarray(math.pi, F32)
    out = pi - jnp.mod(pi - angle, 2 * pi)
    # float32 rounding can make the mod return exactly 2*pi, i.e. out == -pi.
    return jnp.where(out <= -pi, out + 2 * pi, out)


def bins(low: float, high: float, n: int) -> np.ndarray:
    """(n,) float32 bin values from ``low`` to ``high`` inclusive, containing 0 if straddled.

    For ``low < 0 < high`` (``n`` odd) the ``n // 2`` negative bins are evenly spaced on
    ``[low, 0)`` and the ``n // 2`` positive ones on ``(0, high]``, so 0 is a bin even for
    an asymmetric range; for a symmetric range this equals ``linspace(low, high, n)``.
    """
    if low < 0 < high:
        if n % 2 != 1 or n < 3:
            raise ValueError(f"a range straddling 0 needs an odd bin count >= 3, got {n}")
        half = n // 2
        neg = np.linspace(low, 0.0, half + 1)
        pos = np.linspace(0.0, high, half + 1)[1:]
        out = np.concatenate([neg, pos])
    else:
        out = np.linspace(low, high, n)
    return out.astype(np.float32)


def _grid(*axes: np.ndarray) -> jax.Array:
    """Cartesian product (first axis slowest) as a (prod(n_i), len(axes)) float32 array."""
    mesh = np.meshgrid(*axes, indexing="ij")
    return jnp.asarray(np.stack([m.reshape(-1) for m in mesh], axis=-1), F32)


def _check_bins(name: str, value) -> None:
    check_int(name, value, 3, 1001)
    if value % 2 != 1:
        raise ConfigError(
            f"config key '{name}' = {value} must be odd so that the zero action is a bin."
        )


def _check_action(action: jax.Array, state: AgentState, action_dim: int, who: str) -> None:
    expected = tuple(state.yaw.shape) + (action_dim,)
    if tuple(action.shape) != expected:
        raise ValueError(
            f"{who}: action has shape {tuple(action.shape)}, expected (..., A, action_dim) = "
            f"{expected} float32 (state yaw shape {tuple(state.yaw.shape)}, "
            f"action_dim={action_dim})."
        )


@dataclasses.dataclass(frozen=True)
class BicycleConfig(ConfigBase):
    """Limits and action bins of the kinematic bicycle model (``dynamics.bicycle``).

    Attributes:
      max_accel: largest acceleration, m/s^2 (> 0).
      min_accel: smallest acceleration, i.e. hardest braking, m/s^2 (< 0).
      max_steer: steering angle limit, rad; steer is clipped to ``+-max_steer``.
      max_speed: forward speed limit, m/s.
      max_reverse_speed: reverse speed limit, m/s (>= 0); speed is clipped to
        ``[-max_reverse_speed, max_speed]``. The default 0 means no reversing: braking
        stops the agent.
      accel_bins, steer_bins: discrete bins per component (odd, >= 3).
    """

    max_accel: float = 4.0
    min_accel: float = -6.0
    max_steer: float = 0.6
    max_speed: float = 30.0
    max_reverse_speed: float = 0.0
    accel_bins: int = 7
    steer_bins: int = 13

    def __post_init__(self):
        _check_accel_limits(self.min_accel, self.max_accel)
        # tan(steer) diverges at pi/2.
        check_range("max_steer", self.max_steer, 0.0, 1.5, lo_open=True)
        check_range("max_speed", self.max_speed, 0.0, 200.0, lo_open=True)
        check_range("max_reverse_speed", self.max_reverse_speed, 0.0, 200.0)
        for name in ("accel_bins", "steer_bins"):
            _check_bins(name, getattr(self, name))


@dataclasses.dataclass(frozen=True)
class DeltaLocalConfig(ConfigBase):
    """Limits and action bins of the local-frame delta model (``dynamics.delta_local``).

    Attributes:
      max_dx, max_dy: longitudinal / lateral displacement limit per step, m; dx is
        clipped to ``+-max_dx``, dy to ``+-max_dy``.
      max_dyaw: yaw change limit per step, rad.
      dx_bins, dy_bins, dyaw_bins: discrete bins per component (odd, >= 3).
      max_accel, min_accel: m/s^2, the bounds a controller's target acceleration is
        clipped to when ``action_from_accel_curvature`` turns it into a displacement.
        The model itself steps displacements; these do not bound a policy's actions.
    """

    max_dx: float = 3.0
    max_dy: float = 0.5
    max_dyaw: float = 0.3
    dx_bins: int = 21
    dy_bins: int = 5
    dyaw_bins: int = 11
    max_accel: float = 4.0
    min_accel: float = -6.0

    def __post_init__(self):
        check_range("max_dx", self.max_dx, 0.0, 100.0, lo_open=True)
        check_range("max_dy", self.max_dy, 0.0, 100.0, lo_open=True)
        check_range("max_dyaw", self.max_dyaw, 0.0, math.pi, lo_open=True)
        for name in ("dx_bins", "dy_bins", "dyaw_bins"):
            _check_bins(name, getattr(self, name))
        _check_accel_limits(self.min_accel, self.max_accel)


def _check_accel_limits(min_accel: float, max_accel: float) -> None:
    check_range("max_accel", max_accel, 0.0, 100.0, lo_open=True)
    check_range("min_accel", min_accel, -100.0, 0.0)
    if min_accel >= 0:
        raise ConfigError(
            f"config key 'min_accel' = {min_accel!r} must be negative (it is the hardest "
            "braking, e.g. -6.0)."
        )


# Model sections of ``DynamicsConfig``: field name -> section class.
MODEL_SECTIONS = {"bicycle": BicycleConfig, "delta_local": DeltaLocalConfig}


@dataclasses.dataclass(frozen=True)
class DynamicsConfig(ConfigBase):
    """Dynamics model, time step, action space, and one section per model.

    Attributes:
      model: registered model name, ``"bicycle"`` or ``"delta_local"``.
      dt: step length, seconds (the env's step; every model steps by it).
      action_space: ``"discrete"`` (int index into ``action_grid()``) or ``"continuous"``.
      bicycle: ``BicycleConfig``, the bicycle model's limits and bins.
      delta_local: ``DeltaLocalConfig``, the delta-local model's limits and bins.

    The model keys once sat flat in this section (``dynamics.max_accel``); ``from_dict``
    rejects them with a ``ConfigError`` naming their new key
    (``dynamics.bicycle.max_accel``).
    """

    model: str = "bicycle"
    dt: float = 0.1
    action_space: str = "discrete"
    bicycle: BicycleConfig = BicycleConfig()
    delta_local: DeltaLocalConfig = DeltaLocalConfig()

    def __post_init__(self):
        check_choice("model", self.model, tuple(DYNAMICS_MODELS))
        check_choice("action_space", self.action_space, ACTION_SPACES)
        check_range("dt", self.dt, 0.0, 10.0, lo_open=True)

    @classmethod
    def from_dict(cls, data, path: str = ""):
        """As ``ConfigBase.from_dict``; a model key at the top of the section (the old
        flat layout) is a ``ConfigError`` naming the section key that replaced it."""
        if data is not None and not isinstance(data, Mapping):
            return super().from_dict(data, path)  # the base class names the bad type
        for key in sorted(data or {}, key=str):
            sections = [name for name, sec in MODEL_SECTIONS.items()
                        if key in {f.name for f in dataclasses.fields(sec)}]
            if sections:
                where = f"{path}." if path else ""
                new = " or ".join(f"'{where}{name}.{key}'" for name in sections)
                raise ConfigError(
                    f"config key '{where}{key}' has moved into the model's section: set "
                    f"{new} instead (each dynamics model has its own section: "
                    f"{', '.join(MODEL_SECTIONS)})."
                )
        return super().from_dict(data, path)


def migrate_flat_layout(section: dict) -> dict:
    """A ``dynamics`` mapping in the flat layout of run directories saved before the
    per-model sections (``max_accel`` next to ``model``) rewritten into the sectioned
    one: each model key goes into every section that declares it (the old flat
    ``max_accel`` / ``min_accel`` bounded both models' controllers). Used when reading
    saved runs only; a config file in the flat layout stays an error."""
    out = {k: v for k, v in section.items()
           if not any(k in {f.name for f in dataclasses.fields(sec)}
                      for sec in MODEL_SECTIONS.values())}
    for name, sec in MODEL_SECTIONS.items():
        moved = {f.name: section[f.name] for f in dataclasses.fields(sec) if f.name in section}
        if moved:
            out[name] = {**moved, **dict(section.get(name) or {})}
    return out


class DynamicsModel(Protocol):
    """What every registered dynamics model provides (see the module docstring)."""

    name: str
    action_dim: int

    @property
    def num_actions(self) -> int:
        """() int: size of the discrete action grid."""
        ...

    @property
    def action_low(self) -> jax.Array:
        """(action_dim,) float32: lower bounds of continuous actions."""
        ...

    @property
    def action_high(self) -> jax.Array:
        """(action_dim,) float32: upper bounds of continuous actions."""
        ...

    def action_grid(self) -> jax.Array:
        """(num_actions, action_dim) float32: the discrete actions, first component
        varying slowest."""
        ...

    def step(self, state: AgentState, action: jax.Array, length: jax.Array) -> AgentState:
        """The next ``AgentState`` (same shapes, float32, ``valid`` unchanged) after
        ``action`` (..., A, action_dim) float32, clipped to the bounds; ``length``: (..., A)
        float32 box length, metres."""
        ...

    def inverse(
        self, prev: AgentState, next_xy: jax.Array, next_yaw: jax.Array,
        next_speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """(..., A, action_dim) float32: the continuous action that best reproduces the
        transition from ``prev`` to ``next_xy`` (..., A, 2) metres, ``next_yaw`` (..., A)
        radians, ``next_speed`` (..., A) m/s; ``length``: (..., A) metres."""
        ...

    def action_from_accel_curvature(
        self, accel: jax.Array, curvature: jax.Array, speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """(..., A, action_dim) float32, within the bounds: the continuous action that
        best realises ``accel`` (..., A) m/s^2 along a path of ``curvature`` (..., A) 1/m
        (> 0 turns left) at ``speed`` (..., A) m/s; ``length``: (..., A) metres."""
        ...


@dataclasses.dataclass(frozen=True)
class BicycleModel:
    """Kinematic bicycle model about the box centre; action ``(accel, steer)``.

    Geometry: the reference point is the box centre and both axles are taken at the box
    ends, ``lf = lr = length / 2`` (length floored at ``MIN_LENGTH``), so the slip angle is
    ``beta = atan(lr / (lf + lr) * tan(steer)) = atan(tan(steer) / 2)``.

    Update with ``v0 = state.speed``, ``a``/``steer`` the clipped action:

    - ``v1 = clip(v0 + a dt, -max_reverse_speed, max_speed)``;
    - ``v = (v0 + v1) / 2`` (trapezoidal: exact displacement for straight motion under
      constant acceleration, and the speed that ``inverse`` can recover);
    - ``x' = x + v cos(yaw + beta) dt``, ``y' = y + v sin(yaw + beta) dt``;
    - ``yaw' = wrap(yaw + v / lr * sin(beta) dt)`` in ``(-pi, pi]``.

    ``vel' = v1 * (cos yaw', sin yaw')`` lies along the heading (not the slip direction), so
    ``state.speed`` returns ``v1`` exactly. ``steer`` and ``accel`` store the clipped
    action (``accel`` as commanded, even when the speed limit cuts it).

    Attributes:
      dt: step length, seconds.
      config: ``BicycleConfig``, the limits and bins.
    """

    dt: float = 0.1
    config: BicycleConfig = BicycleConfig()

    name = "bicycle"
    action_dim = 2

    @classmethod
    def from_config(cls, config: DynamicsConfig) -> BicycleModel:
        """The model of ``config.dt`` and section ``config.bicycle``."""
        return cls(dt=config.dt, config=config.bicycle)

    @property
    def num_actions(self) -> int:
        """() int: ``accel_bins * steer_bins``."""
        return self.config.accel_bins * self.config.steer_bins

    @property
    def action_low(self) -> jax.Array:
        """(2,) float32: ``(min_accel, -max_steer)``."""
        return jnp.asarray([self.config.min_accel, -self.config.max_steer], F32)

    @property
    def action_high(self) -> jax.Array:
        """(2,) float32: ``(max_accel, max_steer)``."""
        return jnp.asarray([self.config.max_accel, self.config.max_steer], F32)

    def action_grid(self) -> jax.Array:
        """(accel_bins * steer_bins, 2) float32, accel varying slowest."""
        c = self.config
        return _grid(
            bins(c.min_accel, c.max_accel, c.accel_bins),
            bins(-c.max_steer, c.max_steer, c.steer_bins),
        )

    def _speeds(self, v0: jax.Array, accel: jax.Array) -> tuple[jax.Array, jax.Array]:
        v1 = jnp.clip(v0 + accel * self.dt, -self.config.max_reverse_speed,
                      self.config.max_speed)
        return v1, 0.5 * (v0 + v1)

    def min_turn_radius(self, length: float) -> float:
        """m, the radius of the tightest circle the box centre of a vehicle of ``length``
        m can follow (full steer): ``lr / sin(beta_max)`` with ``lr = length / 2`` and
        ``beta_max = atan(tan(max_steer) / 2)``."""
        beta = math.atan(0.5 * math.tan(self.config.max_steer))
        return 0.5 * max(length, MIN_LENGTH) / math.sin(beta)

    def step(self, state: AgentState, action: jax.Array, length: jax.Array) -> AgentState:
        """Advance one step.

        Args:
          state: ``AgentState`` with (..., A) leading shape.
          action: (..., A, 2) ``(accel m/s^2, steer rad)``, clipped to the limits.
          length: (..., A) box length, metres.

        Returns:
          The next ``AgentState`` (same shapes, float32, ``valid`` unchanged).
        """
        action = jnp.asarray(action, F32)
        _check_action(action, state, self.action_dim, "BicycleModel.step")
        action = jnp.clip(action, self.action_low, self.action_high)
        accel, steer = action[..., 0], action[..., 1]
        yaw = jnp.asarray(state.yaw, F32)
        lr = 0.5 * jnp.maximum(jnp.asarray(length, F32), MIN_LENGTH)
        v1, v = self._speeds(state.speed.astype(F32), accel)
        beta = jnp.arctan(0.5 * jnp.tan(steer))
        heading = yaw + beta
        xy = state.xy.astype(F32) + (v * self.dt)[..., None] * jnp.stack(
            [jnp.cos(heading), jnp.sin(heading)], axis=-1
        )
        new_yaw = wrap_angle(yaw + v / lr * jnp.sin(beta) * self.dt)
        vel = v1[..., None] * jnp.stack([jnp.cos(new_yaw), jnp.sin(new_yaw)], axis=-1)
        return AgentState(
            xy=xy, yaw=new_yaw, vel=vel, steer=steer, accel=accel, valid=state.valid
        )

    def inverse(
        self, prev: AgentState, next_xy: jax.Array, next_yaw: jax.Array,
        next_speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """Closed-form ``(accel, steer)`` estimate of a logged transition, (..., A, 2).

        ``accel = clip((next_speed - prev.speed) / dt)``; the steer is the one whose yaw
        rate over the step reproduces ``wrap(next_yaw - prev.yaw)`` at the average speed
        the clipped accel yields: ``sin(beta) = dyaw * lr / (v dt)``, ``steer =
        atan(2 tan(beta))``, clipped; 0 where ``|v| < MIN_INVERSE_SPEED``. ``next_xy`` is
        not used: for a transition the model can produce, stepping with the result
        reproduces it up to float32 rounding.
        """
        del next_xy
        v0 = prev.speed.astype(F32)
        accel = (jnp.asarray(next_speed, F32) - v0) / self.dt
        accel = jnp.clip(accel, self.config.min_accel, self.config.max_accel)
        _, v = self._speeds(v0, accel)
        lr = 0.5 * jnp.maximum(jnp.asarray(length, F32), MIN_LENGTH)
        dyaw = wrap_angle(jnp.asarray(next_yaw, F32) - prev.yaw.astype(F32))
        moving = jnp.abs(v) >= MIN_INVERSE_SPEED
        safe_v = jnp.where(moving, v, 1.0)
        sin_beta = jnp.clip(dyaw * lr / (safe_v * self.dt), -0.999, 0.999)
        steer = jnp.arctan(2.0 * jnp.tan(jnp.arcsin(sin_beta)))
        max_steer = self.config.max_steer
        steer = jnp.where(moving, jnp.clip(steer, -max_steer, max_steer), 0.0)
        return jnp.stack([accel, steer], axis=-1).astype(F32)

    def action_from_accel_curvature(
        self, accel: jax.Array, curvature: jax.Array, speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """``(accel, steer)`` that realises a target acceleration and path curvature.

        The acceleration is clipped to ``[min_accel, max_accel]``. The steer follows from
        the centre-referenced geometry above (rear axle at ``length / 2``): the yaw rate
        ``v / lr * sin(beta)`` equals ``v * curvature`` for ``beta = asin(curvature *
        lr)`` (``curvature * lr`` clipped to +-0.99), and ``tan(steer) = 2 tan(beta)``.

        Args:
          accel: (..., A) float32, target acceleration, m/s^2.
          curvature: (..., A) float32, target path curvature, 1/m (> 0 turns left).
          speed: (..., A) float32, current speed (unused by this model).
          length: (..., A) float32, box length, metres.
        Returns:
          (..., A, 2) float32, clipped to ``[action_low, action_high]``.
        """
        del speed
        accel = jnp.clip(accel, self.config.min_accel, self.config.max_accel)
        lr = 0.5 * jnp.maximum(length, MIN_LENGTH)
        beta = jnp.arcsin(jnp.clip(curvature * lr, -0.99, 0.99))
        cont = jnp.stack([accel, jnp.arctan(2.0 * jnp.tan(beta))], axis=-1)
        return jnp.clip(cont, self.action_low, self.action_high)


@dataclasses.dataclass(frozen=True)
class DeltaLocalModel:
    """Local-frame displacement model; action ``(dx, dy, dyaw)`` per step.

    ``xy' = xy + R(yaw) @ (dx, dy)`` (rotation by the current yaw, so ``dx`` is along the
    heading and ``dy`` to the left), ``yaw' = wrap(yaw + dyaw)``, ``vel' = (xy' - xy) / dt``
    (world frame). ``steer`` and ``accel`` are set to 0: this model has neither. The
    length is unused.

    Attributes:
      dt: step length, seconds.
      config: ``DeltaLocalConfig``, the limits and bins.
    """

    dt: float = 0.1
    config: DeltaLocalConfig = DeltaLocalConfig()

    name = "delta_local"
    action_dim = 3

    @classmethod
    def from_config(cls, config: DynamicsConfig) -> DeltaLocalModel:
        """The model of ``config.dt`` and section ``config.delta_local``."""
        return cls(dt=config.dt, config=config.delta_local)

    @property
    def num_actions(self) -> int:
        """() int: ``dx_bins * dy_bins * dyaw_bins``."""
        c = self.config
        return c.dx_bins * c.dy_bins * c.dyaw_bins

    @property
    def action_high(self) -> jax.Array:
        """(3,) float32: ``(max_dx, max_dy, max_dyaw)``."""
        c = self.config
        return jnp.asarray([c.max_dx, c.max_dy, c.max_dyaw], F32)

    @property
    def action_low(self) -> jax.Array:
        """(3,) float32: ``-action_high``."""
        return -self.action_high

    def action_grid(self) -> jax.Array:
        """(dx_bins * dy_bins * dyaw_bins, 3) float32, dx varying slowest."""
        c = self.config
        return _grid(
            bins(-c.max_dx, c.max_dx, c.dx_bins),
            bins(-c.max_dy, c.max_dy, c.dy_bins),
            bins(-c.max_dyaw, c.max_dyaw, c.dyaw_bins),
        )

    def step(self, state: AgentState, action: jax.Array, length: jax.Array) -> AgentState:
        """Advance one step.

        Args:
          state: ``AgentState`` with (..., A) leading shape.
          action: (..., A, 3) ``(dx m, dy m, dyaw rad)`` in the agent frame, clipped.
          length: (..., A), unused (kept for the common interface).

        Returns:
          The next ``AgentState`` (same shapes, float32, ``valid`` unchanged).
        """
        del length
        action = jnp.asarray(action, F32)
        _check_action(action, state, self.action_dim, "DeltaLocalModel.step")
        action = jnp.clip(action, self.action_low, self.action_high)
        dx, dy, dyaw = action[..., 0], action[..., 1], action[..., 2]
        yaw = jnp.asarray(state.yaw, F32)
        c, s = jnp.cos(yaw), jnp.sin(yaw)
        disp = jnp.stack([c * dx - s * dy, s * dx + c * dy], axis=-1)
        zeros = jnp.zeros_like(yaw)
        return AgentState(
            xy=state.xy.astype(F32) + disp,
            yaw=wrap_angle(yaw + dyaw),
            vel=disp / self.dt,
            steer=zeros,
            accel=zeros,
            valid=state.valid,
        )

    def inverse(
        self, prev: AgentState, next_xy: jax.Array, next_yaw: jax.Array,
        next_speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """Exact ``(dx, dy, dyaw)`` of a transition, (..., A, 3), clipped to the limits.

        ``(dx, dy) = R(-yaw) @ (next_xy - xy)``, ``dyaw = wrap(next_yaw - yaw)``;
        ``next_speed`` and ``length`` are unused.
        """
        del next_speed, length
        yaw = prev.yaw.astype(F32)
        d = jnp.asarray(next_xy, F32) - prev.xy.astype(F32)
        c, s = jnp.cos(yaw), jnp.sin(yaw)
        dx = c * d[..., 0] + s * d[..., 1]
        dy = -s * d[..., 0] + c * d[..., 1]
        dyaw = wrap_angle(jnp.asarray(next_yaw, F32) - yaw)
        action = jnp.stack([dx, dy, dyaw], axis=-1)
        return jnp.clip(action, self.action_low, self.action_high).astype(F32)

    def action_from_accel_curvature(
        self, accel: jax.Array, curvature: jax.Array, speed: jax.Array, length: jax.Array,
    ) -> jax.Array:
        """``(dx, 0, dyaw)`` of one step at the target acceleration along a path of the
        target curvature.

        The acceleration is clipped to ``[min_accel, max_accel]`` (the section's
        controller bounds); ``v1 = max(speed + accel dt, 0)``, ``dx = v1 dt`` and
        ``dyaw = curvature * dx`` (the arc's turn).

        Args:
          accel: (..., A) float32, target acceleration, m/s^2.
          curvature: (..., A) float32, target path curvature, 1/m (> 0 turns left).
          speed: (..., A) float32, current speed, m/s.
          length: (..., A), unused.
        Returns:
          (..., A, 3) float32, clipped to ``[action_low, action_high]``.
        """
        del length
        accel = jnp.clip(accel, self.config.min_accel, self.config.max_accel)
        v1 = jnp.maximum(speed + accel * self.dt, 0.0)
        step = v1 * self.dt
        cont = jnp.stack([step, jnp.zeros_like(step), curvature * step], axis=-1)
        return jnp.clip(cont, self.action_low, self.action_high)


DynamicsFactory = Callable[[DynamicsConfig], DynamicsModel]

DYNAMICS_MODELS: dict[str, DynamicsFactory] = {}


def register(name: str, factory: DynamicsFactory) -> DynamicsFactory:
    """Register ``factory(config) -> model`` under ``name``; duplicate names are errors."""
    if name in DYNAMICS_MODELS:
        raise ValueError(f"dynamics model '{name}' is already registered.")
    DYNAMICS_MODELS[name] = factory
    return factory


register("bicycle", BicycleModel.from_config)
register("delta_local", DeltaLocalModel.from_config)


def make_dynamics(config: DynamicsConfig) -> DynamicsModel:
    """Build the model named by ``config.model``."""
    if config.model not in DYNAMICS_MODELS:
        check_choice("model", config.model, tuple(DYNAMICS_MODELS))
    return DYNAMICS_MODELS[config.model](config)


def check_model(model: DynamicsModel, config: DynamicsConfig) -> DynamicsModel:
    """An injected model, checked against the env's ``DynamicsConfig``; returns it.

    The env's step length is ``config.dt`` (other layers, e.g. the planning score, read
    it there), so a model with a ``dt`` attribute must agree with it; a model without
    one is taken as stepping by ``config.dt``. The model replaces the one
    ``config.model`` and its section describe (they are then unused); ``action_space``
    still comes from the config.

    Raises:
      ConfigError: the model's ``dt`` differs from ``config.dt``.
    """
    dt = getattr(model, "dt", None)
    if dt is not None and abs(float(dt) - float(config.dt)) > 1e-12:
        raise ConfigError(
            f"the injected dynamics model {type(model).__name__} steps by dt = {dt!r} but "
            f"config key 'dynamics.dt' = {config.dt!r}; build the model with the config's "
            "dt or set dynamics.dt to match."
        )
    return model


def discrete_to_continuous(model: DynamicsModel, index: jax.Array) -> jax.Array:
    """(..., A) int indices -> (..., A, action_dim) float32 grid actions.

    Out-of-range indices are clipped to ``[0, num_actions - 1]``.
    """
    return jnp.take(model.action_grid(), jnp.asarray(index), axis=0, mode="clip")


def apply_action(
    model: DynamicsModel, config: DynamicsConfig, state: AgentState, action: jax.Array,
    length: jax.Array,
) -> AgentState:
    """Step ``model`` with a discrete or continuous action per ``config.action_space``.

    Args:
      model: from ``make_dynamics(config)``.
      config: its ``DynamicsConfig``.
      state: ``AgentState`` with (..., A) leading shape.
      action: ``"discrete"``: (..., A) integer indices into ``model.action_grid()``;
        ``"continuous"``: (..., A, action_dim) floats.
      length: (..., A) box length, metres.

    Raises:
      ValueError / TypeError at trace time for a wrong action shape / dtype.
    """
    action = jnp.asarray(action)
    agents = tuple(state.yaw.shape)
    if config.action_space == "discrete":
        if not jnp.issubdtype(action.dtype, jnp.integer):
            raise TypeError(
                f"discrete action must be an integer array of shape (..., A) = {agents} "
                f"(indices into the {model.num_actions}-action grid), got dtype {action.dtype}."
            )
        if tuple(action.shape) != agents:
            raise ValueError(
                f"discrete action has shape {tuple(action.shape)}, expected (..., A) = "
                f"{agents} int32 indices."
            )
        action = discrete_to_continuous(model, action)
    else:
        if not jnp.issubdtype(action.dtype, jnp.floating):
            raise TypeError(
                f"continuous action must be a float32 array of shape (..., A, action_dim) = "
                f"{agents + (model.action_dim,)}, got dtype {action.dtype}."
            )
        if tuple(action.shape) != agents + (model.action_dim,):
            raise ValueError(
                f"continuous action has shape {tuple(action.shape)}, expected "
                f"(..., A, action_dim) = {agents + (model.action_dim,)} float32."
            )
    return model.step(state, action, length)
