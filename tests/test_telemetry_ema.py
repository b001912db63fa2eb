"""Per-agent EMA population mean: seeding, blending, equal weight per agent, no reset."""

import jax.numpy as jnp
import numpy as np

from jaxdrive.telemetry import ema


def test_no_emission_before_any_completion_and_emissions_do_not_reset():
    state = ema.init(["goal"], 3)
    out = ema.emit(state)
    assert np.isnan(float(out["goal"])) and float(out["slots_with_data"]) == 0
    state = ema.update(state, jnp.array([True, False, False]), {"goal": jnp.array([1.0, 5, 5])},
                       alpha=0.5)
    first, second = ema.emit(state), ema.emit(state)
    assert float(first["goal"]) == float(second["goal"]) == 1.0
    assert float(first["slots_with_data"]) == 1


def test_seed_then_blend_hand_computed():
    # alpha 0.5: first episode 1.0 seeds the slot; the next (3.0) gives .5*1 + .5*3 = 2.
    state = ema.init(["r"], 1)
    for x in (1.0, 3.0):
        state = ema.update(state, jnp.array([True]), {"r": jnp.array([x])}, alpha=0.5)
    assert float(ema.emit(state)["r"]) == 2.0


def test_frequent_finishers_do_not_dominate():
    # Slot 0 completes 10 episodes with value 1; slot 1 one episode with value 0: the
    # population mean is 0.5, not 10/11.
    state = ema.init(["goal"], 2)
    for i in range(10):
        done = jnp.array([True, i == 4])
        state = ema.update(state, done, {"goal": jnp.array([1.0, 0.0])}, alpha=0.9)
    np.testing.assert_allclose(float(ema.emit(state)["goal"]), 0.5, rtol=1e-6)
