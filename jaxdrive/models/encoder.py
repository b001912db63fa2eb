"""Scene encoders: one embedding per agent and step from its ``Observation``.

Per-token work dominates the policy's cost (an agent sees K partner and M road points,
~260 by default), so partners and traffic lights get one small linear layer each (one
embedding per token type), road points are embedded in groups of G consecutive points
(pieces of polylines, as in VectorNet's polyline subgraphs, Gao et al. 2020: one GEMM
row per group instead of per point), and attention runs from the ego query only, with
the key and value projections folded into the query side:

    score_hj = q_h . (W_k,h t_j) = (W_k,h^T q_h) . t_j
    out_h    = sum_j a_hj W_v,h t_j = W_v,h (sum_j a_hj t_j)

which is exact multi-head attention with per-token cost O(token_dim) per head instead of
a projection per token. A learned null token is always attendable, so an agent that
sees nothing gets a finite embedding.

Traffic lights (``Observation.lights``) are one more token type, masked like partners and
road groups. An observation with no light slots (``ObservationConfig.num_lights = 0``)
creates no light parameters and computes exactly what the encoders computed before
lights existed; parameters without light entries (a policy trained before lights, e.g. a
frozen co-player) ignore the light slots of an observation in the same way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from jaxdrive.models.softmax import joint_softmax
from jaxdrive.scenarios.signals import NUM_LIGHT_COLORS
from jaxdrive.types import (
    EGO_FEATURES,
    LightFeature,
    ObjectType,
    Observation,
    PartnerFeature,
    RoadFeature,
    RoadType,
)

NUM_OBJECT_TYPES = len(ObjectType)
NUM_ROAD_TYPES = len(RoadType)
# The feature-major partner / road / light arrays hold their continuous rows first, then
# the valid flag, then the type id (``jaxdrive.types`` checks that layout): the
# continuous rows are those before VALID.
PARTNER_CONTINUOUS = int(PartnerFeature.VALID)
ROAD_CONTINUOUS = int(RoadFeature.VALID)
LIGHT_CONTINUOUS = int(LightFeature.VALID)


class TokenEmbed(nn.Module):
    """Token-major features (..., K, F) and type ids (..., K) -> (..., K, dim):
    relu(W x + b + E[type]), one GEMM over all tokens and a table lookup, then
    ``layers - 1`` more relu(Dense) per token (a one-layer embedding max-pooled over
    tokens cannot tell "a car close ahead" from "a car ahead and a car close": each unit
    is one half-space; a second layer can AND them per token before the pooling)."""

    dim: int
    num_types: int
    dtype: jnp.dtype = jnp.float32
    layers: int = 1

    @nn.compact
    def __call__(self, feats: jax.Array, types: jax.Array) -> jax.Array:
        h = nn.Dense(self.dim, dtype=self.dtype)(feats.astype(self.dtype))
        t = nn.Embed(self.num_types, self.dim, dtype=self.dtype,
                     embedding_init=nn.initializers.normal(0.1))(types)
        h = nn.relu(h + t)
        for _ in range(self.layers - 1):
            h = nn.relu(nn.Dense(self.dim, dtype=self.dtype)(h))
        return h


def partner_tokens(obs: Observation):
    """(..., K, PARTNER_CONTINUOUS) continuous features, (..., K) type ids, (..., K) valid."""
    p = jnp.swapaxes(obs.partners, -1, -2)
    types = jnp.clip(p[..., PartnerFeature.TYPE].astype(jnp.int32), 0, NUM_OBJECT_TYPES - 1)
    return p[..., :PARTNER_CONTINUOUS], types, p[..., PartnerFeature.VALID] > 0.5


def light_tokens(obs: Observation):
    """(..., K_l, LIGHT_CONTINUOUS) continuous features, (..., K_l) ``LightColor`` ids,
    (..., K_l) valid."""
    g = jnp.swapaxes(obs.lights, -1, -2)
    types = jnp.clip(g[..., LightFeature.TYPE].astype(jnp.int32), 0, NUM_LIGHT_COLORS - 1)
    return g[..., :LIGHT_CONTINUOUS], types, g[..., LightFeature.VALID] > 0.5


def has_lights(obs: Observation) -> bool:
    """Static: the observation has light slots (K_l > 0)."""
    return obs.lights.shape[-1] > 0


def road_group_tokens(obs: Observation, group: int):
    """Road points in groups of ``group`` consecutive points (pieces of polylines: the
    env lists points chunk by chunk), one token per group.

    Returns:
      (..., M/G, 5G) features (x, y, direction x, y, valid of each point), (..., M/G)
      type ids (the largest type among the group's valid points), (..., M/G) valid (any
      point valid). M is padded with invalid points to a multiple of G.
    """
    r = obs.road
    m = r.shape[-1]
    pad = (-m) % group
    if pad:
        r = jnp.pad(r, [(0, 0)] * (r.ndim - 1) + [(0, pad)])
    r = r.reshape(r.shape[:-1] + ((m + pad) // group, group))
    r = jnp.moveaxis(r, -2, -3)  # (..., M/G, ROAD_FEATURES, G)
    valid = r[..., RoadFeature.VALID, :] > 0.5
    # The continuous rows and the valid flag (rows 0..VALID) of each point.
    n_feat = (ROAD_CONTINUOUS + 1) * group
    feats = r[..., :RoadFeature.VALID + 1, :].reshape(r.shape[:-2] + (n_feat,))
    types = jnp.max(jnp.where(valid, r[..., RoadFeature.TYPE, :].astype(jnp.int32), 0),
                    axis=-1)
    return feats, jnp.clip(types, 0, NUM_ROAD_TYPES - 1), jnp.any(valid, axis=-1)


def _scores(u: jax.Array, tokens: jax.Array, batched: bool = False) -> jax.Array:
    """(..., heads, d) . (..., K, d) -> (..., heads, K). One contraction per head: XLA
    CPU runs the batched matrix-vector products ~6x faster than one with a heads axis
    (``batched``: that one contraction, ``PolicyConfig.attention_heads``)."""
    if batched:
        return jnp.einsum("...hd,...kd->...hk", u, tokens)
    return jnp.stack([jnp.einsum("...d,...kd->...k", u[..., i, :], tokens)
                      for i in range(u.shape[-2])], axis=-2)


class SceneTokens(nn.Module):
    """Embeddings of one observation: ego (..., model_dim), partner tokens (..., K, td)
    with mask (..., K), road-group tokens (..., M/G, td) with mask (..., M/G), light
    tokens (..., K_l, td) with mask (..., K_l) (both None when K_l = 0 or the parameters
    have no light embedding)."""

    token_dim: int
    model_dim: int
    road_group: int
    dtype: jnp.dtype = jnp.float32
    token_layers: int = 1

    @nn.compact
    def __call__(self, obs: Observation):
        if obs.ego.shape[-1] != EGO_FEATURES:
            raise ValueError(f"ego observation has {obs.ego.shape[-1]} features, expected "
                             f"{EGO_FEATURES}")
        dt = self.dtype
        pf, pt, pm = partner_tokens(obs)
        rf, rt, rm = road_group_tokens(obs, self.road_group)
        ego = EgoMLP(self.model_dim, dt)(obs.ego)
        n = self.token_layers
        p_tok = TokenEmbed(self.token_dim, NUM_OBJECT_TYPES, dt, n, name="partner_embed")(pf, pt)
        r_tok = TokenEmbed(self.token_dim, NUM_ROAD_TYPES, dt, n, name="road_embed")(rf, rt)
        l_tok = lm = None
        # Parameters from an observation without lights have no light embedding: such a
        # policy reads the other tokens only, as it was trained.
        if has_lights(obs) and (self.is_initializing()
                                or self.has_variable("params", "light_embed")):
            lf, lt, lm = light_tokens(obs)
            l_tok = TokenEmbed(self.token_dim, NUM_LIGHT_COLORS, dt, n,
                               name="light_embed")(lf, lt)
        return ego, p_tok, pm, r_tok, rm, l_tok, lm


class EgoMLP(nn.Module):
    """Two Dense layers with a ReLU between: ego features (..., EGO_FEATURES) ->
    (..., dim)."""

    dim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, ego: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.dim, dtype=self.dtype)(ego.astype(self.dtype)))
        return nn.Dense(self.dim, dtype=self.dtype)(x)


class AttentionSceneEncoder(nn.Module):
    """Ego-query attention over partner, road and light tokens: (...) obs ->
    (..., model_dim).

    Attributes:
      token_dim: width of partner, road and light tokens.
      model_dim: output width.
      heads: attention heads; head_dim = model_dim // heads.
    """

    token_dim: int
    model_dim: int
    heads: int
    road_group: int = 10
    dtype: jnp.dtype = jnp.float32
    batched_heads: bool = False  # ``_scores``' layout (no parameters depend on it)
    token_layers: int = 1

    @nn.compact
    def __call__(self, obs: Observation) -> jax.Array:
        h, td, dt = self.heads, self.token_dim, self.dtype
        dh = self.model_dim // h
        ego, p_tok, pm, r_tok, rm, l_tok, lm = SceneTokens(td, self.model_dim,
                                                           self.road_group, dt,
                                                           self.token_layers,
                                                           name="tokens")(obs)

        init = nn.initializers.lecun_normal()
        q = nn.Dense(h * dh, dtype=dt, name="query")(nn.LayerNorm(dtype=dt)(ego))
        q = q.reshape(q.shape[:-1] + (h, dh)) / jnp.sqrt(dh).astype(dt)
        wk_p = self.param("key_partner", init, (h, dh, td), jnp.float32).astype(dt)
        wk_r = self.param("key_road", init, (h, dh, td), jnp.float32).astype(dt)
        k_null = self.param("key_null", init, (h, dh), jnp.float32).astype(dt)
        # Keys folded into the query: u = W_k^T q, one token_dim vector per head.
        s_p = _scores(jnp.einsum("...hc,hcd->...hd", q, wk_p), p_tok, self.batched_heads)
        s_r = _scores(jnp.einsum("...hc,hcd->...hd", q, wk_r), r_tok, self.batched_heads)
        s_0 = jnp.sum(q * k_null, axis=-1, keepdims=True)  # (..., h, 1), always valid
        scores, masks = [s_0, s_p, s_r], [True, pm[..., None, :], rm[..., None, :]]
        if l_tok is not None:
            wk_l = self.param("key_light", init, (h, dh, td), jnp.float32).astype(dt)
            scores.append(_scores(jnp.einsum("...hc,hcd->...hd", q, wk_l), l_tok,
                                  self.batched_heads))
            masks.append(lm[..., None, :])
        w_0, w_p, w_r, *w_l = joint_softmax(scores, masks)
        # Values: weighted token sums per head, then the per-head value projections.
        pool_p = jnp.einsum("...hk,...kd->...hd", w_p.astype(dt), p_tok)
        pool_r = jnp.einsum("...hk,...kd->...hd", w_r.astype(dt), r_tok)
        wv_p = self.param("value_partner", init, (h, td, dh), jnp.float32).astype(dt)
        wv_r = self.param("value_road", init, (h, td, dh), jnp.float32).astype(dt)
        v_null = self.param("value_null", init, (h, dh), jnp.float32).astype(dt)
        att = (jnp.einsum("...hd,hdc->...hc", pool_p, wv_p)
               + jnp.einsum("...hd,hdc->...hc", pool_r, wv_r)
               + w_0.astype(dt) * v_null)
        if l_tok is not None:
            pool_l = jnp.einsum("...hk,...kd->...hd", w_l[0].astype(dt), l_tok)
            wv_l = self.param("value_light", init, (h, td, dh), jnp.float32).astype(dt)
            att = att + jnp.einsum("...hd,hdc->...hc", pool_l, wv_l)
        att = att.reshape(att.shape[:-2] + (h * dh,))
        x = ego + nn.Dense(self.model_dim, dtype=dt, name="attn_out")(att)
        y = nn.Dense(2 * self.model_dim, dtype=dt)(nn.LayerNorm(dtype=dt)(x))
        return x + nn.Dense(self.model_dim, dtype=dt)(nn.relu(y))


class PooledSceneEncoder(nn.Module):
    """The MLP baseline's encoder: token embeddings max-pooled over valid tokens per
    family (partners, road, lights when present), concatenated with the ego embedding:
    (...) -> (..., model_dim).
    """

    token_dim: int
    model_dim: int
    road_group: int = 10
    dtype: jnp.dtype = jnp.float32
    token_layers: int = 1

    @nn.compact
    def __call__(self, obs: Observation) -> jax.Array:
        dt = self.dtype
        ego, p_tok, pm, r_tok, rm, l_tok, lm = SceneTokens(
            self.token_dim, self.model_dim, self.road_group, dt, self.token_layers,
            name="tokens")(obs)
        # Tokens are >= 0 after relu, so masking to 0 before the max is exact pooling
        # with an empty set pooled to 0.
        p = jnp.max(jnp.where(pm[..., None], p_tok, 0), axis=-2, initial=0)
        r = jnp.max(jnp.where(rm[..., None], r_tok, 0), axis=-2, initial=0)
        parts = [ego, p.astype(dt), r.astype(dt)]
        if l_tok is not None:
            parts.append(jnp.max(jnp.where(lm[..., None], l_tok, 0), axis=-2,
                                 initial=0).astype(dt))
        x = jnp.concatenate(parts, axis=-1)
        x = nn.relu(nn.Dense(2 * self.model_dim, dtype=dt)(x))
        return nn.Dense(self.model_dim, dtype=dt)(x)
