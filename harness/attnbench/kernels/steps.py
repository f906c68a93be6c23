"""Calls of the C decode kernels on tensors: shapes checked, strides passed, the output allocated here.

b - batch, h - query heads, g - key/value heads, r - choosers per key/value head, s - listed page, d - head dim,
e - value dim
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnbench.kernels.build import F32, I64, INT, PTR, kernel


def byte_mask(visible: Tensor | None) -> tuple[Tensor | None, tuple[int, int]]:
    """A visible mask (b|1, g|1, n) bool, leading axes possibly left out, as the kernels read it: uint8 where it lies
    (bool is one byte; copied only if its last axis is not contiguous), and its (b, g) strides, 0 on a broadcast axis.
    None: every position visible."""
    if visible is None:
        return None, (0, 0)
    visible = visible[(None,) * (3 - visible.dim())]  # (n,) or (g, n) as (1, 1, n) or (1, g, n)
    mask = (visible if visible.stride(-1) == 1 else visible.contiguous()).view(torch.uint8)
    return mask, (mask.stride(0) if mask.shape[0] > 1 else 0, mask.stride(1) if mask.shape[1] > 1 else 0)


def quest_step(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, bounds: Tensor, budget: Tensor, *,
               t: int, page: int, choosers: int, ranked: range, slots: int, keep_first: bool, whole_from: int,
               scale: float) -> Tensor:
    """Quest's step at position t in one call (decode.c's `quest_step`): k (b, g, 1, d), v (b, g, 1, e) written into
    slot t of keys (b, g, n, d) and values (b, g, n, e), the key folded into its page's bounds (b, g, pages, 2 d), then
    each query head of q (b, h, 1, d) attends to its `slots` best ranked pages (row b its first budget[b] of them,
    budget (b,) int64), the first page when kept, and the pages from `whole_from` to t -> (b, h, 1, e)."""
    b, h, _, d = q.shape
    g, e = keys.shape[1], values.shape[-1]
    q, k, v, budget = q.contiguous(), k.contiguous(), v.contiguous(), budget.contiguous()
    out = q.new_empty(b, h, 1, e)
    kernel("quest_step", *[PTR] * 8, *[I64] * 22, F32, INT)(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), keys.data_ptr(), values.data_ptr(), bounds.data_ptr(),
        budget.data_ptr(), out.data_ptr(), b, h, g, choosers, t, page, ranked.start, ranked.stop, slots,
        int(keep_first), whole_from, d, e, keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
        values.stride(1), values.stride(2), bounds.stride(0), bounds.stride(1), bounds.stride(2), scale,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def softmax_step(q: Tensor, k: Tensor, v: Tensor, visible: Tensor | None, scale: float,
                 new: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
    """`attnbench.ops.softmax_step` in one call (decode.c's `softmax_step`): q (b, h, 1, d), k (b, g, n, d), v (b, g,
    n, e) with a contiguous last axis, visible (b|1, g|1, n) bool (leading axes may be left out) or None -> (b, h, 1,
    e). Each key/value head's
    positions are read once for its query heads, cut into ranges so that every thread has work. `new` = (k (b, g, 1,
    d), v (b, g, 1, e), slot): the new token written into position `slot` of k and v first, in the same call."""
    b, h, _, d = q.shape
    g, n, e = k.shape[1], k.shape[-2], v.shape[-1]
    threads = torch.get_num_threads()
    parts = max(1, min(-(-2 * threads // (b * g)), n // 256))  # ranges per head: ~2 per thread, >= 256 positions
    q = q.contiguous()
    out = q.new_empty(b, h, 1, e)
    partial = q.new_empty(b * g * parts * (h // g) * (e + 2))
    mask, strides = byte_mask(visible)
    k_new, v_new, slot = (None, None, -1) if new is None else (new[0].contiguous(), new[1].contiguous(), new[2])
    kernel("softmax_step", *[PTR] * 3, *[PTR] * 2, I64, *[PTR] * 3, *[I64] * 15, F32, INT)(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), None if k_new is None else k_new.data_ptr(),
        None if v_new is None else v_new.data_ptr(), slot, None if mask is None else mask.data_ptr(), out.data_ptr(),
        partial.data_ptr(), b, h, g, n, d, e, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), *strides, parts, scale, threads,
    )  # fmt: skip
    return out


def h2o_step(q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, mass: Tensor, visible: Tensor | None, *,
             slot: int, source: int, heavy: int, scale: float) -> Tensor:
    """H2O's step in one call (decode.c's `h2o_step`): k (b, g, 1, d), v (b, g, 1, e) written into ring slot `slot`
    of keys (b, g, S, d), values (b, g, S, e) (mass (b, g, S) float32 contiguous, the slot's set to 0); each query
    head of q (b, h, 1, d) attends to the visible slots (visible (b, g, S) bool, None: all), their masses grow by the
    group's mean weight, and ring slot `source` (-1: none) competes for the weakest of the `heavy` slots
    -> (b, h, 1, e)."""
    b, h, _, d = q.shape
    g, slots, e = keys.shape[1], keys.shape[2], values.shape[-1]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    shown = None if visible is None else visible.expand(b, g, slots).contiguous().view(torch.uint8)
    out = q.new_empty(b, h, 1, e)
    kernel("h2o_step", *[PTR] * 8, *[I64] * 15, F32, INT)(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), keys.data_ptr(), values.data_ptr(), mass.data_ptr(),
        None if shown is None else shown.data_ptr(), out.data_ptr(), b, h, g, slots, slot, source, heavy, d, e,
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2), scale,
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def kivi_step(q: Tensor, quantized: list[Tensor], keys: Tensor, values: Tensor, *, bits: int, group: int,
              scale: float) -> Tensor:
    """KIVI's one-token read in one call (decode.c's `kivi_step`), on the codes as they lie: q (b, h, 1, d);
    `quantized` = the filled key codes, scales, zero points and value codes, scales, zero points (QuantizedCache's
    layout); keys (b, g, m, d) and values (b, g, m', e): the full-precision residuals with the new token last ->
    (b, h, 1, e)."""
    b, h, _, d = q.shape
    kc, ks, kz, vc, vs, vz = quantized
    g, e = keys.shape[1], values.shape[-1]
    parts = [kc, ks, kz, keys, vc, vs, vz, values]
    strides = torch.tensor([x.stride(axis) for x in parts for axis in (0, 1, 2)], dtype=torch.int64)
    q = q.contiguous()
    out = q.new_empty(b, h, 1, e)
    scratch = q.new_empty(b * h * (kc.shape[2] + keys.shape[2]))
    kernel("kivi_step", *[PTR] * 11, *[I64] * 11, PTR, F32, INT)(
        q.data_ptr(), *(x.data_ptr() for x in (kc, ks, kz, keys, vc, vs, vz, values)), out.data_ptr(),
        scratch.data_ptr(), b, h, g, d, e, bits, group, kc.shape[2], keys.shape[2], vc.shape[2], values.shape[2],
        strides.data_ptr(), scale, torch.get_num_threads(),
    )  # fmt: skip
    return out


def ragged_step(q: Tensor, keys: Tensor, values: Tensor, offsets: Tensor, k_buffer: Tensor, v_buffer: Tensor,
                k: Tensor, v: Tensor, *, count: int, scale: float) -> Tensor:
    """A head-wise cache's one-token step in one call (decode.c's `ragged_step`): keys (P, d), values (P, e) packed
    head after head from offsets (b g + 1,) int64; k_buffer (b, g, n, d), v_buffer (b, g, n, e) the tokens after the
    prompt, the new k (b, g, 1, d), v (b, g, 1, e) written into position count - 1 first; q (b, h, 1, d) ->
    (b, h, 1, e)."""
    b, h, _, d = q.shape
    g, e = k_buffer.shape[1], v_buffer.shape[-1]
    q, k, v, offsets = q.contiguous(), k.contiguous(), v.contiguous(), offsets.contiguous()
    out = q.new_empty(b, h, 1, e)
    kernel("ragged_step", *[PTR] * 9, *[I64] * 12, F32, INT)(
        q.data_ptr(), keys.data_ptr(), values.data_ptr(), offsets.data_ptr(), k_buffer.data_ptr(), v_buffer.data_ptr(),
        k.data_ptr(), v.data_ptr(), out.data_ptr(), b, h, g, count, d, e, k_buffer.stride(0), k_buffer.stride(1),
        k_buffer.stride(2), v_buffer.stride(0), v_buffer.stride(1), v_buffer.stride(2), scale, torch.get_num_threads(),
    )  # fmt: skip
    return out


def two_keys_step(q_part: Tensor, q: Tensor, k_part: Tensor, k: Tensor, v: Tensor, *, scale: float) -> Tensor:
    """One token against two runs of keys under one softmax (decode.c's `two_keys_step`): k_part (b, g, n1, c) read
    with q_part (b, g, r, c) (the query on those c channels), then k (b, g, n2, d) read with q (b, h, 1, d); v (b, g,
    n1 + n2, e) the values of both runs in order -> (b, h, 1, e)."""
    b, h, _, d = q.shape
    g, c, e = k.shape[1], k_part.shape[-1], v.shape[-1]
    q_part, q = q_part.contiguous(), q.contiguous()
    out = q.new_empty(b, h, 1, e)
    kernel("two_keys_step", *[PTR] * 6, *[I64] * 17, F32, INT)(
        q_part.data_ptr(), q.data_ptr(), k_part.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), b, h, g, c, d,
        e, k_part.shape[-2], k.shape[-2], k_part.stride(0), k_part.stride(1), k_part.stride(2), k.stride(0),
        k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), scale, torch.get_num_threads(),
    )  # fmt: skip
    return out


def parts_step(q: Tensor, parts: list[tuple[Tensor, Tensor, Tensor | None]], scale: float) -> Tensor:
    """`softmax_over_parts` in one call (decode.c's `parts_step`): q (b, h, 1, d), each part (k (b, g, n, d), v (b, g,
    n, e), visible (b|1, g|1, n) bool or None), every part read where it lies (a slice with a step included) ->
    (b, h, 1, e)."""
    b, h, _, d = q.shape
    g, e = parts[0][0].shape[1], parts[0][1].shape[-1]
    q = q.contiguous()
    fields, masks = [], []
    for k, v, visible in parts:
        shown, strides = byte_mask(visible)
        masks.append(shown)  # alive through the call
        mask = 0 if shown is None else shown.data_ptr()
        fields += [k.data_ptr(), v.data_ptr(), k.shape[-2], *k.stride()[:3], *v.stride()[:3], mask, *strides]
    table = torch.tensor(fields, dtype=torch.int64)
    out = q.new_empty(b, h, 1, e)
    kernel("parts_step", PTR, PTR, I64, PTR, *[I64] * 5, F32, INT)(
        q.data_ptr(), table.data_ptr(), len(parts), out.data_ptr(), b, h, g, d, e, scale, torch.get_num_threads()
    )
    return out
