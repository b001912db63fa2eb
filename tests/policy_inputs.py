"""Random observations and perturbed parameters for policy tests.

Drawn with NumPy from the JAX key's data, then put on the device: nothing to compile.
(Jitted ``jax.random`` versions of these cost 10-30 s of XLA compilation per shape on
the CI machine, most of a policy test module's time; eager ``jax.random`` compiles a
kernel per shape too.)"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxdrive.types import Observation


def _rng(key, *stream):
    """A NumPy generator seeded by a JAX PRNG key, typed or raw (and optional stream
    numbers)."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    data = np.asarray(key).ravel()
    return np.random.default_rng([int(x) for x in data] + list(stream))


def random_obs(key, lead, num_partners=5, num_road=7, p_valid=0.6, r_valid=0.7,
               num_lights=3):
    """A random ``Observation`` with leading dims ``lead``: normal features, random
    validity rows and type ids (masked tokens keep nonzero garbage on purpose). Lights
    (``num_lights`` slots) draw from their own stream, so the other arrays do not depend
    on ``num_lights``."""
    lead = tuple(lead)
    rng = _rng(key)
    ego = rng.standard_normal(lead + (8,), np.float32)
    p = rng.standard_normal(lead + (10, num_partners), np.float32)
    p[..., 8, :] = rng.random(lead + (num_partners,)) < p_valid
    p[..., 9, :] = rng.integers(0, 5, lead + (num_partners,))
    r = rng.standard_normal(lead + (6, num_road), np.float32)
    r[..., 4, :] = rng.random(lead + (num_road,)) < r_valid
    r[..., 5, :] = rng.integers(0, 8, lead + (num_road,))
    lights = _rng(key, 1)
    g = lights.standard_normal(lead + (6, num_lights), np.float32)
    g[..., 4, :] = lights.random(lead + (num_lights,)) < 0.6
    g[..., 5, :] = lights.integers(0, 4, lead + (num_lights,))
    return Observation(ego=jnp.asarray(ego), partners=jnp.asarray(p), road=jnp.asarray(r),
                       lights=jnp.asarray(g))


def perturb(params, key, scale=0.3):
    """Parameters plus Gaussian noise, so that every head output is O(1) (the default
    initialisation makes the policy logits nearly zero, which would hide mismatches)."""
    rng = _rng(key)
    leaves, tree = jax.tree.flatten(params)
    noisy = []
    for x in leaves:
        x = np.asarray(x)
        noise = (scale * rng.standard_normal(x.shape, np.float32)).astype(x.dtype)
        noisy.append(jnp.asarray(x + noise))
    return jax.tree.unflatten(tree, noisy)


def random_params(policy, obs, key, scale=0.3):
    """Parameters of ``policy`` as ``perturb(policy.init(...), key, scale)`` makes them,
    drawn on the host: ``init``'s shapes come from ``jax.eval_shape`` (no initialiser
    is compiled), each leaf drawn like its initialiser (LayerNorm scales 1, biases 0,
    embeddings normal(0.1), the other weights lecun-normal: fan-in all but the last
    axis), plus Gaussian noise of ``scale``: random parameters with O(1) head outputs.
    ``obs`` gives the token counts (any leading axis)."""
    shapes = jax.eval_shape(policy.module.init, jax.random.key(0), obs)
    rng = _rng(key)

    def leaf(path, s):
        name = str(getattr(path[-1], "key", path[-1]))
        if name == "scale":
            base = np.ones(s.shape, np.float32)
        elif name == "bias":
            base = np.zeros(s.shape, np.float32)
        else:
            std = 0.1 if name == "embedding" else 1.0 / np.sqrt(np.prod(s.shape[:-1]))
            base = std * rng.standard_normal(s.shape, np.float32)
        return jnp.asarray((base + scale * rng.standard_normal(s.shape, np.float32))
                           .astype(s.dtype))

    return jax.tree_util.tree_map_with_path(leaf, shapes)


def at(obs, t):
    """Step ``t`` of a (B, T) observation."""
    return jax.tree.map(lambda x: x[:, t], obs)
