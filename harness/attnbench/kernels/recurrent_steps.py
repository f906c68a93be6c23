"""Calls of the C recurrent steps (recurrent.c) on tensors: one call per decode step of an RNN state, the state
updated in place, the output allocated here. Callers check `usable` first (float32 on the CPU, last axes contiguous);
q, k, v are read where they lie (any batch and head strides: a token sliced out of a sequence is not copied).

A step's cost at B=1, H=8, D=64 is mostly the Python-to-C call itself (ctypes converting ~25 arguments, OpenMP
starting its team): tests/benchmarks/recurrent_step_speed.py measures that floor beside each step.

b - batch, h - heads, d - head dim, e - value dim, m - feature, r - gate rank
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from attnbench.kernels.build import F32, I64, INT, PTR, kernel

_ROWS = (I64,) * 9  # q, k, v strides (batch, head), the state's (batch, head, row)
ARGUMENTS = {  # each kernel's argument types (recurrent.c)
    "linear_step": (*[PTR] * 5, *[I64] * 4, *_ROWS, INT),
    "performer_step": (*[PTR] * 7, *[I64] * 5, *_ROWS, *[I64] * 2, INT),
    "gated_linear_step": (*[PTR] * 8, *[I64] * 5, *_ROWS, *[I64] * 3, F32, F32, INT),
    "delta_step": (*[PTR] * 8, *[I64] * 4, *_ROWS, *[I64] * 5, F32, F32, INT),
}


def step_kernel(name: str) -> Callable[..., None]:
    """The kernel `name` with its argument types (`kernel`: looked up by name, each call counted)."""
    return kernel(name, *ARGUMENTS[name])


def _token_shapes(q: Tensor, k: Tensor, v: Tensor, state: Tensor, rows: int | None, ones: int) -> tuple[int, ...]:
    """(b, h, d, e) of one token q, k (b, h, 1, d), v (b, h, 1, e), checked against each other and against the state
    (b, h, rows (d by default), e + ones): the kernel writes the state row by row. Sizes compared as ints (a Size
    slice costs more than the kernel's arithmetic)."""
    try:
        (b, h, n, d), (kb, kh, kn, kd), (vb, vh, vn, e), (sb, sh, sr, sc) = q.shape, k.shape, v.shape, state.shape
    except ValueError:
        n = 0  # not four axes each: reported below
    if n != 1 or (kb, kh, kn, kd, vb, vh, vn, sb, sh, sr, sc) != (b, h, 1, d, b, h, 1, b, h, rows or d, e + ones):
        raise ValueError(f"one token per row of the state: q, k (b, h, 1, d), v (b, h, 1, e), state (b, h, "
                         f"{rows or 'd'}, e{' + 1' if ones else ''}); got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, state {tuple(state.shape)}")  # fmt: skip
    return b, h, d, e


def _row_strides(q: Tensor, k: Tensor, v: Tensor, state: Tensor) -> tuple[int, ...]:
    """The (batch, head) strides of q, k, v, then the state's (batch, head, row)."""
    return (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *state.stride()[:3])


def _broadcast_strides(x: Tensor, rows: tuple[int, ...]) -> tuple[int, ...]:
    """x's strides over `rows` (sizes), 0 where x has 1 there (it broadcasts); x float32 on the CPU."""
    shape, strides = x.shape, x.stride()
    if len(shape) != len(rows) or any(size != 1 and size != wanted for size, wanted in zip(shape, rows)):
        raise ValueError(f"expected a tensor broadcastable to {rows}; got {tuple(shape)}")
    _check_float32(x, contiguous=False)
    return tuple(0 if size == 1 else stride for size, stride in zip(shape, strides))


def _check_float32(*tensors: Tensor, contiguous: bool = True) -> None:
    """The gates and projections a kernel reads beside q, k, v, which `usable` did not see: float32 on the CPU, and
    contiguous unless read through strides."""
    for x in tensors:
        if x.dtype is not torch.float32 or not x.is_cpu or (contiguous and not x.is_contiguous()):
            raise ValueError(f"expected a float32 CPU tensor{' (contiguous)' if contiguous else ''}; got "
                             f"{x.dtype} on {x.device}, strides {x.stride()}")  # fmt: skip


def linear_step(q: Tensor, k: Tensor, v: Tensor, state: Tensor) -> Tensor:
    """`linear`'s step (phi = elu + 1): q, k (b, h, 1, d), v (b, h, 1, e), the state sum phi(k) [v 1] (b, h, d, e + 1)
    updated in place -> the output (b, h, 1, e)."""
    b, h, d, e = _token_shapes(q, k, v, state, None, 1)
    out = q.new_empty(b, h, 1, e)
    step_kernel("linear_step")(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), out.data_ptr(), b, h, d, e,
        *_row_strides(q, k, v, state), torch.get_num_threads(),
    )  # fmt: skip
    return out


def performer_step(q: Tensor, k: Tensor, v: Tensor, state: Tensor, scale: Tensor, projection: Tensor) -> Tensor:
    """`performer`'s step (positive features through `projection` (m, d), contiguous, d^-1/4 folded in): the state
    (b, h, m, e + 1) relative to exp(scale), scale (b, h, 1, 1) the running max of key log features; both updated in
    place -> the output (b, h, 1, e)."""
    m, d = projection.shape
    b, h, _, e = _token_shapes(q, k, v, state, m, 1)
    if scale.shape != (b, h, 1, 1) or q.shape[-1] != d:
        raise ValueError(f"scale (b, h, 1, 1) and projection (m, d) for q {tuple(q.shape)}; got {tuple(scale.shape)}, "
                         f"{tuple(projection.shape)}")  # fmt: skip
    _check_float32(projection)
    out = q.new_empty(b, h, 1, e)
    step_kernel("performer_step")(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), scale.data_ptr(), projection.data_ptr(),
        out.data_ptr(), b, h, d, m, e, *_row_strides(q, k, v, state), *scale.stride()[:2],
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def gated_linear_step(q: Tensor, k: Tensor, v: Tensor, state: Tensor, *, scale: float, gk: Tensor | None = None,
                      low_rank: tuple[Tensor, Tensor] | None = None, normalizer: float = 1.0) -> Tensor:  # fmt: skip
    """Gated linear attention's step: S = diag(exp gk) S + k v^T, out = scale S^T q; the state (b, h, d, e) updated in
    place -> (b, h, 1, e). Log decays either given, gk (b|1, h|1, 1, d|1), or computed from k by GLA's low-rank gate
    log sigmoid((k down) up) / normalizer, `low_rank` = (down (d, r), up (r, d)). Either way clamped at
    MIN_LOG_DECAY."""
    b, h, d, e = _token_shapes(q, k, v, state, None, 0)
    down, up = low_rank if low_rank is not None else (None, None)
    gate = (0, 0, 0, 0) if gk is None else _broadcast_strides(gk, (b, h, 1, d))
    rank = 0 if down is None else down.shape[1]
    if down is not None and (down.shape != (d, rank) or up.shape != (rank, d)):
        raise ValueError(f"low_rank must be (d, r), (r, d) for d = {d}; got {tuple(down.shape)}, {tuple(up.shape)}")
    if down is not None:
        _check_float32(down, up)
    out = q.new_empty(b, h, 1, e)
    step_kernel("gated_linear_step")(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(), None if gk is None else gk.data_ptr(),
        None if down is None else down.data_ptr(), None if up is None else up.data_ptr(),
        out.data_ptr(), b, h, d, e, rank, *_row_strides(q, k, v, state), gate[0], gate[1],
        gate[3], normalizer, scale, torch.get_num_threads(),
    )  # fmt: skip
    return out


def delta_step(q: Tensor, k: Tensor, v: Tensor, state: Tensor, *, scale: float, beta: Tensor | None = None,
               g: Tensor | None = None, weights: Tensor | None = None, decayed: bool = False,
               normalizer: float = 1.0) -> Tensor:  # fmt: skip
    """The (gated) delta rule's step on L2-normalised q and k: S' = exp(g) S, u = beta (v - S'^T k), S = S' + k u^T,
    out = scale S^T q; the state (b, h, d, e) updated in place -> (b, h, 1, e). beta and g (log decay) either given,
    (b|1, h|1, 1) each, g None for no decay, or computed from the raw k through `weights` (d, 2):
    beta = sigmoid(k . w_0) and, when `decayed`, g = log sigmoid(k . w_1) / normalizer."""
    b, h, d, e = _token_shapes(q, k, v, state, None, 0)
    if weights is None and beta is None:
        raise ValueError("give beta (and g), or the weights they are computed from")
    if weights is not None and weights.shape != (d, 2):
        raise ValueError(f"weights must be (d, 2) = {(d, 2)}; got {tuple(weights.shape)}")
    if weights is not None:
        _check_float32(weights)
    given = (0, 0) if weights is not None else _broadcast_strides(beta, (b, h, 1))[:2]
    decay = (0, 0) if weights is not None or g is None else _broadcast_strides(g, (b, h, 1))[:2]
    out = q.new_empty(b, h, 1, e)
    step_kernel("delta_step")(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), state.data_ptr(),
        None if weights is not None else beta.data_ptr(), None if weights is not None or g is None else g.data_ptr(),
        None if weights is None else weights.data_ptr(), out.data_ptr(), b, h, d, e,
        *_row_strides(q, k, v, state), *given, *decay, int(decayed), normalizer, scale,
        torch.get_num_threads(),
    )  # fmt: skip
    return out
