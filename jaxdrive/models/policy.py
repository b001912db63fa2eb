"""Actor-critic policies with one interface: ``init``, ``init_cache``, ``step``, ``sequence``.

- ``transformer``: attention scene encoder per step, then the temporal decoder over the
  agent's own past through a per-agent KV cache (memory spans trials, resets with the
  episode).
- ``mlp``: max-pooled token encoder and an MLP; no memory (its cache only counts steps).

Both read the observation's partner, road and traffic-light tokens (light parameters
exist only when the observation has light slots, ``ObservationConfig.num_lights > 0``).
Both heads sit on the same trunk: a categorical over the env's discrete action grid or a
scaled Beta for continuous actions, and a value head.

Typical rollout use (N = flattened envs x agents)::

    policy = Policy.for_env(PolicyConfig(), env)
    params = policy.init(key, timestep.obs)
    cache = policy.init_cache(N)
    out, cache = policy.step(params, cache, obs, first, removed)
    action = policy.distribution(out).sample(key)

and in training ``policy.sequence(params, cache_at_segment_start, obs, first, removed)``
over (B, T) segments gives the same outputs at every step.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import struct

from jaxdrive.config import ConfigBase, ConfigError, check_choice, check_int
from jaxdrive.models.dense import DenseRows, dense_apply, dense_indices, put_rows, take_rows
from jaxdrive.models.distributions import Categorical, ScaledBeta
from jaxdrive.models.encoder import AttentionSceneEncoder, PooledSceneEncoder
from jaxdrive.models.kv_cache import ROW_AXES, KVCache
from jaxdrive.models.transformer import TemporalDecoder
from jaxdrive.types import Observation

POLICY_KINDS = ("transformer", "mlp")
ATTENTION_HEADS = ("per_head", "batched")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class PolicyConfig(ConfigBase):
    """Policy architecture.

    Attributes:
      kind: ``transformer`` (memory through a KV cache) or ``mlp`` (no memory).
      token_dim: width of partner, road and light tokens (per-token cost scales with
        it).
      token_layers: Dense layers of each token's embedding before pooling / attention
        (1: one relu(W x + b + E[type]); more can combine a token's features, e.g.
        "ahead" and "close", before the max-pool mixes tokens).
      road_group: G, consecutive road points per road token (set it to the road index's
        ``chunk_size`` so that tokens are pieces of one polyline).
      model_dim: width of the per-step embedding and the temporal decoder.
      scene_heads: heads of the ego-query attention over tokens.
      num_layers, heads: temporal decoder layers and heads.
      horizon: H, cache slots per agent (steps of memory); may exceed the episode.
      mlp_ratio: hidden width of the decoder's MLP, in units of model_dim.
      dtype: compute dtype, ``float32`` or ``bfloat16`` (parameters stay float32).
      aux_goal: add a training-only head that predicts the goal rows of the ego features
        (goal x, y and distance, as ``goal: visible`` writes them) from the embedding the
        actor and critic read; ``train.aux_goal_coef`` weights its loss. With the goal
        hidden, the head can only be right by remembering what earlier trials showed,
        so its loss teaches the memory what to keep. Acting never reads it.
      attention_heads: how the attention contractions of the scene encoder and of the
        temporal decoder's training segments are laid out, ``per_head`` (one per head:
        ~6x faster on XLA CPU) or ``batched`` (one with a heads axis); the same
        parameters and, to float rounding, the same outputs. (The rollout's decoder
        step, one query per agent over its head-major cache, is always one contraction:
        the faster form there on CPU too.)
    """

    kind: str = "transformer"
    token_dim: int = 32
    token_layers: int = 1
    road_group: int = 10
    model_dim: int = 64
    scene_heads: int = 2
    num_layers: int = 1
    heads: int = 2
    horizon: int = 64
    mlp_ratio: int = 2
    dtype: str = "float32"
    aux_goal: bool = False
    attention_heads: str = "per_head"

    def __post_init__(self):
        check_choice("kind", self.kind, POLICY_KINDS)
        check_choice("attention_heads", self.attention_heads, ATTENTION_HEADS)
        check_choice("dtype", self.dtype, tuple(DTYPES))
        check_int("token_dim", self.token_dim, 1, 4096)
        check_int("token_layers", self.token_layers, 1, 16)
        check_int("road_group", self.road_group, 1, 4096)
        check_int("model_dim", self.model_dim, 2, 8192)
        check_int("scene_heads", self.scene_heads, 1, 64)
        check_int("num_layers", self.num_layers, 1, 64)
        check_int("heads", self.heads, 1, 64)
        check_int("horizon", self.horizon, 1, 1 << 20)
        check_int("mlp_ratio", self.mlp_ratio, 1, 64)
        for name in ("heads", "scene_heads"):
            if self.model_dim % getattr(self, name):
                raise ConfigError(f"config key 'model_dim' = {self.model_dim} must be a "
                                  f"multiple of '{name}' = {getattr(self, name)}.")
        if self.model_dim % 2:
            raise ConfigError(f"config key 'model_dim' = {self.model_dim} must be even "
                              "(sinusoidal positions).")


@struct.dataclass
class PolicyOutput:
    """Per-agent head outputs (leading dims (N,) or (B, T)).

    Attributes:
      dist: (..., num_actions) logits, or (..., 2, action_dim) Beta (alpha, beta).
      value: (...) float32.
      aux_goal: (..., 3) float32 predicted goal rows (``PolicyConfig.aux_goal``, from
        ``Policy.sequence`` only), else None.
    """

    dist: jax.Array
    value: jax.Array
    aux_goal: jax.Array | None = None


class _ActorCritic(nn.Module):
    config: PolicyConfig
    out_dim: int  # logits, or 2 * action_dim

    def setup(self):
        c = self.config
        dt = DTYPES[c.dtype]
        if c.kind == "transformer":
            batched = c.attention_heads == "batched"
            self.encoder = AttentionSceneEncoder(c.token_dim, c.model_dim, c.scene_heads,
                                                 c.road_group, dt, batched, c.token_layers)
            self.decoder = TemporalDecoder(c.model_dim, c.heads, c.num_layers, c.mlp_ratio, dt,
                                           batched)
        else:
            self.encoder = PooledSceneEncoder(c.token_dim, c.model_dim, c.road_group, dt,
                                              c.token_layers)
        self.ln = nn.LayerNorm(dtype=dt)
        self.pi_hidden = nn.Dense(c.model_dim, dtype=dt)
        self.pi_out = nn.Dense(self.out_dim, dtype=jnp.float32,
                               kernel_init=nn.initializers.orthogonal(0.01))
        self.v_hidden = nn.Dense(c.model_dim, dtype=dt)
        self.v_out = nn.Dense(1, dtype=jnp.float32, kernel_init=nn.initializers.orthogonal(1.0))
        if c.aux_goal:
            self.aux_hidden = nn.Dense(c.model_dim, dtype=dt)
            self.aux_out = nn.Dense(3, dtype=jnp.float32)

    def _heads(self, x):
        x = self.ln(x)
        dist = self.pi_out(nn.relu(self.pi_hidden(x)).astype(jnp.float32))
        value = self.v_out(nn.relu(self.v_hidden(x)).astype(jnp.float32))[..., 0]
        return dist, value

    def _aux_goal(self, x):
        return self.aux_out(nn.relu(self.aux_hidden(self.ln(x))).astype(jnp.float32))

    def __call__(self, obs):  # parameter creation
        x = self.encoder(obs)
        if self.config.kind == "transformer":
            x = self.decoder(x)
        if self.config.aux_goal:
            return self._heads(x), self._aux_goal(x)
        return self._heads(x)

    def embed(self, obs):
        """(M,) observations -> (M, model_dim) scene embeddings (row-independent)."""
        return self.encoder(obs)

    def step(self, x, cache, removed, return_attention=False):
        """One step from the (N, d) embeddings of ``embed``."""
        if return_attention:
            x, cache, weights = self.decoder.step(x, cache, removed, return_attention=True)
            return self._heads(x), cache, weights
        if self.config.kind == "transformer":
            x, cache = self.decoder.step(x, cache, removed)
        else:
            cache = cache.replace(next_pos=cache.next_pos + 1)
        return self._heads(x), cache

    def decode(self, x, cache, first, removed):
        """(B*T, d) embeddings of a (B, T) segment -> (B*T, d) inputs of the heads (the
        temporal decoder; the identity without memory)."""
        if self.config.kind != "transformer":
            return x
        b, t = first.shape
        x = self.decoder.sequence(x.reshape((b, t, -1)), cache, first, removed)
        return x.reshape((b * t, -1))

    def heads(self, x):
        """(M, d) -> (dist (M, out), value (M,)[, aux goal (M, 3)]), row-independent."""
        if self.config.aux_goal:
            return self._heads(x) + (self._aux_goal(x),)
        return self._heads(x)

    def sequence(self, x, cache, first, removed):
        """A (B, T) segment from the (B*T, d) embeddings of ``embed``.

        Per-step parts run on (B*T) rows: XLA CPU handles one batch axis in the token
        contractions far better than two."""
        b, t = first.shape
        out = self.heads(self.decode(x, cache, first, removed))
        return tuple(o.reshape((b, t) + o.shape[1:]) for o in out)


class Policy:
    """An actor-critic with static configuration; all methods are pure functions.

    Args:
      config: ``PolicyConfig``.
      num_actions: size of the discrete action grid, or
      action_low, action_high: (action_dim,) bounds of continuous actions.
    """

    def __init__(self, config: PolicyConfig | None = None, num_actions: int | None = None,
                 action_low=None, action_high=None):
        self.config = config or PolicyConfig()
        if (num_actions is None) == (action_low is None):
            raise ValueError("give either num_actions (discrete) or action_low/action_high "
                             "(continuous)")
        self.discrete = num_actions is not None
        if self.discrete:
            out_dim = int(num_actions)
        else:
            self.action_low = jnp.asarray(action_low, jnp.float32)
            self.action_high = jnp.asarray(action_high, jnp.float32)
            out_dim = 2 * self.action_low.shape[0]
        self.module = _ActorCritic(self.config, out_dim)
        self._init_fn = jax.jit(self.module.init)

    @classmethod
    def for_env(cls, config: PolicyConfig, env) -> Policy:
        """A policy whose action head matches ``env``'s action space."""
        if env.config.dynamics.action_space == "discrete":
            return cls(config, num_actions=env.num_actions)
        return cls(config, action_low=env.dynamics.action_low,
                   action_high=env.dynamics.action_high)

    @property
    def _cache_layers(self) -> int:
        return self.config.num_layers if self.config.kind == "transformer" else 0

    def init(self, key: jax.Array, obs: Observation):
        """Parameters, from an example observation with a leading agent axis (N, ...).

        Only the example's shapes past N matter (parameters are drawn from ``key`` and
        their own shapes), so the initialiser runs on one row of zeros: one compiled
        program per policy and token counts, whatever N. Jitted: flax's init run op by op
        costs seconds."""
        one_row = jax.tree.map(lambda x: np.zeros((1,) + tuple(x.shape[1:]), x.dtype), obs)
        return self._init_fn(key, one_row)

    def init_cache(self, num_agents: int) -> KVCache:
        """An empty cache for ``num_agents`` agents (all positions empty)."""
        c = self.config
        return KVCache.create(num_agents, self._cache_layers, c.horizon, c.heads,
                              c.model_dim // c.heads, DTYPES[c.dtype])

    def embed(self, params, obs: Observation, rows: DenseRows | None = None) -> jax.Array:
        """(M, model_dim) scene embeddings of observations with one leading axis M; with
        ``rows`` computed only where ``rows.mask`` (zeros elsewhere, unless more rows
        than the largest of ``rows.capacities`` are selected: then everywhere;
        ``jaxdrive.models.dense``)."""
        return dense_apply(
            lambda o: self.module.apply(params, o, method=_ActorCritic.embed), obs, rows)

    def step(self, params, cache: KVCache, obs: Observation, first: jax.Array,
             removed: jax.Array, return_attention: bool = False,
             rows: DenseRows | None = None):
        """One rollout step of N agents.

        Args:
          params: from ``init``.
          cache: ``KVCache`` for N agents.
          obs: ``Observation`` with leading axis N.
          first: (N,) bool, ``obs`` starts a new episode (the cache is reset first).
          removed: (N,) bool, the agent is removed in ``obs`` (its step is garbage).
          return_attention: also return the temporal decoder's attention weights
            (inspection, ``jaxdrive.inspect``; transformer only). Outputs and cache are
            the same either way.
          rows: ``DenseRows`` over the N rows: run the scene encoder only on the rows
            whose outputs count (``rows.mask``, e.g. acting ego agents that are not
            removed). Outputs there, and their cache rows, equal the full batch's to
            float rounding; the other rows' outputs are meaningless, and so is the
            memory they write: a row must be selected at every step of its episode at
            which it is not removed, or not at all. None: every row.
        Returns:
          (``PolicyOutput`` (N,), the updated cache); with ``return_attention`` a third
          item, (num_layers, N, heads, S) float32 weights of this step's query over the
          updated cache's slots (``TemporalDecoder.step``).
        Raises:
          ValueError: ``return_attention`` for a policy without memory (``mlp``).
        """
        if return_attention and self.config.kind != "transformer":
            raise ValueError(f"policy kind '{self.config.kind}' has no memory, so no "
                             "attention weights to return; use a transformer policy.")
        cache = cache.reset(first)
        x = self.embed(params, obs, rows)
        if return_attention:
            (dist, value), cache, weights = self.module.apply(
                params, x, cache, removed, True, method=_ActorCritic.step)
            return self._output(dist, value), cache, weights
        (dist, value), cache = self.module.apply(params, x, cache, removed,
                                                 method=_ActorCritic.step)
        return self._output(dist, value), cache

    def sequence(self, params, cache: KVCache, obs: Observation, first: jax.Array,
                 removed: jax.Array, rows: DenseRows | None = None) -> PolicyOutput:
        """A whole (B, T) segment at once (training).

        Args:
          cache: ``KVCache`` for B agents as it was before the segment's first step.
          obs: ``Observation`` with leading axes (B, T).
          first, removed: (B, T) bool, as in ``step``.
          rows: ``DenseRows`` whose mask is (B, T): the steps whose outputs count
            (capacities count steps): the scene encoder runs only on those steps
            (``jaxdrive.models.dense``); outputs there equal the full segment's to
            float rounding, given that the mask holds every step a selected step
            attends to (the row's earlier steps of the episode that are not removed).
            None: every step.
        Returns:
          ``PolicyOutput`` (B, T), equal to stepping through the segment (with
          ``aux_goal`` when the config has that head).
        """
        b, t = first.shape
        flat = jax.tree.map(lambda x: x.reshape((b * t,) + x.shape[2:]), obs)
        dense = None if rows is None else DenseRows(rows.mask.reshape(b * t), rows.capacities)
        x = self.embed(params, flat, dense)
        out = self.module.apply(params, x, cache, first, removed,
                                method=_ActorCritic.sequence)
        return self._output(*out)

    def sequence_at(self, params, cache: KVCache, obs: Observation, first: jax.Array,
                    removed: jax.Array, mask: jax.Array, capacity: int,
                    row_capacity: int | None = None, groups: int = 1):
        """``sequence``'s outputs at the steps of a (B, T) segment that ``mask`` selects,
        packed into ``capacity`` slots (training on dense rows): the scene encoder and
        the heads run on those steps only, the temporal decoder on the segment's rows,
        or with ``row_capacity`` on the rows holding a selected step, packed.

        Args:
          cache, obs, first, removed: as in ``sequence``.
          mask: (B, T) bool, the steps whose outputs count; it must hold every step a
            selected step attends to (the row's earlier steps of the episode that are
            not removed), at most ``capacity`` steps and at most ``row_capacity`` rows
            with a selected step (the caller checks:
            ``jaxdrive.models.dense.which_row_step_buffer``).
          capacity: static int.
          row_capacity: static int or None (every row; the same for ``B`` or more).
          groups: G, the rows split over G devices in contiguous blocks: each block's
            steps and rows pack into its own share of both capacities (multiples of G;
            the selection must fit every block's share), so nothing crosses devices.
        Returns:
          (``PolicyOutput`` (capacity,), idx (capacity,) int32 flat step index ``b * T +
          t`` of each slot, within its block of ``B / G * T`` steps (read it with
          ``jaxdrive.models.dense.take_rows`` and the same ``groups``), used (capacity,)
          bool: the slot holds a selected step). Outputs at used slots equal
          ``sequence``'s at those steps to float rounding.
        """
        b, t = first.shape
        g = groups
        idx, used = dense_indices(mask.reshape(b * t), capacity, g)
        flat = jax.tree.map(lambda x: x.reshape((b * t,) + x.shape[2:]), obs)
        x = self.module.apply(params, jax.tree.map(lambda a: take_rows(a, idx, g), flat),
                              method=_ActorCritic.embed)
        if self.config.kind == "transformer":
            place = idx  # each slot's step in its block of the decoder's (rows * T) layout
            if row_capacity is not None and row_capacity < b:
                live = jnp.any(mask, axis=1)
                row_idx, _ = dense_indices(live, row_capacity, g)
                # (B,): each row's place in its block's share of the row buffer
                row_slot = (jnp.cumsum(live.reshape(g, b // g).astype(jnp.int32), axis=1)
                            - 1).reshape(b)
                place = jnp.where(used, take_rows(row_slot, idx // t, g) * t + idx % t, 0)
                cache = jax.tree.map(lambda c, ax: take_rows(c, row_idx, g, ax), cache,
                                     ROW_AXES)
                first, removed = take_rows(first, row_idx, g), take_rows(removed, row_idx, g)
            grid = put_rows(x, place, used, first.shape[0] * t, g)
            grid = self.module.apply(params, grid, cache, first, removed,
                                     method=_ActorCritic.decode)
            x = take_rows(grid, place, g)
        out = self.module.apply(params, x, method=_ActorCritic.heads)
        return self._output(*out), idx, used

    def _output(self, dist, value, aux_goal=None) -> PolicyOutput:
        if not self.discrete:
            dist = dist.reshape(dist.shape[:-1] + (2, -1))
        return PolicyOutput(dist=dist.astype(jnp.float32), value=value.astype(jnp.float32),
                            aux_goal=aux_goal)

    def distribution(self, out: PolicyOutput):
        """``Categorical`` or ``ScaledBeta`` for the outputs' leading shape."""
        if self.discrete:
            return Categorical(out.dist)
        conc = 1.0 + jax.nn.softplus(out.dist)
        return ScaledBeta(conc[..., 0, :], conc[..., 1, :], self.action_low, self.action_high)


def policy_inputs(timestep) -> tuple[jax.Array, jax.Array]:
    """``(first, removed)`` for ``Policy.step`` from an env ``TimeStep`` (any leading
    env dims, A agents): every agent of an env whose episode starts gets a fresh memory
    (at reset and auto-reset, never at a trial boundary); removed agents' steps are
    garbage. Returns two (..., A) bool arrays."""
    first = jnp.broadcast_to(timestep.first[..., None], timestep.removed.shape)
    return first, timestep.removed


def param_count(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(x.size for x in jax.tree.leaves(params)))
