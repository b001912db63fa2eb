"""Tests for jaxdrive.sim.dynamics: hand-computed steps, grids, inverses, invariants, errors."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive.config import ConfigError
from jaxdrive.sim import dynamics as dyn
from jaxdrive.sim.dynamics import (
    DYNAMICS_MODELS,
    BicycleConfig,
    BicycleModel,
    DeltaLocalConfig,
    DeltaLocalModel,
    DynamicsConfig,
    apply_action,
    discrete_to_continuous,
    make_dynamics,
    register,
    wrap_angle,
)
from jaxdrive.types import AgentState

BICYCLE = make_dynamics(DynamicsConfig(model="bicycle"))
DELTA = make_dynamics(DynamicsConfig(model="delta_local"))


# Jitted entry points (models are hashable, so static): eager op-by-op dispatch would compile
# every primitive separately and dominate the test time.
STEP = jax.jit(lambda model, state, action, length: model.step(state, action, length),
               static_argnums=0)
INVERSE = jax.jit(lambda model, *args: model.inverse(*args), static_argnums=0)


def make_state(xy, yaw, speed, valid=None):
    """AgentState with velocity along the heading; inputs are (..., A, 2), (..., A), (..., A)."""
    xy = np.asarray(xy, np.float32)
    yaw = np.asarray(yaw, np.float32)
    speed = np.asarray(speed, np.float32)
    vel = speed[..., None] * np.stack([np.cos(yaw), np.sin(yaw)], axis=-1)
    zeros = np.zeros_like(yaw)
    if valid is None:
        valid = np.ones(yaw.shape, bool)
    return jax.tree.map(
        jnp.asarray, AgentState(xy=xy, yaw=yaw, vel=vel, steer=zeros, accel=zeros, valid=valid)
    )


def one(x, y, yaw, speed):
    return make_state([[x, y]], [yaw], [speed])


def step1(model, state, action, length=4.0):
    return STEP(model, state, jnp.asarray([action], jnp.float32), jnp.asarray([length]))


def random_states(seed, shape, max_speed=30.0):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(-50.0, 50.0, shape + (2,))
    yaw = rng.uniform(-math.pi, math.pi, shape)
    speed = rng.uniform(0.0, max_speed, shape)
    valid = np.arange(math.prod(shape)).reshape(shape) % 3 != 0
    return make_state(xy, yaw, speed, valid)


def random_actions(seed, model, shape):
    u = np.random.default_rng(seed).uniform(size=shape + (model.action_dim,))
    low, high = np.asarray(model.action_low), np.asarray(model.action_high)
    return jnp.asarray(low + u * (high - low), jnp.float32)


# ----------------------------------------------------------------- bicycle, by hand


def test_bicycle_straight_constant_accel():
    # v0 = 10, a = 2, dt = 0.1, steer 0: v1 = 10 + 2 * 0.1 = 10.2; the position uses the
    # average speed (10 + 10.2) / 2 = 10.1, so x = 10.1 * 0.1 = 1.01 (= v0 dt + a dt^2 / 2).
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), [2.0, 0.0])
    np.testing.assert_allclose(s.xy[0], [1.01, 0.0], atol=1e-6)
    np.testing.assert_allclose(s.yaw[0], 0.0, atol=1e-7)
    np.testing.assert_allclose(s.vel[0], [10.2, 0.0], atol=1e-5)
    np.testing.assert_allclose(s.speed[0], 10.2, atol=1e-5)
    np.testing.assert_allclose([s.accel[0], s.steer[0]], [2.0, 0.0])


def test_bicycle_steer_known_angle():
    # steer = atan(0.4), length 4 -> lf = lr = 2, beta = atan(2/4 * 0.4) = atan(0.2)
    # = 0.1973956; sin(beta) = 0.2 / sqrt(1.04) = 0.1961161, cos(beta) = 1 / sqrt(1.04)
    # = 0.9805807. v0 = 10, a = 0 -> v = 10, v dt = 1.
    # x = 1 * cos(beta) = 0.9805807, y = 1 * sin(beta) = 0.1961161,
    # yaw = v / lr * sin(beta) * dt = 10 / 2 * 0.1961161 * 0.1 = 0.0980581.
    steer = math.atan(0.4)
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), [0.0, steer], length=4.0)
    np.testing.assert_allclose(s.xy[0], [0.9805807, 0.1961161], atol=1e-6)
    np.testing.assert_allclose(s.yaw[0], 0.0980581, atol=1e-6)
    # vel lies along the new heading with the new speed 10.
    np.testing.assert_allclose(s.vel[0], [10 * math.cos(0.0980581), 10 * math.sin(0.0980581)],
                               atol=1e-5)
    np.testing.assert_allclose(s.steer[0], steer, atol=1e-7)


def test_bicycle_heading_north():
    # yaw = pi/2 at (1, 2), v0 = 5, a = 0, steer = atan(0.4) (beta as above), length 4.
    # v dt = 0.5; direction pi/2 + beta -> (cos, sin) = (-sin(beta), cos(beta)):
    # x = 1 - 0.5 * 0.1961161 = 0.9019419, y = 2 + 0.5 * 0.9805807 = 2.4902904,
    # yaw = pi/2 + 5 / 2 * 0.1961161 * 0.1 = 1.5707963 + 0.0490290 = 1.6198253.
    s = step1(BICYCLE, one(1.0, 2.0, math.pi / 2, 5.0), [0.0, math.atan(0.4)])
    np.testing.assert_allclose(s.xy[0], [0.9019419, 2.4902904], atol=1e-6)
    np.testing.assert_allclose(s.yaw[0], 1.6198253, atol=1e-6)
    # Straight north, steer 0: (1, 2) -> (1, 2.5), vel (0, 5).
    s = step1(BICYCLE, one(1.0, 2.0, math.pi / 2, 5.0), [0.0, 0.0])
    np.testing.assert_allclose(s.xy[0], [1.0, 2.5], atol=1e-6)
    np.testing.assert_allclose(s.vel[0], [0.0, 5.0], atol=1e-5)


def test_bicycle_speed_clipped_at_max_speed():
    # v0 = 29.9, a = 4: 29.9 + 0.4 = 30.3 -> clipped to 30; average 29.95 -> x = 2.995.
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 29.9), [4.0, 0.0])
    np.testing.assert_allclose(s.speed[0], 30.0, atol=1e-5)
    np.testing.assert_allclose(s.xy[0, 0], 2.995, atol=1e-5)


def test_bicycle_no_reverse_by_default():
    # v0 = 0.3, a = -6: 0.3 - 0.6 = -0.3 -> clipped to 0 (max_reverse_speed = 0);
    # average 0.15 -> x = 0.015. A stopped agent that keeps braking stays put.
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 0.3), [-6.0, 0.0])
    np.testing.assert_allclose(s.speed[0], 0.0, atol=1e-7)
    np.testing.assert_allclose(s.xy[0], [0.015, 0.0], atol=1e-6)
    s2 = step1(BICYCLE, s, [-6.0, 0.3])
    np.testing.assert_allclose(s2.xy[0], s.xy[0], atol=1e-7)
    np.testing.assert_allclose(s2.speed[0], 0.0, atol=1e-7)


def test_bicycle_reverse_when_allowed():
    # max_reverse_speed = 5: v0 = 0, a = -6 -> v1 = -0.6, average -0.3 -> x = -0.03.
    model = make_dynamics(DynamicsConfig(bicycle=BicycleConfig(max_reverse_speed=5.0)))
    s = step1(model, one(0.0, 0.0, 0.0, 0.0), [-6.0, 0.0])
    np.testing.assert_allclose(s.speed[0], -0.6, atol=1e-6)
    np.testing.assert_allclose(s.xy[0], [-0.03, 0.0], atol=1e-6)


def test_bicycle_action_clipped_to_limits():
    # accel 10 -> max_accel 4, steer 1.0 -> max_steer 0.6; accel -100 -> -6, steer -> -0.6.
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), [10.0, 1.0])
    np.testing.assert_allclose([s.accel[0], s.steer[0]], [4.0, 0.6], atol=1e-7)
    ref = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), [4.0, 0.6])
    np.testing.assert_allclose(s.xy, ref.xy)
    np.testing.assert_allclose(s.yaw, ref.yaw)
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), [-100.0, -1.0])
    np.testing.assert_allclose([s.accel[0], s.steer[0]], [-6.0, -0.6], atol=1e-7)


def test_bicycle_yaw_wraps_across_pi():
    # yaw0 = 3.1, v = 10, steer = atan(0.4), length 4: dyaw = 0.0980581 (see above) ->
    # 3.1980581 - 2 pi = -3.0851272.
    s = step1(BICYCLE, one(0.0, 0.0, 3.1, 10.0), [0.0, math.atan(0.4)])
    np.testing.assert_allclose(s.yaw[0], -3.0851272, atol=1e-6)


def test_bicycle_zero_length_padding_stays_finite():
    # Eager (not jitted) on purpose: the model also runs op by op.
    s = BICYCLE.step(one(0.0, 0.0, 0.0, 30.0), jnp.asarray([[4.0, 0.6]]), jnp.zeros((1,)))
    for leaf in (s.xy, s.yaw, s.vel, s.steer, s.accel):
        assert bool(jnp.all(jnp.isfinite(leaf)))


# ------------------------------------------------------------- delta_local, by hand


def test_delta_local_heading_north():
    # yaw = pi/2: R(yaw) @ (1, 0.5) = (cos*1 - sin*0.5, sin*1 + cos*0.5) = (-0.5, 1.0);
    # from (2, 3) -> (1.5, 4.0); yaw = pi/2 + 0.1 = 1.6707963; vel = (-0.5, 1.0) / 0.1.
    s = step1(DELTA, one(2.0, 3.0, math.pi / 2, 0.0), [1.0, 0.5, 0.1])
    np.testing.assert_allclose(s.xy[0], [1.5, 4.0], atol=1e-6)
    np.testing.assert_allclose(s.yaw[0], 1.6707963, atol=1e-6)
    np.testing.assert_allclose(s.vel[0], [-5.0, 10.0], atol=1e-5)
    np.testing.assert_allclose([s.steer[0], s.accel[0]], [0.0, 0.0])


def test_delta_local_clips_and_wraps():
    # dx 5 -> 3, dy -2 -> -0.5, dyaw 1 -> 0.3; yaw 3.0 + 0.3 = 3.3 - 2 pi = -2.9831853.
    # Displacement R(3.0) @ (3, -0.5) = (3 cos3 + 0.5 sin3, 3 sin3 - 0.5 cos3)
    # = (-2.9699774 + 0.0705600, 0.4233600 + 0.4949962) = (-2.8994174, 0.9183562).
    s = step1(DELTA, one(0.0, 0.0, 3.0, 0.0), [5.0, -2.0, 1.0])
    np.testing.assert_allclose(s.xy[0], [-2.8994174, 0.9183562], atol=1e-5)
    np.testing.assert_allclose(s.yaw[0], -2.9831853, atol=1e-6)


def test_wrap_angle():
    x = jnp.asarray([math.pi, -math.pi, 3 * math.pi, 0.5, -0.5, 2 * math.pi + 0.25], jnp.float32)
    y = np.asarray(wrap_angle(x))
    np.testing.assert_allclose(y, [math.pi, math.pi, math.pi, 0.5, -0.5, 0.25], atol=2e-6)
    assert np.all(y > -math.pi) and np.all(y <= math.pi)
    r = wrap_angle(np.random.default_rng(0).uniform(-50.0, 50.0, 1000).astype(np.float32))
    assert bool(jnp.all((r > -math.pi) & (r <= math.pi)))


# --------------------------------------------------------------------- action grids


@pytest.mark.parametrize("model", [BICYCLE, DELTA], ids=["bicycle", "delta_local"])
def test_action_grid(model):
    grid = model.action_grid()
    assert grid.shape == (model.num_actions, model.action_dim)
    assert grid.dtype == jnp.float32
    assert bool(jnp.any(jnp.all(grid == 0.0, axis=-1))), "zero action missing"
    np.testing.assert_array_equal(grid.min(axis=0), model.action_low)
    np.testing.assert_array_equal(grid.max(axis=0), model.action_high)
    assert len({tuple(r) for r in np.asarray(grid).tolist()}) == model.num_actions


def test_bicycle_grid_bins():
    # Asymmetric accel range [-6, 4], 7 bins: 3 evenly on [-6, 0), 0, 3 evenly on (0, 4].
    grid = np.asarray(BICYCLE.action_grid())
    assert grid.shape == (7 * 13, 2)
    np.testing.assert_allclose(np.unique(grid[:, 0]), [-6, -4, -2, 0, 4 / 3, 8 / 3, 4], atol=1e-6)
    np.testing.assert_allclose(np.unique(grid[:, 1]), np.linspace(-0.6, 0.6, 13), atol=1e-6)
    # accel varies slowest: index = i_accel * 13 + i_steer.
    np.testing.assert_allclose(grid[3 * 13 + 6], [0.0, 0.0], atol=1e-7)


@pytest.mark.parametrize("model", [BICYCLE, DELTA], ids=["bicycle", "delta_local"])
def test_discrete_to_continuous_round_trip(model):
    grid = model.action_grid()
    idx = jnp.arange(model.num_actions, dtype=jnp.int32).reshape(-1, 1)  # (N, A=1)
    act = discrete_to_continuous(model, idx)
    assert act.shape == (model.num_actions, 1, model.action_dim)
    np.testing.assert_array_equal(act[:, 0], grid)
    # Back to the index by nearest grid point.
    back = jnp.argmin(jnp.sum((act[:, 0, None, :] - grid[None]) ** 2, axis=-1), axis=-1)
    np.testing.assert_array_equal(back, idx[:, 0])


def test_apply_action_discrete_matches_grid_step():
    config = DynamicsConfig(model="bicycle", action_space="discrete")
    state = random_states(1, (5,))
    idx = jnp.asarray([0, 45, 90, 13, 77], jnp.int32)
    length = jnp.full((5,), 4.5)
    got = jax.jit(apply_action, static_argnums=(0, 1))(BICYCLE, config, state, idx, length)
    want = STEP(BICYCLE, state, BICYCLE.action_grid()[idx], length)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def test_apply_action_continuous():
    config = DynamicsConfig(model="delta_local", action_space="continuous")
    state = random_states(2, (4,))
    act = random_actions(3, DELTA, (4,))
    got = jax.jit(apply_action, static_argnums=(0, 1))(DELTA, config, state, act, jnp.ones((4,)))
    want = STEP(DELTA, state, act, jnp.ones((4,)))
    jax.tree.map(np.testing.assert_array_equal, got, want)


# -------------------------------------------------------------------------- inverse


def test_delta_local_inverse_exact():
    state = random_states(4, (64,))
    act = random_actions(5, DELTA, (64,))
    length = jnp.full((64,), 4.0)
    nxt = STEP(DELTA, state, act, length)
    inv = INVERSE(DELTA, state, nxt.xy, nxt.yaw, nxt.speed, length)
    assert inv.shape == (64, 3) and inv.dtype == jnp.float32
    np.testing.assert_allclose(inv, act, atol=1e-5)
    again = STEP(DELTA, state, inv, length)
    np.testing.assert_allclose(again.xy, nxt.xy, atol=1e-5)
    np.testing.assert_allclose(wrap_angle(again.yaw - nxt.yaw), 0.0, atol=1e-5)


def test_bicycle_inverse_round_trip():
    # Transitions the model can produce are reproduced up to float32 rounding: positions
    # reach 53 m (ulp ~4e-6 m) and the steer is recovered from a yaw difference with error
    # ~ulp(pi) = 2.4e-7 rad, which moves the position by at most lr * 2.4e-7 ~ 1e-6 m at
    # any speed. Where |v| < MIN_INVERSE_SPEED = 1e-3 m/s the steer is returned as 0, which
    # moves the point by at most |v| dt |beta_max| = 1e-3 * 0.1 * 0.33 = 3.3e-5 m. So 1e-4 m
    # (the largest error seen over 20k draws was 1.2e-5 m).
    n = 256
    state = random_states(6, (n,))
    # Include agents at rest so that braking clips the speed at 0.
    state = make_state(state.xy, state.yaw, state.speed.at[:16].set(0.0))
    act = random_actions(7, BICYCLE, (n,))
    length = jnp.asarray(np.random.default_rng(8).uniform(0.5, 6.0, n), jnp.float32)
    nxt = STEP(BICYCLE, state, act, length)
    inv = INVERSE(BICYCLE, state, nxt.xy, nxt.yaw, nxt.speed, length)
    assert inv.shape == (n, 2) and inv.dtype == jnp.float32
    again = STEP(BICYCLE, state, inv, length)
    np.testing.assert_allclose(again.xy, nxt.xy, atol=1e-4)
    np.testing.assert_allclose(again.speed, nxt.speed, atol=1e-4)
    np.testing.assert_allclose(wrap_angle(again.yaw - nxt.yaw), 0.0, atol=1e-4)
    # Where the speed limits did not bind and the agent moves, the action itself comes back.
    v1 = state.speed + act[:, 0] * 0.1
    free = (v1 > 0.5) & (v1 < 30.0)
    np.testing.assert_allclose(inv[free], act[free], atol=1e-3)


# ----------------------------------------------------------------------- invariants


@pytest.mark.parametrize("model", [BICYCLE, DELTA], ids=["bicycle", "delta_local"])
def test_invariants_dtypes_valid_finite(model):
    state = random_states(7, (8,))
    act = random_actions(8, model, (8,)) * 3.0  # also out of range
    nxt = STEP(model, state, act, jnp.full((8,), 4.0))
    np.testing.assert_array_equal(nxt.valid, state.valid)
    assert nxt.valid.dtype == jnp.bool_
    for name in ("xy", "yaw", "vel", "steer", "accel"):
        leaf = getattr(nxt, name)
        assert leaf.dtype == jnp.float32, name
        assert leaf.shape == getattr(state, name).shape, name
        assert bool(jnp.all(jnp.isfinite(leaf))), name
    assert model.action_low.dtype == model.action_high.dtype == jnp.float32


@pytest.mark.parametrize("model", [BICYCLE, DELTA], ids=["bicycle", "delta_local"])
def test_jit_and_vmap_match_unbatched(model):
    B, A = 3, 5
    states = random_states(9, (B, A))
    acts = random_actions(10, model, (B, A))
    lengths = jnp.asarray(np.random.default_rng(11).uniform(1.0, 5.0, (B, A)), jnp.float32)
    vmapped = jax.jit(jax.vmap(model.step))(states, acts, lengths)
    batched = STEP(model, states, acts, lengths)  # (..., A) leading shapes directly
    for b in range(B):
        state_b = jax.tree.map(lambda x, b=b: x[b], states)
        ref = STEP(model, state_b, acts[b], lengths[b])
        for got in (vmapped, batched):
            jax.tree.map(lambda g, r, b=b: np.testing.assert_array_equal(g[b], r), got, ref)
        # Eager dispatch rounds the yaw update differently from XLA's fused kernel by up to
        # 2 ulp(pi) = 4.8e-7 rad, which moves vel = v (cos yaw, sin yaw) by 30 * 4.8e-7.
        eager = model.step(state_b, acts[b], lengths[b])
        jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, rtol=0, atol=2e-5), eager, ref)


def test_jitted_step_traces_once():
    traces = []
    config = DynamicsConfig(model="bicycle", action_space="discrete")

    @jax.jit
    def f(state, idx, length):
        traces.append(1)
        return apply_action(BICYCLE, config, state, idx, length)

    length = jnp.full((4,), 4.0)
    s0 = random_states(12, (4,))
    s1 = f(s0, jnp.asarray([1, 2, 3, 4], jnp.int32), length)
    f(s1, jnp.asarray([5, 6, 7, 8], jnp.int32), length)
    assert len(traces) == 1


def test_models_are_hashable_static_args():
    step = jax.jit(apply_action, static_argnums=(0, 1))
    config = DynamicsConfig(model="delta_local", action_space="continuous")
    model = make_dynamics(config)
    assert model == make_dynamics(config) and hash(model) == hash(make_dynamics(config))
    out = step(model, config, random_states(13, (2,)),
               jnp.zeros((2, 3)), jnp.ones((2,)))
    assert out.xy.shape == (2, 2)


# ------------------------------------------------------------------ config, registry


def test_config_defaults_and_from_dict():
    c = DynamicsConfig.from_dict({"model": "delta_local", "dt": 0.2,
                                  "delta_local": {"max_dx": 5.0}})
    assert (c.model, c.dt, c.delta_local.max_dx, c.action_space) == (
        "delta_local", 0.2, 5.0, "discrete")
    assert c.bicycle == BicycleConfig()
    m = make_dynamics(c)
    assert isinstance(m, DeltaLocalModel) and m.dt == 0.2 and m.config.max_dx == 5.0
    assert m.config == c.delta_local
    b = make_dynamics(DynamicsConfig.from_dict({"dt": 0.05, "bicycle": {"max_steer": 0.5}}))
    assert isinstance(b, BicycleModel) and b.dt == 0.05 and b.config.max_steer == 0.5
    assert isinstance(make_dynamics(DynamicsConfig()), BicycleModel)
    assert DynamicsConfig.from_dict(c.to_dict()) == c
    assert set(c.to_dict()) == {"model", "dt", "action_space", "bicycle", "delta_local"}


@pytest.mark.parametrize(
    "data, key",
    [
        ({"model": "bicyle"}, "model"),
        ({"action_space": "box"}, "action_space"),
        ({"dt": 0.0}, "dt"),
        ({"bicycle": {"max_steer": 0.0}}, "max_steer"),
        ({"bicycle": {"max_steer": 2.0}}, "max_steer"),
        ({"bicycle": {"max_accel": -1.0}}, "max_accel"),
        ({"bicycle": {"min_accel": 1.0}}, "min_accel"),
        ({"bicycle": {"min_accel": 0.0}}, "min_accel"),
        ({"bicycle": {"max_speed": 0.0}}, "max_speed"),
        ({"bicycle": {"max_reverse_speed": -1.0}}, "max_reverse_speed"),
        ({"bicycle": {"accel_bins": 6}}, "accel_bins"),
        ({"bicycle": {"steer_bins": 1}}, "steer_bins"),
        ({"delta_local": {"dx_bins": 2.5}}, "dx_bins"),
        ({"delta_local": {"max_dyaw": 4.0}}, "max_dyaw"),
        ({"delta_local": {"max_dy": 0.0}}, "max_dy"),
        ({"delta_local": {"min_accel": 0.0}}, "min_accel"),
    ],
)
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        DynamicsConfig.from_dict(data)


def test_config_sections_validate_on_construction():
    with pytest.raises(ConfigError, match="'max_steer'"):
        BicycleConfig(max_steer=2.0)
    with pytest.raises(ConfigError, match="'dx_bins'"):
        DeltaLocalConfig(dx_bins=4)


def test_config_unknown_key_and_model_suggestion():
    with pytest.raises(ConfigError, match="unknown config key 'bicycle.max_stear'.*max_steer"):
        DynamicsConfig.from_dict({"bicycle": {"max_stear": 0.5}})
    with pytest.raises(ConfigError, match="Did you mean 'bicycle'"):
        DynamicsConfig.from_dict({"model": "bicyle"})


@pytest.mark.parametrize(
    "key, new",
    [
        ("max_steer", r"'dynamics\.bicycle\.max_steer'"),
        ("accel_bins", r"'dynamics\.bicycle\.accel_bins'"),
        ("max_dx", r"'dynamics\.delta_local\.max_dx'"),
        ("max_accel",
         r"'dynamics\.bicycle\.max_accel' or 'dynamics\.delta_local\.max_accel'"),
    ],
)
def test_old_flat_keys_name_their_new_key(key, new):
    from jaxdrive.env import EnvConfig

    with pytest.raises(ConfigError, match=rf"'dynamics\.{key}' has moved.*set {new}"):
        EnvConfig.from_dict({"dynamics": {"model": "bicycle", key: 1.0}})
    with pytest.raises(ConfigError, match=rf"'bicycle\.{key}'|'delta_local\.{key}'"):
        DynamicsConfig.from_dict({key: 1.0})


def test_register_refuses_duplicates():
    assert set(DYNAMICS_MODELS) >= {"bicycle", "delta_local"}
    with pytest.raises(ValueError, match="'bicycle' is already registered"):
        register("bicycle", BicycleModel.from_config)


def test_register_new_model_is_accepted_by_config():
    name = "test_only_bicycle_alias"
    register(name, BicycleModel.from_config)
    try:
        assert isinstance(make_dynamics(DynamicsConfig(model=name)), BicycleModel)
    finally:
        del dyn.DYNAMICS_MODELS[name]


# ------------------------------------------------------------------- action errors


def test_step_wrong_action_shape():
    state = random_states(14, (4,))
    with pytest.raises(ValueError, match=r"expected \(\.\.\., A, action_dim\) = \(4, 2\)"):
        BICYCLE.step(state, jnp.zeros((4, 3)), jnp.ones((4,)))
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        DELTA.step(state, jnp.zeros((3,)), jnp.ones((4,)))


def test_apply_action_wrong_shape_or_dtype():
    state = random_states(15, (4,))
    length = jnp.ones((4,))
    disc = DynamicsConfig(model="bicycle", action_space="discrete")
    cont = DynamicsConfig(model="bicycle", action_space="continuous")
    with pytest.raises(TypeError, match=r"integer array of shape \(\.\.\., A\) = \(4,\)"):
        apply_action(BICYCLE, disc, state, jnp.zeros((4,), jnp.float32), length)
    with pytest.raises(ValueError, match=r"expected \(\.\.\., A\) = \(4,\) int32"):
        apply_action(BICYCLE, disc, state, jnp.zeros((4, 2), jnp.int32), length)
    with pytest.raises(TypeError, match="float32 array"):
        apply_action(BICYCLE, cont, state, jnp.zeros((4, 2), jnp.int32), length)
    # Raised at trace time under jit as well.
    f = jax.jit(lambda s, a: apply_action(BICYCLE, cont, s, a, length))
    with pytest.raises(ValueError, match=r"expected \(\.\.\., A, action_dim\) = \(4, 2\)"):
        f(state, jnp.zeros((4, 3), jnp.float32))


# ------------------------------------------------ controller conversion, injected models


def test_action_from_accel_curvature_hand_computed():
    accel = jnp.asarray([10.0, -100.0, 1.0])
    curvature = jnp.asarray([0.1, 0.0, -0.1])
    speed = jnp.asarray([10.0, 0.1, 5.0])
    length = jnp.asarray([4.0, 4.0, 4.0])
    # Bicycle, lr = 2: accel 10 -> 4, -100 -> -6; curvature 0.1 -> beta = asin(0.2) =
    # 0.2013579, steer = atan(2 tan(beta)) = atan(0.4082483) = 0.3875967.
    got = np.asarray(BICYCLE.action_from_accel_curvature(accel, curvature, speed, length))
    np.testing.assert_allclose(got, [[4.0, 0.3875967], [-6.0, 0.0], [1.0, -0.3875967]],
                               atol=1e-6)
    # That steer turns at v * curvature: from 10 m/s at accel 4, the average speed is
    # 10.2 and the yaw change 10.2 * 0.1 * 0.1 = 0.102.
    s = step1(BICYCLE, one(0.0, 0.0, 0.0, 10.0), got[0])
    np.testing.assert_allclose(s.yaw[0], 0.102, atol=1e-6)
    # Delta-local: accel clipped to [-6, 4]; v1 = max(speed + accel dt, 0), dx = v1 dt,
    # dyaw = curvature dx: (10.4 -> dx 1.04, dyaw 0.104), (0.1 - 0.6 -> 0), (5.1 -> 0.51,
    # dyaw -0.051).
    got = np.asarray(DELTA.action_from_accel_curvature(accel, curvature, speed, length))
    np.testing.assert_allclose(got, [[1.04, 0.0, 0.104], [0.0, 0.0, 0.0],
                                     [0.51, 0.0, -0.051]], atol=1e-6)
    assert got.dtype == np.float32


@dataclasses.dataclass(frozen=True)
class HalfAccelBicycle(BicycleModel):
    """The bicycle model that realises half the commanded acceleration."""

    def step(self, state, action, length):
        action = jnp.asarray(action, jnp.float32) * jnp.asarray([0.5, 1.0], jnp.float32)
        return super().step(state, action, length)


def test_env_steps_with_an_injected_model():
    from scenes import CAR, SMALL_ENV, SMALL_SCENARIO, straight_road

    from jaxdrive.env import Env, EnvConfig
    from jaxdrive.scenarios.pool import make_pool

    config = EnvConfig.from_dict(dict(SMALL_ENV, control_mode="sdc",
                                      dynamics={"action_space": "continuous"}))
    scene = straight_road(SMALL_SCENARIO, [(0.0, -2.0, 0.0, 10.0, *CAR)])
    pool = make_pool(jax.tree.map(lambda x: jnp.asarray(x)[None], scene), config.road_index)
    action = jnp.zeros((SMALL_SCENARIO.max_agents, 2)).at[:, 0].set(2.0)
    speeds = {}
    for name, model in (("default", None),
                        ("half", HalfAccelBicycle.from_config(config.dynamics))):
        env = Env(config, dynamics=model)
        assert env.dynamics == (model or BICYCLE)
        assert env.action_shape == (2,) and env.num_actions == BICYCLE.num_actions
        params = env.make_params(pool)
        # reset_to jitted: run eagerly its ~200 operations compile one by one.
        state, _ = jax.jit(env.reset_to)(params, jnp.int32(0), jax.random.key(0))
        state, _ = jax.jit(env.step)(params, state, action)
        speeds[name] = float(state.agents.speed[0])
    # 10 m/s, accel 2 for 0.1 s: 10.2 by default, 10.1 with the injected model.
    np.testing.assert_allclose(speeds["default"], 10.2, atol=1e-5)
    np.testing.assert_allclose(speeds["half"], 10.1, atol=1e-5)


def test_env_rejects_an_injected_model_with_another_dt():
    from jaxdrive.env import Env, EnvConfig

    with pytest.raises(ConfigError, match=r"dt = 0\.2.*'dynamics\.dt' = 0\.1"):
        Env(EnvConfig(), dynamics=BicycleModel(dt=0.2))
    # A model without a dt steps by the config's.
    Env(EnvConfig(), dynamics=DeltaLocalModel(dt=0.1))


def test_run_directories_saved_in_the_flat_dynamics_layout_still_load(tmp_path):
    """A run saved before the per-model sections (flat dynamics keys) reads back with
    each key in its model's section; the same layout in a new config file is an error."""
    import yaml

    from jaxdrive.config import ConfigError
    from jaxdrive.env import EnvConfig
    from jaxdrive.runs.load import read_run_config

    flat = {"model": "delta_local", "dt": 0.1, "action_space": "discrete", "max_accel": 3.0,
            "min_accel": -5.0, "max_steer": 0.5, "accel_bins": 5, "max_dx": 2.5,
            "dx_bins": 11}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"dynamics": flat}}))
    d = read_run_config(tmp_path).env.dynamics
    assert (d.model, d.bicycle.max_accel, d.bicycle.min_accel, d.bicycle.max_steer,
            d.bicycle.accel_bins) == ("delta_local", 3.0, -5.0, 0.5, 5)
    assert (d.delta_local.max_dx, d.delta_local.dx_bins, d.delta_local.max_accel,
            d.delta_local.min_accel) == (2.5, 11, 3.0, -5.0)
    with pytest.raises(ConfigError, match="dynamics.bicycle.max_steer"):
        EnvConfig.from_dict({"dynamics": {"max_steer": 0.5}})
