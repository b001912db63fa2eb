"""The challenge's reference agents computed from the log (jaxdrive.metrics.references),
against hand-computed trajectories."""

import jax
import numpy as np

from jaxdrive.metrics import references

T = 6
INIT = 1
STEPS = 4  # steps 2 .. 5


def _log():
    """Object 0 valid at steps 0, 1, 4 (a gap at 2-3, gone at 5), at x = step; object 1
    appears at step 2 (not valid at INIT)."""
    valid = np.array([[1, 1, 0, 0, 1, 0], [0, 0, 1, 1, 1, 1]], bool)
    x = np.tile(np.arange(T, dtype=np.float32), (2, 1))
    xy = np.stack([x, 10.0 * np.arange(2, dtype=np.float32)[:, None] + 0 * x], -1)
    yaw = np.array([[0.1 * t for t in range(T)], [0.5] * T], np.float32)
    vel = np.zeros((2, T, 2), np.float32)
    vel[0, INIT] = (2.0, -1.0)
    return xy, yaw, vel, valid


def test_logged_oracle_holds_the_last_valid_state_and_simulates_start_present_objects():
    xy, yaw, _, valid = _log()
    out_xy, out_yaw, out_valid = jax.jit(references.logged_oracle, static_argnums=(3, 4))(
        xy, yaw, valid, INIT, STEPS)
    # Steps 2, 3 hold step 1 (x 1, yaw 0.1); step 4 is logged; step 5 holds step 4.
    np.testing.assert_array_equal(np.asarray(out_xy)[0, :, 0], [1, 1, 4, 4])
    np.testing.assert_allclose(np.asarray(out_yaw)[0], [0.1, 0.1, 0.4, 0.4], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out_valid), [[True] * 4, [False] * 4])


def test_constant_velocity_extrapolates_the_logged_velocity_vector():
    xy, yaw, vel, valid = _log()
    out_xy, out_yaw, out_valid = jax.jit(references.constant_velocity,
                                         static_argnums=(4, 5, 6))(
        xy, yaw, vel, valid, INIT, STEPS, 0.1)
    k = np.arange(1, STEPS + 1)
    # From (1, 0) at (2, -1) m/s, 0.1 s per step.
    np.testing.assert_allclose(np.asarray(out_xy)[0], np.stack([1 + 0.2 * k, -0.1 * k], -1),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out_yaw)[0], [0.1] * STEPS, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out_valid), [[True] * 4, [False] * 4])
