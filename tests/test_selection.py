"""``selection.smallest_k`` against a brute-force reference (a stable NumPy argsort) and
``lax.top_k``: same indices, ties by lower index, masked (+inf) entries last."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdrive import selection


def _reference(key: np.ndarray, k: int) -> np.ndarray:
    """Stable ascending argsort per row: ties keep index order."""
    return np.argsort(key, axis=-1, kind="stable")[..., :k].astype(np.int32)


def _keys(rng, shape, tie_values=None):
    """Random keys with repeated values (ties) and +inf (masked) entries."""
    key = rng.uniform(0.0, 100.0, shape).astype(np.float32)
    if tie_values:
        key = np.round(key / 100.0 * tie_values).astype(np.float32)  # many exact ties
    key[rng.uniform(size=shape) < 0.2] = np.inf
    return key


# (rows, n, k): powers of two and not, k = n, k = 1, the env's partner and light sizes.
CASES = [(1, 1, 1), (5, 2, 1), (7, 3, 3), (16, 16, 4), (9, 17, 5), (33, 127, 63),
         (4, 64, 64), (3, 100, 7), (12, 32, 4), (6, 63, 8)]
dispatch = jax.jit(selection.smallest_k, static_argnums=1)
# The three side by side in one program: one compile per case instead of three (XLA
# compiles the network, or top_k, once where the dispatch picks it).
all_three = jax.jit(lambda key, k: (selection.smallest_k_network(key, k),
                                    selection.smallest_k(key, k),
                                    jax.lax.top_k(-key, k)[1]), static_argnums=1)


@pytest.mark.parametrize("rows,n,k", CASES)
def test_network_and_dispatch_equal_a_stable_sort(rows, n, k):
    rng = np.random.default_rng(n * 1000 + k)
    for tie_values in (None, 5):
        key = _keys(rng, (rows, n), tie_values)
        want = _reference(key, k)
        got_network, got_dispatch, got_top_k = jax.device_get(all_three(key, k))
        np.testing.assert_array_equal(got_network, want)
        np.testing.assert_array_equal(got_dispatch, want)
        # lax.top_k on the negated keys is the contract other backends run.
        np.testing.assert_array_equal(got_top_k, want)


def test_leading_axes_vmap_and_jit():
    rng = np.random.default_rng(0)
    key = _keys(rng, (2, 3, 11), tie_values=4)
    want = _reference(key, 6)
    got = dispatch(key, 6)
    assert got.shape == (2, 3, 6) and got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)
    got = jax.vmap(lambda x: selection.smallest_k(x, 6))(key)
    np.testing.assert_array_equal(np.asarray(got), want)


def test_all_masked_rows_give_index_order_and_k_zero_is_empty():
    key = np.full((3, 6), np.inf, np.float32)
    np.testing.assert_array_equal(np.asarray(selection.smallest_k(key, 4)),
                                  np.tile(np.arange(4, dtype=np.int32), (3, 1)))
    assert selection.smallest_k(key, 0).shape == (3, 0)
    with pytest.raises(ValueError, match=r"k = 7 must be in \[0, 6\]"):
        selection.smallest_k(key, 7)


def test_cpu_runs_the_network_for_many_picks_of_long_rows_and_top_k_otherwise():
    """The dispatch: on CPU, rows of at least NETWORK_MIN_KEYS keys with more than
    TOP_K_MAX_K picks lower to the network (no TopK op); shorter rows, and up to
    TOP_K_MAX_K picks of any row, to lax.top_k."""
    def has_top_k(n, k):
        text = dispatch.lower(jnp.zeros((4, n), jnp.float32), k).as_text().lower()
        return "top_k" in text or "topk" in text

    n, k = selection.NETWORK_MIN_KEYS, selection.TOP_K_MAX_K
    assert k + 1 < 127
    assert has_top_k(n - 1, n - 1)
    assert has_top_k(n, 4)
    assert has_top_k(127, k)
    if jax.default_backend() == "cpu":
        assert not has_top_k(127, k + 1)
        assert not has_top_k(127, 63)
