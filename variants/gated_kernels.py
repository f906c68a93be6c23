"""Gated and delta-rule linear attention kernels, public, each in two forms with one signature: recurrent (one position
at a time: the decode step, and the reference) and chunkwise (parallel inside chunks of C positions, a state carried
across chunks: the prefill and training form). Gated linear attention is here; the delta rule in delta_kernels.py,
re-exported, so one import serves.

The operators, with a state S (d x e) per head, gates given explicitly as log decays (<= 0):
- gated linear (RetNet, GLA, Mamba2's scalar form): S_t = diag(exp gk_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t.
  `gk` is (b, h, n, d), one decay per key dimension (GLA), or (b, h, n, 1), one per position and head (RetNet's
  fixed log gamma_h, Mamba2, simple GLA); a 1 in b or h broadcasts.
- gated delta rule (DeltaNet with g = None, Gated DeltaNet): S'_t = exp(g_t) S_{t-1};
  u_t = beta_t (v_t - S'_t^T k_t); S_t = S'_t + k_t u_t^T; o_t = scale S_t^T q_t (delta_kernels.py).

Conventions are those of fla's reference implementations (`fla/ops/{retention,gla,delta_rule,gated_delta_rule}/
naive.py` in the `fla-core` package) in this suite's layout: q, k (b, h, n, d), v (b, h, n, e) (fla's GLA and gated
delta rule take (b, n, h, d): transpose 1 and 2); scale (positive) defaults to d^-1/2 and multiplies q;
`initial_state` (b, h, d, e); each kernel returns the output (b, h, n, e) in v's dtype and, with
`output_final_state`, the final state. Everything accumulates in float32 (float64 when an input is float64). Log
decays below MIN_LOG_DECAY (-100: a reset to float precision) are clamped there, -inf included. Arguments are checked
before any work (a ValueError naming what is wrong). A non-finite value in a chunkwise call spreads to its whole chunk.

Chunkwise, within a chunk with cumulative log decays b_i (from the chunk's start, inclusive), the pairs (i, j <= i)
are a (C x C) matrix of q_i . k_j exp(b_i - b_j): for a scalar gate the decay matrix exp(b_i - b_j) is formed
directly (every entry <= 1); per key dimension as (q_i exp b_i) . (k_j exp -b_j) where |b| stays within
STABLE_LOG_DECAY over the chunk, and where it does not, relative to the start of each query's sub-block of SUB
positions (every factor <= 1), pair by pair inside a sub-block (fla's secondary chunking).

b - batch, h - heads, n - position, c - chunk, i - query in chunk, j - key in chunk, d - key dim, e - value dim,
m - sub-block, s - strong chunk
"""

from __future__ import annotations

import math

import torch
from attnbench.variants.delta_kernels import gated_delta_chunkwise, gated_delta_recurrent
from attnbench.variants.recurrent_forms import (
    IN_PLACE,
    STABLE_LOG_DECAY,
    checked,
    chunks,
    pair_decay,
    recurrence,
    unchunked,
)
from einops import einsum, rearrange
from torch import Tensor

__all__ = [
    "gated_delta_chunkwise", "gated_delta_recurrent", "gated_linear_chunkwise", "gated_linear_recurrent",
    "strong_chunk_bytes",
]  # fmt: skip

SUB = 16  # positions per sub-block of a chunk past that range
STRONG_BYTES = 32 * 2**20  # chunks past the range are worked through a few at a time, in about this much memory


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
    x = checked(q, k, v, {"gk": gk}, scale=scale, initial_state=initial_state)
    gates = x.gates["gk"]
    assert gates is not None

    def write(t: int, state: Tensor) -> Tensor:
        return state * gates[:, :, t, :, None].exp() + einsum(x.k[:, :, t], x.v[:, :, t], "b h d, b h e -> b h d e")

    return recurrence(x, x.q * x.scale, write, output_final_state)


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
    """`gated_linear_recurrent`, parallel inside chunks of `chunk_size` positions (at most N); the same arguments and
    results."""
    x = checked(q, k, v, {"gk": gk}, scale=scale, initial_state=initial_state, chunk_size=chunk_size)
    if x.n == 0:
        return x.empty(output_final_state)
    chunk, log_scale = min(chunk_size, x.n), math.log(x.scale)
    # (b, h, c, i, z): views where nothing is padded; the loop over chunks only adds states, no matrix products
    q_c, k_c, v_c, g_c = (chunks(t, chunk, IN_PLACE) for t in (x.q, x.k, x.v, x.gates["gk"]))
    decay = g_c.cumsum(dim=-2)  # (b, h, c, i, d|1): log decay from the chunk's start to position i, inclusive
    to_end = decay[..., -1:, :]  # (b, h, c, 1, d|1): the whole chunk's
    decayed_q = q_c * (decay + log_scale).exp()  # scale q_i e^(b_i): reads the state left by earlier chunks
    if g_c.shape[-1] == 1:
        scores = einsum(q_c, k_c, "b h c i d, b h c j d -> b h c i j") * pair_decay(decay, log_scale)
        # what each chunk adds to the state, decayed to the chunk's end: (b, h, c, d, e)
        written = einsum(k_c * (to_end - decay).exp(), v_c, "b h c j d, b h c j e -> b h c d e")
    else:
        scores, written = _per_dimension(decayed_q, q_c, k_c, v_c, decay, log_scale)
    within = einsum(scores, v_c, "b h c i j, b h c j e -> b h c i e")
    chunk_decay = rearrange(to_end.exp(), "b h c 1 d -> b h c d 1")
    state, before = x.state(), []
    for index in range(written.shape[2]):  # the state before each chunk
        before.append(state)
        state = torch.addcmul(written[:, :, index], state, chunk_decay[:, :, index])
    carried = einsum(decayed_q, torch.stack(before, dim=2), "b h c i d, b h c d e -> b h c i e")
    return unchunked(within.add_(carried), x.n, x.dtype, IN_PLACE), state if output_final_state else None


def _per_dimension(
    decayed_q: Tensor, q_c: Tensor, k_c: Tensor, v_c: Tensor, decay: Tensor, log_scale: float
) -> tuple[Tensor, Tensor]:
    """Decays per key dimension: the pair scores scale sum_d q_id k_jd exp(b_id - b_jd) (j <= i, 0 above)
    (b, h, c, i, j) and each chunk's write to the state sum_j diag(exp(b_C - b_j)) k_j v_j^T (b, h, c, d, e).

    As (q e^b) . (k e^-b), and the write as e^(b_C) (k e^-b)^T V, where the chunk's log decays stay within
    STABLE_LOG_DECAY; the other chunks through `_strong_scores`, a few at a time, and their writes directly."""
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
    group = max(1, STRONG_BYTES // strong_chunk_bytes(chunk, q_c.shape[-1], q_c.element_size(), group=1))
    pair_scores, writes = [], []
    for start in range(0, len(chosen), group):
        pick = chosen[start : start + group]
        pair_scores.append(_strong_scores(q_f[pick], k_f[pick], b_f[pick], log_scale))
        keys_to_end = k_f[pick] * (b_f[pick, -1:, :] - b_f[pick]).exp()
        writes.append(einsum(keys_to_end, v_f[pick], "s j d, s j e -> s d e"))
    shape = dict(b=scores.shape[0], h=scores.shape[1])
    scores = rearrange(flat(scores).index_copy(0, chosen, torch.cat(pair_scores)), "(b h c) i j -> b h c i j", **shape)
    written = rearrange(flat(written).index_copy(0, chosen, torch.cat(writes)), "(b h c) d e -> b h c d e", **shape)
    return scores, written


def strong_chunk_bytes(chunk: int, head_dim: int, element_bytes: int, group: int | None = None) -> int:
    """What `_strong_scores` holds for `group` chunks at once (its largest parts: about three tensors of
    C d (C / SUB + SUB) each); by default the most a call holds, a group filling STRONG_BYTES or one chunk past it."""
    sub = min(SUB, chunk)
    one = 3 * (-(-chunk // sub) + sub) * chunk * head_dim * element_bytes
    return one * group if group is not None else max(one, STRONG_BYTES)


def _strong_scores(q: Tensor, k: Tensor, b: Tensor, log_scale: float) -> Tensor:
    """Chunks whose log decays b (s, C, d) run past float range: scale sum_d q_id k_jd exp(b_id - b_jd), j <= i,
    (s, C, C). Queries in sub-blocks of SUB positions: against the keys before their sub-block relative to the log
    decay r just before it, (q_i e^(b_i - r)) . (k_j e^(r - b_j)) with both exponents <= 0; inside it, pair by pair.
    Memory about C d (C / SUB + SUB) per chunk, not C^2 d."""
    s, chunk, d = q.shape
    sub = min(SUB, chunk)
    pad = -chunk % sub
    if pad:  # keys and queries of zeros; log decays held at the last one (never read across)
        q, k = (torch.nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k))
        b = torch.cat([b, b[:, -1:].expand(s, pad, d)], dim=1)
    size = chunk + pad
    blocks = size // sub
    q_m, k_m, b_m = (rearrange(t, "s (m i) d -> s m i d", i=sub) for t in (q, k, b))
    reference = torch.cat([torch.zeros_like(b_m[:, :1, 0]), b_m[:, :-1, -1]], dim=1)  # (s, m, d): just before m
    relative_q = q_m * (b_m - reference[:, :, None] + log_scale).exp()  # (s, m, i, d)
    key_block = torch.arange(size, device=q.device) // sub  # (j,)
    earlier = key_block[None, :] < torch.arange(blocks, device=q.device)[:, None]  # (m, j): keys before block m
    gap = (reference[:, :, None, :] - b[:, None, :, :]).masked_fill(~earlier[None, :, :, None], float("-inf"))
    across = einsum(relative_q, k[:, None] * gap.exp(), "s m i d, s m j d -> s m i j")  # (s, m, i, size)
    inside = torch.arange(sub, device=q.device)
    causal = inside[:, None] >= inside[None, :]
    pair_gap = (b_m[:, :, :, None] - b_m[:, :, None, :]).masked_fill(~causal[..., None], float("-inf"))
    own = einsum(q_m[:, :, :, None] * k_m[:, :, None] * (pair_gap + log_scale).exp(), "s m i j d -> s m i j")
    scores = rearrange(across, "s m i (n j) -> s m i n j", j=sub)
    own_block = torch.eye(blocks, dtype=torch.bool, device=q.device)[None, :, None, :, None]  # (1, m, 1, n, 1)
    scores = torch.where(own_block, own[:, :, :, None], scores)  # the diagonal sub-blocks from the pairs
    return rearrange(scores, "s m i n j -> s (m i) (n j)")[:, :chunk, :chunk]
