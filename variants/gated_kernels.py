"""Gated and delta-rule linear attention kernels, each in two forms with one signature: recurrent (one position at a
time: the decode step, and the reference) and chunkwise (parallel inside chunks of C positions, a state carried
across chunks: the prefill and training form).

The operators, with a state S (d x e) per head, gates given explicitly as log decays (<= 0):
- gated linear (RetNet, GLA, Mamba2's scalar form): S_t = diag(exp gk_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t.
  `gk` is (b, h, n, d), one decay per key dimension (GLA), or (b, h, n, 1), one per position and head (RetNet's
  fixed log gamma_h, Mamba2, simple GLA).
- gated delta rule (DeltaNet with g = None, Gated DeltaNet): S'_t = exp(g_t) S_{t-1};
  u_t = beta_t (v_t - S'_t^T k_t); S_t = S'_t + k_t u_t^T; o_t = scale S_t^T q_t. The state's prediction of v_t
  from k_t is corrected by a fraction beta_t (b, h, n) in (0, 1]; g (b, h, n) or None.

Conventions are those of fla's reference implementations (`fla/ops/{retention,gla,delta_rule,gated_delta_rule}/
naive.py` in the `fla-core` package) in this suite's layout: q, k (b, h, n, d), v (b, h, n, e) (fla's GLA and gated
delta rule take (b, n, h, d): transpose 1 and 2); scale defaults to d^-1/2 and multiplies q; `initial_state`
(b, h, d, e); each kernel returns the output (b, h, n, e) in v's dtype and, with `output_final_state`, the final
state (float32, or float64 for float64 inputs). Everything accumulates in float32 (float64 for float64).

Chunkwise, within a chunk with cumulative log decays b_i (from the chunk's start, inclusive), the pairs (i, j <= i)
are a (C x C) matrix of q_i . k_j exp(b_i - b_j): for a scalar gate the decay matrix exp(b_i - b_j) is formed
directly (every entry <= 1: no overflow whatever the gates); per key dimension as (q_i exp b_i) . (k_j exp -b_j),
exact while |b| stays within STABLE_LOG_DECAY over the chunk, and pair by pair (a C x C x d tensor) in chunks where it
does not. The delta rule's chunk is solved in the WY form (Yang et al. 2024): (I + A) U = diag(beta) (V - exp(b) K S_0)
with A_ij = beta_i exp(b_i - b_j) k_i . k_j (j < i), one unit-triangular solve per chunk, all chunks at once.

b - batch, h - heads, n - position, c - chunk, i - query in chunk, j - key in chunk, d - key dim, e - value dim
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor

NORM_EPS = 1e-12  # F.normalize's: a zero vector (a padded key) stays zero
STABLE_LOG_DECAY = 40.0  # exp(40) ~ 2e17: (q e^b) . (k e^-b) stays far from float32's range; beyond it, pair by pair
PAIRWISE_CHUNKS = 64  # chunks whose pairs are formed one by one, at most this many at a time (C x C x d floats each)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half types and float32, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _scale(q: Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else scale


def _initial(q: Tensor, v: Tensor, initial_state: Tensor | None, work: torch.dtype) -> Tensor:
    """The state before the first position: (b, h, d, e), zeros unless given."""
    if initial_state is not None:
        return initial_state.to(work)
    return torch.zeros(*q.shape[:2], q.shape[-1], v.shape[-1], dtype=work, device=q.device)


CHUNK_MAJOR, IN_PLACE = "c b h i z", "b h c i z"  # the two layouts of a chunked tensor


def _chunks(x: Tensor, chunk: int, dtype: torch.dtype, layout: str = CHUNK_MAJOR) -> Tensor:
    """(b, h, n, z) -> `layout` in `dtype`, zero-padded to whole chunks (zero gates, keys and beta: padding neither
    writes to the state nor decays it). CHUNK_MAJOR (c, b, h, i, z) is a contiguous copy, each chunk one block of
    memory, for a loop of matrix products over chunks; IN_PLACE (b, h, c, i, z) is a view where nothing is padded."""
    pad = -x.shape[-2] % chunk
    x = F.pad(x, (0, 0, 0, pad)) if pad else x
    chunked = rearrange(x.to(dtype), f"b h (c i) z -> {layout}", i=chunk)
    return chunked.contiguous() if layout == CHUNK_MAJOR else chunked


def _unchunked(x: Tensor, n: int, dtype: torch.dtype, layout: str = CHUNK_MAJOR) -> Tensor:
    """`layout` (e for z) -> (b, h, n, e) in `dtype`, the padding dropped (a view where nothing needs copying)."""
    return rearrange(x, f"{layout} -> b h (c i) z")[:, :, :n].to(dtype)


def _pair_decay(b: Tensor, log_scale: float = 0.0) -> Tensor:
    """b (..., i, 1): a scalar gate's cumulative log decay in each chunk -> scale exp(b_i - b_j) for j <= i, 0 above:
    (..., i, j), every entry in [0, scale]."""
    chunk = b.shape[-2]
    positions = torch.arange(chunk, device=b.device)
    later = positions[:, None] >= positions[None, :]
    difference = b - b.mT  # (..., i, j): b_i - b_j
    return difference.add_(log_scale).masked_fill_(~later, float("-inf")).exp_()  # in place on a fresh tensor


def _recurrence(
    q: Tensor, v: Tensor, state: Tensor, write: Callable[[int, Tensor], Tensor], output_final_state: bool,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """The recurrent form of either operator: per position t the state after `write(t, state)`, read by the (scaled)
    query: o_t = S_t^T q_t. q (b, h, n, d) and v (b, h, n, e) in the work dtype -> o in `dtype` (the inputs'), the
    final state."""
    outputs = []
    for t in range(q.shape[-2]):
        state = write(t, state)
        outputs.append(einsum(q[:, :, t], state, "b h d, b h d e -> b h e"))
    out = torch.stack(outputs, dim=2) if outputs else torch.zeros_like(v)
    return out.to(dtype), state if output_final_state else None


# ---- gated linear attention: RetNet, GLA, Mamba2 (scalar) -------------------------------------------------------


def gated_linear_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One position at a time: S_t = diag(exp gk_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t.

    q, k (b, h, n, d), v (b, h, n, e), gk (b, h, n, d | 1) -> o (b, h, n, e), the final state (b, h, d, e) or None."""
    work, dtype = accumulation_dtype(q.dtype), v.dtype
    q, k, v, gk = (t.to(work) for t in (q, k, v, gk))
    q = q * _scale(q, scale)

    def write(t: int, state: Tensor) -> Tensor:
        return state * gk[:, :, t, :, None].exp() + einsum(k[:, :, t], v[:, :, t], "b h d, b h e -> b h d e")

    return _recurrence(q, v, _initial(q, v, initial_state, work), write, output_final_state, dtype)


def gated_linear_chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gk: Tensor,
    *,
    chunk_size: int = 64,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`gated_linear_recurrent`, parallel inside chunks of `chunk_size` positions; the same arguments and results."""
    work = accumulation_dtype(q.dtype)
    n, log_scale = q.shape[-2], math.log(_scale(q, scale))
    # (b, h, c, i, z): views where nothing is padded; the loop over chunks only adds states, no matrix products
    q_c, k_c, v_c, g_c = (_chunks(t, chunk_size, work, IN_PLACE) for t in (q, k, v, gk))
    decay = g_c.cumsum(dim=-2)  # (b, h, c, i, d|1): log decay from the chunk's start to position i, inclusive
    to_end = decay[..., -1:, :]  # (b, h, c, 1, d|1): the whole chunk's
    decayed_q = q_c * (decay + log_scale).exp()  # scale q_i e^(b_i): reads the state left by earlier chunks
    if gk.shape[-1] == 1:
        scores = einsum(q_c, k_c, "b h c i d, b h c j d -> b h c i j") * _pair_decay(decay, log_scale)
        # what each chunk adds to the state, decayed to the chunk's end: (b, h, c, d, e)
        written = einsum(k_c * (to_end - decay).exp(), v_c, "b h c j d, b h c j e -> b h c d e")
    else:
        scores, written = _per_dimension(decayed_q, q_c, k_c, v_c, decay, log_scale)
    within = einsum(scores, v_c, "b h c i j, b h c j e -> b h c i e")
    chunk_decay = rearrange(to_end.exp(), "b h c 1 d -> b h c d 1")
    state, before = _initial(q, v, initial_state, work), []
    for index in range(written.shape[2]):  # the state before each chunk
        before.append(state)
        state = torch.addcmul(written[:, :, index], state, chunk_decay[:, :, index])
    carried = einsum(decayed_q, torch.stack(before, dim=2), "b h c i d, b h c d e -> b h c i e")
    return _unchunked(within.add_(carried), n, v.dtype, IN_PLACE), state if output_final_state else None


def _per_dimension(
    decayed_q: Tensor, q_c: Tensor, k_c: Tensor, v_c: Tensor, decay: Tensor, log_scale: float
) -> tuple[Tensor, Tensor]:
    """Decays per key dimension: the pair scores scale sum_d q_id k_jd exp(b_id - b_jd) (j <= i, 0 above)
    (b, h, c, i, j) and each chunk's write to the state sum_j diag(exp(b_C - b_j)) k_j v_j^T (b, h, c, d, e).

    As (q e^b) . (k e^-b), and the write as e^(b_C) (k e^-b)^T V, where the chunk's log decays stay within
    STABLE_LOG_DECAY; the other chunks pair by pair, PAIRWISE_CHUNKS at a time (C x C x d floats each)."""
    chunk = q_c.shape[-2]
    positions = torch.arange(chunk, device=q_c.device)
    causal = positions[:, None] >= positions[None, :]  # (i, j)
    strong = decay.detach()[..., -1, :].abs().amax(dim=-1) > STABLE_LOG_DECAY  # (b, h, c): b runs down to b_C
    any_strong = bool(strong.any())
    safe = torch.where(strong[..., None, None], 0.0, decay) if any_strong else decay  # strong chunks: redone below
    grown_k = k_c * (-safe).exp()
    scores = einsum(decayed_q, grown_k, "b h c i d, b h c j d -> b h c i j").masked_fill_(~causal, 0.0)
    end = rearrange(safe[..., -1:, :].exp(), "b h c 1 d -> b h c d 1")
    written = einsum(grown_k, v_c, "b h c j d, b h c j e -> b h c d e") * end
    if not any_strong:
        return scores, written
    chosen = strong.flatten().nonzero().squeeze(-1)
    flat = lambda t: rearrange(t, "b h c i z -> (b h c) i z")  # noqa: E731
    q_f, k_f, v_f, b_f = flat(q_c), flat(k_c), flat(v_c), flat(decay)
    pair_scores, writes = [], []
    for start in range(0, len(chosen), PAIRWISE_CHUNKS):
        pick = chosen[start : start + PAIRWISE_CHUNKS]
        gap = (b_f[pick, :, None, :] - b_f[pick, None, :, :]).masked_fill(~causal[..., None], float("-inf"))
        pairs = q_f[pick, :, None, :] * k_f[pick, None, :, :] * (gap + log_scale).exp()  # (s, i, j, d)
        pair_scores.append(pairs.sum(dim=-1))
        keys_to_end = k_f[pick] * (b_f[pick, -1:, :] - b_f[pick]).exp()
        writes.append(einsum(keys_to_end, v_f[pick], "s j d, s j e -> s d e"))
    shape = dict(b=scores.shape[0], h=scores.shape[1])
    scores = rearrange(flat(scores).index_copy(0, chosen, torch.cat(pair_scores)), "(b h c) i j -> b h c i j", **shape)
    written = rearrange(flat(written).index_copy(0, chosen, torch.cat(writes)), "(b h c) d e -> b h c d e", **shape)
    return scores, written


# ---- delta rule: DeltaNet, Gated DeltaNet --------------------------------------------------------------------


def gated_delta_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    l2_normalize_qk: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One position at a time: S'_t = exp(g_t) S_{t-1}, u_t = beta_t (v_t - S'_t^T k_t), S_t = S'_t + k_t u_t^T,
    o_t = scale S_t^T q_t. q, k (b, h, n, d), v (b, h, n, e), beta (b, h, n), g (b, h, n) or None (DeltaNet)
    -> o (b, h, n, e), the final state (b, h, d, e) or None. `l2_normalize_qk`: q and k divided by their L2 norms
    first, inside the kernel (fla's `use_qk_l2norm_in_kernel`; DeltaNet's layers normalise them)."""
    work, dtype = accumulation_dtype(q.dtype), v.dtype
    q, k, v, beta = (t.to(work) for t in (q, k, v, beta))
    if l2_normalize_qk:
        q, k = F.normalize(q, dim=-1, eps=NORM_EPS), F.normalize(k, dim=-1, eps=NORM_EPS)
    q = q * _scale(q, scale)

    def write(t: int, state: Tensor) -> Tensor:
        if g is not None:
            state = state * g[:, :, t, None, None].to(work).exp()
        predicted = einsum(state, k[:, :, t], "b h d e, b h d -> b h e")
        written = (v[:, :, t] - predicted) * beta[:, :, t, None]
        return state + einsum(k[:, :, t], written, "b h d, b h e -> b h d e")

    return _recurrence(q, v, _initial(q, v, initial_state, work), write, output_final_state, dtype)


def gated_delta_chunkwise(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor | None = None,
    *,
    chunk_size: int = 64,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    l2_normalize_qk: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`gated_delta_recurrent`, parallel inside chunks of `chunk_size` positions (the WY form); the same arguments and
    results. The normalisation of q and k (`l2_normalize_qk`) is folded into the passes that scale them anyway.

    Inside a chunk starting from state S, with b the cumulative log decay: U = U~ - W S, where
    (I + A) U~ = diag(beta) V and (I + A) W = diag(beta exp b) K; then O = (Q exp b) S + (Q K^T * Gamma) U with
    Gamma_ij = exp(b_i - b_j) (j <= i), and the next state exp(b_C) S + (K exp(b_C - b))^T U."""
    work = accumulation_dtype(q.dtype)
    n, e = q.shape[-2], v.shape[-1]
    q_c, k_c, v_c, beta_c = (_chunks(t, chunk_size, work) for t in (q, k, v, beta[..., None]))  # (c, b, h, i, z)
    scale = _scale(q, scale)
    positions = torch.arange(q_c.shape[-2], device=q.device)
    above = positions[:, None] < positions[None, :]  # (i, j)
    decay = None if g is None else _chunks(g[..., None], chunk_size, work).cumsum(dim=-2)  # (c, b, h, i, 1)
    strong = decay is not None and bool(decay.detach().amin() < -STABLE_LOG_DECAY)  # past float range in a chunk
    unit_q = unit_k = 1.0  # what normalises q and k: (c, b, h, i, 1) factors folded into the passes below
    if l2_normalize_qk:
        unit_q, unit_k = (t.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS).reciprocal() for t in (q_c, k_c))
        if strong:
            q_c, k_c, unit_q, unit_k = q_c * unit_q, k_c * unit_k, 1.0, 1.0
    # the state's update per chunk: S' = (S * before + K_hat^T U) * after, with K_hat the keys decayed to the end
    before_update = after_update = None
    if decay is None:  # DeltaNet: Gamma is the causal mask
        decayed_q, written_k = q_c * (unit_q * scale), k_c * (unit_k * beta_c)
        grown_k = keys_to_end = k_c * unit_k if l2_normalize_qk else k_c
    else:
        shrink, to_end = decay.exp(), decay[..., -1:, :]  # (c, b, h, i, 1), (c, b, h, 1, 1)
        decayed_q, written_k = q_c * (shrink * scale * unit_q), k_c * (shrink * beta_c * unit_k)  # q e^b; beta k e^b
        if not strong:  # Gamma_ij = e^(b_i) e^(-b_j): folded into the factors
            grown_k = keys_to_end = k_c * ((-decay).exp() * unit_k)  # k e^(-b); e^(b_C) applied to the update
            after_update = to_end.exp()
        else:  # Gamma as a matrix, every entry in [0, 1]
            grown_k, keys_to_end, before_update = None, k_c * (to_end - decay).exp(), to_end.exp()
    if grown_k is not None:
        scores = einsum(decayed_q, grown_k, "c b h i d, c b h j d -> c b h i j").masked_fill_(above, 0.0)
        below = einsum(written_k, grown_k, "c b h i d, c b h j d -> c b h i j")
    else:
        pair = _pair_decay(decay)  # (c, b, h, i, j): exp(b_i - b_j), j <= i
        scores = einsum(q_c, k_c, "c b h i d, c b h j d -> c b h i j") * (pair * scale)
        below = einsum(k_c, k_c, "c b h i d, c b h j d -> c b h i j") * pair * beta_c
    # A, read below its diagonal only (unitriangular); (I + A) [U~ W] = [diag(beta) V  diag(beta e^b) K], solved
    # transposed, [U~ W]^T (I + A)^T = rhs^T: LAPACK reads the row-major A and rhs as they lie and writes a row-major
    # solution (solved as written, it would copy both into column-major order first)
    solve = lambda rhs: torch.linalg.solve_triangular(  # noqa: E731
        below.mT, rhs.mT, upper=True, left=False, unitriangular=True
    ).mT
    pseudo_values, weights = solve(v_c * beta_c), solve(written_k)  # U~ (.., i, e), W (.., i, d)
    # the loop's operands with batch and heads as one axis, for baddbmm: (c, (b h), ...)
    keys_to_end = rearrange(keys_to_end, "c b h j d -> c (b h) d j")
    pseudo_values, weights = (rearrange(t, "c b h i z -> c (b h) i z") for t in (pseudo_values, weights))
    before_update, after_update = (
        None if t is None else rearrange(t, "c b h 1 1 -> c (b h) 1 1") for t in (before_update, after_update)
    )
    state, before, written = rearrange(_initial(q, v, initial_state, work), "b h d e -> (b h) d e"), [], []
    recording = torch.is_grad_enabled()  # else U is written over U~, a fresh tensor of ours: no copy per chunk
    for index in range(q_c.shape[0]):  # the state before each chunk, and what each chunk writes (U = U~ - W S)
        before.append(state)
        update = torch.baddbmm if recording else torch.Tensor.baddbmm_
        written.append(update(pseudo_values[index], weights[index], state, alpha=-1))  # (bh, i, e)
        kept = state if before_update is None else state * before_update[index]
        state = torch.baddbmm(kept, keys_to_end[index], written[-1])
        state = state if after_update is None else state * after_update[index]
    per_head = lambda parts: rearrange(torch.stack(parts), "c (b h) x y -> c b h x y", b=q.shape[0])  # noqa: E731
    carried = einsum(decayed_q, per_head(before), "c b h i d, c b h d e -> c b h i e")
    out = carried + einsum(scores, per_head(written), "c b h i j, c b h j e -> c b h i e")
    final = rearrange(state, "(b h) d e -> b h d e", b=q.shape[0])
    return _unchunked(out, n, v.dtype), final if output_final_state else None
