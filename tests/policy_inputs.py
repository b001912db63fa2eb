"""Random observations and perturbed parameters for policy tests."""

import functools

import jax
import jax.numpy as jnp

from jaxdrive.types import Observation


# Jitted: test modules build these at import, and eager op-by-op dispatch is slow.
@functools.partial(jax.jit, static_argnames=("lead", "num_partners", "num_road", "p_valid",
                                             "r_valid", "num_lights"))
def random_obs(key, lead, num_partners=5, num_road=7, p_valid=0.6, r_valid=0.7,
               num_lights=3):
    """A random ``Observation`` with leading dims ``lead``: normal features, random
    validity rows and type ids (masked tokens keep nonzero garbage on purpose). Lights
    (``num_lights`` slots) draw from their own key, so the other arrays do not depend on
    ``num_lights``."""
    k = jax.random.split(key, 6)
    ego = jax.random.normal(k[0], lead + (8,))
    p = jax.random.normal(k[1], lead + (10, num_partners))
    p = p.at[..., 8, :].set((jax.random.uniform(k[2], lead + (num_partners,)) < p_valid)
                            .astype(jnp.float32))
    p = p.at[..., 9, :].set(jax.random.randint(k[3], lead + (num_partners,), 0, 5)
                            .astype(jnp.float32))
    r = jax.random.normal(k[4], lead + (6, num_road))
    r = r.at[..., 4, :].set((jax.random.uniform(k[5], lead + (num_road,)) < r_valid)
                            .astype(jnp.float32))
    r = r.at[..., 5, :].set(jax.random.randint(k[5], lead + (num_road,), 0, 8)
                            .astype(jnp.float32))
    kl = jax.random.split(jax.random.fold_in(key, 1), 3)
    g = jax.random.normal(kl[0], lead + (6, num_lights))
    g = g.at[..., 4, :].set((jax.random.uniform(kl[1], lead + (num_lights,)) < 0.6)
                            .astype(jnp.float32))
    g = g.at[..., 5, :].set(jax.random.randint(kl[2], lead + (num_lights,), 0, 4)
                            .astype(jnp.float32))
    return Observation(ego=ego, partners=p, road=r, lights=g)


@functools.partial(jax.jit, static_argnames=("scale",))
def perturb(params, key, scale=0.3):
    """Parameters plus Gaussian noise, so that every head output is O(1) (the default
    initialisation makes the policy logits nearly zero, which would hide mismatches)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape, x.dtype)
                                     for x, k in zip(leaves, keys, strict=True)])


def at(obs, t):
    """Step ``t`` of a (B, T) observation."""
    return jax.tree.map(lambda x: x[:, t], obs)
