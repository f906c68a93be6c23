"""Linear attention (Katharopoulos et al. 2020, elu + 1) and Performer FAVOR+ (Choromanski et al. 2021).

Both replace exp(q . k / sqrt(d)) by a product of feature maps phi(q) . phi(k), which makes attention
linear in N (see feature_attention.py for the non-causal and chunked causal cores).

- `linear`: phi(x) = elu(x) + 1. A different kernel from softmax, not an approximation of it.
- `performer`: positive orthogonal random features, an unbiased estimate of the softmax kernel:
  phi(x) = exp(w . x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4), with m rows w drawn as blocks of
  orthogonal directions scaled by Gaussian norms, from the seed. Stabilized: a query's features by their
  own max; keys by the max over all keys (non-causal) or by the running max up to each key (causal).

b - batch, h - heads, n - position, d - head dim, m - feature
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    DecodeState,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    kept_on_instance,
)
from attnbench.kernels import usable
from attnbench.kernels.recurrent_steps import linear_step, performer_step
from attnbench.variants.decoding import FeatureState
from attnbench.variants.feature_attention import (
    GROUP,
    accumulation_dtype,
    key_state,
    causal_feature_attention,
    feature_attention,
    normalized,
    with_ones,
)
from torch import Tensor

KERNELS = ("positive", "trig")
CHUNK = Hyperparameter(64, "causal: positions per chunk (exact inside, carried state across)", minimum=1)


def _drop_padded(phi_k: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """Padded keys leave numerator and denominator: their features are zero."""
    if key_padding_mask is None:
        return phi_k
    return phi_k.masked_fill(key_padding_mask[:, None, :, None], 0.0)


def _feature_cost(
    shape: Shape, features: int, chunk: int, feature_matmul: float, feature_other: float, decayed: bool = False
) -> Cost:
    """Cost of feature attention (feature_attention.py), given the feature maps' own FLOPs per batch and head.

    Non-causal: phi(K)^T [V 1], then phi(Q) times that state. Causal, over the sequence padded to whole
    chunks: per chunk the scores phi(q_c) phi(k_c)^T and scores [v_c 1], the chunk sum phi(k_c)^T [v_c 1]
    and phi(q_c) times the state of earlier chunks; those states a cumulative sum, or (`decayed`, a key_log_scale)
    `decayed_exclusive_prefix`'s matmuls: inside groups of GROUP chunks, the groups' totals, across the groups.
    """
    s, m = shape, features
    bh, e1 = s.batch * s.heads, s.value_dim + 1  # values carry a column of ones: the normalizer
    accumulate = max(s.dtype_bytes, 4)  # features and states in float32, float64 for float64
    if s.causal:
        padded = -(-s.n_q // chunk) * chunk
        chunks = padded // chunk
        matmul = 2 * padded * (chunk * (m + e1) + 2 * m * e1)
        other = padded * (2 * chunk + 2 * e1) + chunks * m * e1  # masks and decays, sums, the carried state
        if decayed:
            groups = -(-chunks // GROUP)
            matmul += 2 * m * e1 * groups * (GROUP * GROUP + GROUP + groups)
            other += groups * GROUP * m * e1  # each state's share of the state before its group
        held = padded * (2 * m + chunk + 2 * e1) + 2 * chunks * m * e1  # chunked features, scores, states
    else:
        matmul = 2 * (s.n_k + s.n_q) * m * e1
        other = s.n_q * e1  # normalization
        held = (s.n_q + s.n_k) * (m + e1) + m * e1  # features, [V 1] and the totals, the state
    io = bh * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) * s.dtype_bytes
    return Cost(
        flops=bh * (feature_matmul + matmul + feature_other + other),
        bytes_moved=io,
        working_bytes=bh * held * accumulate,
        matmul_flops=bh * (feature_matmul + matmul),
    )


class LinearAttention(AttentionVariant):
    """Katharopoulos et al.: phi(x) = elu(x) + 1."""

    name = "linear"
    family = "linear"
    exact = False
    supports = Capabilities(subquadratic_memory=True)
    hyperparameters = {"chunk_size": CHUNK}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        work = accumulation_dtype(q.dtype)
        phi_q = F.elu(q.to(work)).add_(1)  # in place: one pass fewer over (b, h, n, d) (elu saves its input)
        phi_k = _drop_padded(F.elu(k.to(work)).add_(1), key_padding_mask)
        if causal:
            return causal_feature_attention(phi_q, phi_k, v, chunk=self.chunk_size)
        return feature_attention(phi_q, phi_k, v)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The causal forward, and the RNN state sum_j phi(k_j) [v_j 1] (d x (e + 1) per head, constant in N)."""
        phi_k = F.elu(k.to(accumulation_dtype(k.dtype))).add_(1)
        return self(q, k, v, causal=True), FeatureState(key_state(phi_k, v), phi_k.new_zeros(()), k.shape[-2])

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """Fused (float32 on the CPU, one token): one call of the C kernel `linear_step`, features and all. Eager:
        the features, then `FeatureState.step`."""
        if not isinstance(state, FeatureState):
            raise UnsupportedOptionError(f"linear cannot step from a {type(state).__name__}")
        if q.shape[-2] == 1 and usable(q, k, v, state.state):
            out = linear_step(q, k, v, state.state)
            state.length += 1
            return out, state
        work = state.state.dtype
        return state.step(F.elu(q.to(work)).add_(1), F.elu(k.to(work)).add_(1), v), state

    def cost(self, shape: Shape) -> Cost:
        elu_plus_one = 2 * (shape.n_q + shape.n_k) * shape.head_dim
        return _feature_cost(shape, shape.head_dim, self.chunk_size, feature_matmul=0, feature_other=elu_plus_one)


STREAM_BLOCK = 1024  # positions per block in the streamed forward: 8 heads x 1024 x 256 features = 8 MiB


def _finite_or_zero(x: Tensor) -> Tensor:
    """-inf (no real key at all) read as 0: every feature is zero whatever the scale."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def running_key_scale(key_max: Tensor) -> Tensor:
    """(b, h, n) per-key log max (-inf for padding) -> the causal stabilizer g: the running max up to each key.

    Before the first real key the running max is -inf; it is read as the first real key's value instead, so g
    stays non-decreasing (the chunked core needs it) and finite. Only positions whose every visible key is
    padding take a later key's scale there, and they output zeros whatever the scale.
    """
    running = key_max.cummax(dim=-1).values
    real_so_far = torch.isfinite(running)
    first_real = torch.where(real_so_far, running, float("inf")).amin(dim=-1, keepdim=True)  # inf: no real key
    first_real = _finite_or_zero(first_real)
    return torch.where(real_so_far, running, first_real)


def _in_place_ok(x: Tensor) -> bool:
    return not (torch.is_grad_enabled() and x.requires_grad)


def _minus(x: Tensor, y: Tensor) -> Tensor:
    """x - y, in place when no gradient needs x (saves a pass over N x m at long N)."""
    return x.sub_(y) if _in_place_ok(x) else x - y


def _exp(x: Tensor) -> Tensor:
    return x.exp_() if _in_place_ok(x) else x.exp()


def orthogonal_features(head_dim: int, features: int, generator: torch.Generator) -> Tensor:
    """(m, d): blocks of d orthogonal directions, rows scaled by chi(d)-distributed norms.

    Each block is a Haar-random orthogonal matrix: the Q of a Gaussian's QR with its columns' signs fixed by
    R's diagonal (Q diag(sign(diag R))). Without that correction QR's sign convention makes direction i point
    away from axis i more often than not, and the estimate of the softmax kernel is biased.
    """
    blocks = []
    for _ in range(math.ceil(features / head_dim)):
        q, r = torch.linalg.qr(torch.randn(head_dim, head_dim, generator=generator, dtype=torch.float64))
        blocks.append((q * torch.sgn(torch.diagonal(r))).T)
    directions = torch.cat(blocks)[:features]
    norms = torch.randn(features, head_dim, generator=generator, dtype=torch.float64).norm(dim=1, keepdim=True)
    return directions * norms


class PerformerAttention(AttentionVariant):
    """FAVOR+: positive orthogonal random features estimating the softmax kernel."""

    name = "performer"
    family = "linear"
    exact = False
    supports = Capabilities(subquadratic_memory=True)
    hyperparameters = {
        "features": Hyperparameter(256, "m: random features (more: closer to softmax, slower)", minimum=1),
        "chunk_size": CHUNK,
        "orthogonal": Hyperparameter(True, "orthogonal blocks of directions (FAVOR+); False: iid Gaussian rows", bool),
        "kernel": Hyperparameter(
            "positive", "positive: exp(w.x - |x|^2/2) (FAVOR+); trig: exp(|x|^2/2) [sin w.x, cos w.x]", str,
            choices=KERNELS,
        ),
    }

    @kept_on_instance
    def projection(self, head_dim: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(m, d) feature directions, with the data normalizer d^(-1/4) folded in."""
        generator = torch.Generator().manual_seed(self.seed)
        if self.orthogonal:
            directions = orthogonal_features(head_dim, self.features, generator)
        else:
            directions = torch.randn(self.features, head_dim, generator=generator, dtype=torch.float64)
        return (directions * head_dim**-0.25).to(device, dtype)

    def _projected(self, x: Tensor) -> Tensor:
        """w . x' for every feature: (b, h, n, m), as one flat matmul (a batched einsum ran 2.5x slower)."""
        features = self.projection(x.shape[-1], x.device, x.dtype)
        return (x.reshape(-1, x.shape[-1]) @ features.T).view(*x.shape[:-1], features.shape[0])

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        if self.kernel == "trig":
            return self._trigonometric(q, k, v, causal, key_padding_mask)
        if not causal and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))):
            return self._streamed(q, k, v, key_padding_mask)
        work = accumulation_dtype(q.dtype)
        q, k = q.to(work), k.to(work)
        # Queries: exp(w.q' - |q'|^2/2) / sqrt(m) up to a per-query factor, which cancels in the query's
        # normalization; subtracting the query's own max keeps exp() in range.
        phi_q = _exp(self._log_query(q))
        # Keys: the per-key |k'|^2 / 2 matters; one common stabilizer (it cancels) keeps exp() in range.
        log_k = self._log_key(k)
        if key_padding_mask is not None:  # padded keys neither count nor set the stabilizer
            log_k = log_k.masked_fill(key_padding_mask[:, None, :, None], float("-inf"))
        key_max = log_k.amax(dim=-1).detach()  # (b, h, n)
        if causal:  # only keys up to each position may set its scale: a global max would leak the future
            running = running_key_scale(key_max)
            phi_k = _exp(_minus(log_k, running[..., None]))
            return causal_feature_attention(phi_q, phi_k, v, chunk=self.chunk_size, key_log_scale=running)
        top = _finite_or_zero(key_max.amax(dim=-1, keepdim=True))  # over all (real) keys
        return feature_attention(phi_q, _exp(_minus(log_k, top[..., None])), v)

    def unsupported_reason(self, **options: Any) -> str | None:
        if options.get("decode") and self.kernel != "positive":
            return "performer decodes with the positive kernel only (kernel='positive')"
        return super().unsupported_reason(**options)

    def _log_query(self, q: Tensor) -> Tensor:
        """A query's log features up to its own factor (which cancels in its normalization), its max subtracted."""
        log_q = self._projected(q)
        return _minus(log_q, log_q.amax(dim=-1, keepdim=True).detach())

    def _log_key(self, k: Tensor) -> Tensor:
        """A key's log features w . k' - |k'|^2 / 2 (the per-key term matters for keys)."""
        return _minus(self._projected(k), k.square().sum(dim=-1, keepdim=True) * (k.shape[-1] ** -0.5 / 2))

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The causal forward, and the RNN state: sum_j phi(k_j) [v_j 1] (m x (e + 1) per head, constant in N),
        relative to exp of the largest key log feature so far (the causal stabilizer's running max)."""
        if self.kernel != "positive":
            raise UnsupportedOptionError("performer decodes with the positive kernel only (kernel='positive')")
        log_k = self._log_key(k.to(accumulation_dtype(k.dtype)))
        top = log_k.amax(dim=(-2, -1), keepdim=True)  # (b, h, 1, 1)
        return self(q, k, v, causal=True), FeatureState(key_state(_exp(_minus(log_k, top)), v), top, k.shape[-2])

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """Fused (float32 on the CPU, one token): one call of the C kernel `performer_step`, the features' projection
        and the running scale included. Eager: the features, then `FeatureState.step`."""
        if not isinstance(state, FeatureState):
            raise UnsupportedOptionError(f"performer cannot step from a {type(state).__name__}")
        if q.shape[-2] == 1 and usable(q, k, v, state.state, state.scale):
            features = self.projection(q.shape[-1], q.device, q.dtype)
            out = performer_step(q, k, v, state.state, state.scale, features)
            state.length += 1
            return out, state
        work = state.state.dtype
        log_k = self._log_key(k.to(work))
        top = torch.maximum(state.scale, log_k.amax(dim=-1, keepdim=True))  # (b, h, 1, 1)
        phi_q, phi_k = _exp(self._log_query(q.to(work))), _exp(_minus(log_k, top))
        return state.step(phi_q, phi_k, v, key_log_scale=top), state

    def _trigonometric(
        self, q: Tensor, k: Tensor, v: Tensor, causal: bool, key_padding_mask: Tensor | None
    ) -> Tensor:
        """The paper's trigonometric baseline (Choromanski et al. 2021, eq. 4 with sin and cos): an unbiased but
        not positive estimate of the softmax kernel, exp(|x'|^2 / 2) [sin w.x', cos w.x'] / sqrt(m). The query's
        factor cancels in its normalization; the keys' is stabilized like the positive features' (max over keys, or
        the running max under causal). Denominators may be negative or zero: only an exact zero gives zeros."""
        work = accumulation_dtype(q.dtype)
        q, k = q.to(work), k.to(work)
        angle_q, angle_k = self._projected(q), self._projected(k)
        phi_q = torch.cat([angle_q.sin(), angle_q.cos()], dim=-1)  # (b, h, n, 2m)
        log_k = k.square().sum(dim=-1) * (k.shape[-1] ** -0.5 / 2)  # (b, h, n): |k'|^2 / 2
        if key_padding_mask is not None:
            log_k = log_k.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        scale = running_key_scale(log_k) if causal else _finite_or_zero(log_k.amax(dim=-1, keepdim=True))
        weight = (log_k - scale).exp()[..., None]  # 0 for padded keys
        phi_k = torch.cat([angle_k.sin(), angle_k.cos()], dim=-1) * weight
        if causal:
            return causal_feature_attention(phi_q, phi_k, v, chunk=self.chunk_size, key_log_scale=scale)
        return feature_attention(phi_q, phi_k, v)

    def _streamed(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """Non-causal without autograd, in blocks of positions that stay in cache: the N x m features are
        never held whole. Keys are stabilized by a running max, the state rescaled when it grows (as in
        online softmax), which ends equal to stabilizing by the max over all keys. The running max stays
        -inf until a real key arrives (no floor: a floor would underflow every later key below it)."""
        work = accumulation_dtype(q.dtype)
        n, block = k.shape[-2], STREAM_BLOCK
        state = top = None
        for start in range(0, n, block):
            keys = k[:, :, start : start + block].to(work)
            log_k = self._projected(keys).sub_(keys.square().sum(dim=-1, keepdim=True) * (keys.shape[-1] ** -0.5 / 2))
            if key_padding_mask is not None:
                log_k.masked_fill_(key_padding_mask[:, None, start : start + block, None], float("-inf"))
            block_top = log_k.amax(dim=(-2, -1), keepdim=True)  # (b, h, 1, 1), -inf when every key is padding
            new_top = block_top if top is None else torch.maximum(top, block_top)
            # (b, h, m, n) @ (b, h, n, e + 1): a plain matmul on the transposed view (einsum ran 2x slower here)
            block_features = log_k.sub_(_finite_or_zero(new_top)).exp_().transpose(-1, -2)
            block_state = block_features @ with_ones(v[:, :, start : start + block], work)
            if state is not None:  # rescale to the new max; a state of padding only is zero (and top -inf)
                state = state.mul_(torch.where(torch.isfinite(top), (top - new_top).exp(), 0.0)).add_(block_state)
            else:
                state = block_state
            top = new_top
        out = v.new_empty(*q.shape[:-1], v.shape[-1], dtype=work)  # written block by block: no concatenation
        for start in range(0, q.shape[-2], block):
            log_q = self._projected(q[:, :, start : start + block].to(work))
            phi_q = log_q.sub_(log_q.amax(dim=-1, keepdim=True)).exp_()
            out[:, :, start : start + block] = normalized(phi_q @ state)  # (b, h, n, m) @ (b, h, m, e + 1)
        return out.to(v.dtype)

    def cost(self, shape: Shape) -> Cost:
        projection = 2 * (shape.n_q + shape.n_k) * shape.head_dim * self.features
        stabilized_exp = 4 * (shape.n_q + shape.n_k) * self.features
        width = self.features * (2 if self.kernel == "trig" else 1)  # sin and cos: two features per direction
        return _feature_cost(
            shape, width, self.chunk_size, feature_matmul=projection, feature_other=stabilized_exp, decayed=True
        )
