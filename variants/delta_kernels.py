"""The delta rule (DeltaNet, and Gated DeltaNet with a scalar decay): recurrent and chunkwise, public, in the
conventions of gated_kernels.py (which re-exports them).

S'_t = exp(g_t) S_{t-1}; u_t = beta_t (v_t - S'_t^T k_t); S_t = S'_t + k_t u_t^T; o_t = scale S_t^T q_t: the state's
prediction of v_t from k_t corrected by a fraction beta_t (b, h, n); g (b, h, n) log decays, or None (DeltaNet).
`l2_normalize_qk` divides q and k by their L2 norms inside the kernel, as fla's l2norm does (x / sqrt(|x|^2 + 1e-6);
its `use_qk_l2norm_in_kernel`): DeltaNet's layers normalise them.

Chunkwise, in the WY form (Yang et al. 2024): inside a chunk starting from state S, with b the cumulative log decay,
U = U~ - W S where (I + A) U~ = diag(beta) V and (I + A) W = diag(beta e^b) K, A_ij = beta_i e^(b_i - b_j) k_i . k_j
(j < i); then O = (Q e^b) S + (Q K^T * Gamma) U, Gamma_ij = e^(b_i - b_j) (j <= i), and the next state
e^(b_C) S + (K e^(b_C - b))^T U. Two unit-triangular solves with one matrix (all chunks at once), then a loop over
chunks of two small products each. Gamma is folded into the factors (e^b, e^-b) while a chunk's log decays stay
within STABLE_LOG_DECAY, formed as a matrix when one does not (decided for the whole call).

b - batch, h - heads, n - position, c - chunk, i - query in chunk, j - key in chunk, d - key dim, e - value dim
"""

from __future__ import annotations

import torch
from attnbench.variants.recurrent_forms import (
    STABLE_LOG_DECAY,
    Inputs,
    checked,
    chunks,
    pair_decay,
    recurrence,
    unchunked,
    unit_norm_factor,
)
from einops import einsum, rearrange
from torch import Tensor



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
    """One position at a time. q, k (b, h, n, d), v (b, h, n, e), beta (b, h, n), g (b, h, n) or None
    -> o (b, h, n, e), the final state (b, h, d, e) or None."""
    x = checked(q, k, v, {"beta": beta, "g": g}, scale=scale, initial_state=initial_state)
    q, k = x.q, x.k
    if l2_normalize_qk:
        q, k = q * unit_norm_factor(q), k * unit_norm_factor(k)
    beta, decay = x.gates["beta"], x.gates["g"]
    assert beta is not None

    def write(t: int, state: Tensor) -> Tensor:
        if decay is not None:
            state = state * decay[:, :, t, None, None].exp()
        predicted = einsum(state, k[:, :, t], "b h d e, b h d -> b h e")
        written = (x.v[:, :, t] - predicted) * beta[:, :, t, None]
        return state + einsum(k[:, :, t], written, "b h d, b h e -> b h d e")

    return recurrence(x, q * x.scale, write, output_final_state)


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
    """`gated_delta_recurrent`, parallel inside chunks of `chunk_size` positions (at most N); the same arguments and
    results. The normalisation of q and k is folded into the passes that scale them anyway."""
    x = checked(q, k, v, {"beta": beta, "g": g}, scale=scale, initial_state=initial_state, chunk_size=chunk_size)
    if x.n == 0:
        return x.empty(output_final_state)
    chunk = min(chunk_size, x.n)
    q_c, k_c, v_c = (chunks(t, chunk) for t in (x.q, x.k, x.v))  # (c, b, h, i, z)
    beta_c = chunks(x.gates["beta"][..., None], chunk)  # type: ignore[index]
    g = x.gates["g"]
    decay = None if g is None else chunks(g[..., None], chunk).cumsum(dim=-2)  # (c, b, h, i, 1)
    # past float range in some chunk (a NaN gate counts: the matrix form keeps it inside its own sequence and head)
    strong = decay is not None and not bool(decay.detach().amin() >= -STABLE_LOG_DECAY)
    unit_q = unit_k = 1.0  # what normalises q and k: (c, b, h, i, 1) factors folded into the passes below
    if l2_normalize_qk:
        unit_q, unit_k = unit_norm_factor(q_c), unit_norm_factor(k_c)
        if strong:
            q_c, k_c, unit_q, unit_k = q_c * unit_q, k_c * unit_k, 1.0, 1.0
    scores, below, decayed_q, written_k, keys_to_end, before_update, after_update = _factors(
        q_c, k_c, beta_c, decay, strong, x.scale, unit_q, unit_k
    )
    # (I + A) [U~ W] = [diag(beta) V  diag(beta e^b) K], A read below its diagonal only (unitriangular), solved
    # transposed, [U~ W]^T (I + A)^T = rhs^T: LAPACK reads the row-major A and rhs as they lie and writes a row-major
    # solution (solved as written, it would copy both into column-major order first)
    solve = lambda rhs: torch.linalg.solve_triangular(  # noqa: E731
        below.mT, rhs.mT, upper=True, left=False, unitriangular=True
    ).mT
    pseudo_values, weights = solve(v_c * beta_c), solve(written_k)  # U~ (.., i, e), W (.., i, d)
    out, state = _across_chunks(x, pseudo_values, weights, keys_to_end, before_update, after_update)
    per_head = lambda t: rearrange(t, "c (b h) x y -> c b h x y", b=x.q.shape[0])  # noqa: E731
    carried = einsum(decayed_q, per_head(out[0]), "c b h i d, c b h d e -> c b h i e")
    result = carried + einsum(scores, per_head(out[1]), "c b h i j, c b h j e -> c b h i e")
    final = rearrange(state, "(b h) d e -> b h d e", b=x.q.shape[0])
    return unchunked(result, x.n, x.dtype), final if output_final_state else None


def _factors(
    q_c: Tensor,
    k_c: Tensor,
    beta_c: Tensor,
    decay: Tensor | None,
    strong: bool,
    scale: float,
    unit_q: Tensor | float,
    unit_k: Tensor | float,
) -> tuple[Tensor, ...]:
    """A chunk's pieces (all chunks at once): the scores (Q K^T * Gamma) scaled, A, Q e^b scaled, K e^b beta (W's
    right-hand side), the keys that update the state, and that update's decay before or after it: the state's update
    per chunk is S' = (S * before + K_hat^T U) * after (None: 1)."""
    above = torch.ones(q_c.shape[-2], q_c.shape[-2], dtype=torch.bool, device=q_c.device).triu(1)  # (i, j), j > i
    before_update = after_update = None
    if decay is None:  # DeltaNet: Gamma is the causal mask
        decayed_q, written_k = q_c * (unit_q * scale), k_c * (unit_k * beta_c)
        grown_k = keys_to_end = k_c * unit_k if isinstance(unit_k, Tensor) else k_c
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
        pair = pair_decay(decay)  # type: ignore[arg-type]  # (c, b, h, i, j): exp(b_i - b_j), j <= i
        scores = einsum(q_c, k_c, "c b h i d, c b h j d -> c b h i j") * (pair * scale)
        below = einsum(k_c, k_c, "c b h i d, c b h j d -> c b h i j") * pair * beta_c
    return scores, below, decayed_q, written_k, keys_to_end, before_update, after_update


def _across_chunks(
    x: Inputs,
    pseudo_values: Tensor,
    weights: Tensor,
    keys_to_end: Tensor,
    before_update: Tensor | None,
    after_update: Tensor | None,
) -> tuple[tuple[Tensor, Tensor], Tensor]:
    """The loop over chunks, batch and heads as one axis (for baddbmm): the state before each chunk (c, (b h), d, e),
    what each chunk writes, U = U~ - W S (c, (b h), i, e), and the final state ((b h), d, e)."""
    # each operand laid out once as the loop reads it (a strided view would be copied by every chunk's product)
    keys_to_end = rearrange(keys_to_end, "c b h j d -> c (b h) d j").contiguous()
    pseudo_values, weights = (rearrange(t, "c b h i z -> c (b h) i z").contiguous() for t in (pseudo_values, weights))
    before_update, after_update = (
        None if t is None else rearrange(t, "c b h 1 1 -> c (b h) 1 1") for t in (before_update, after_update)
    )
    chunks_, heads, d, e = pseudo_values.shape[0], pseudo_values.shape[1], keys_to_end.shape[-2], pseudo_values.shape[-1]
    recording = torch.is_grad_enabled()
    if recording:  # autograd: fresh tensors, nothing written in place
        state, before, written = rearrange(x.state(), "b h d e -> (b h) d e"), [], []
        for index in range(chunks_):
            before.append(state)
            written.append(torch.baddbmm(pseudo_values[index], weights[index], state, alpha=-1))  # (bh, i, e)
            kept = state if before_update is None else state * before_update[index]
            state = torch.baddbmm(kept, keys_to_end[index], written[-1])
            state = state if after_update is None else state * after_update[index]
        return (torch.stack(before), torch.stack(written)), state
    # no autograd: U written over U~ (a fresh tensor of ours) and each state straight into its slot: no stacking
    states = pseudo_values.new_empty(chunks_ + 1, heads, d, e)  # the state before each chunk, and the final one
    states[0] = rearrange(x.state(), "b h d e -> (b h) d e")
    for index in range(chunks_):
        state = states[index]
        written = pseudo_values[index].baddbmm_(weights[index], state, alpha=-1)  # (bh, i, e)
        kept = state if before_update is None else state * before_update[index]
        torch.baddbmm(kept, keys_to_end[index], written, out=states[index + 1])
        if after_update is not None:
            states[index + 1].mul_(after_update[index])
    return (states[:-1], pseudo_values), states[-1].clone()  # the final state on its own: a decode state holds no more
