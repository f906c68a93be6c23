"""Matmul FLOPs of one call, counted by running it: the measured side of each variant's `Cost.matmul_flops`.

torch's FlopCounterMode counts matmul-like operators only (mm, bmm, the fused attention kernels), two FLOPs
per multiply-add; softmax and elementwise work are not counted. It has no formula for PyTorch's fused CPU
attention kernel (what SDPA and our blocks' `partial_attention` run on the CPU), nor for the in-place `baddbmm_`, so
formulas are registered here.
A causal fused call counts the pairs key j <= query i, as `dense_attention_cost` does (its kernel skips the
masked ones, tiles on the diagonal aside); torch counts the full square.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

try:
    from torch.utils.flop_counter import sdpa_flop_count
except ImportError:  # a torch without it: the same count, q k^T then weights v

    def sdpa_flop_count(query_shape: Any, key_shape: Any, value_shape: Any) -> int:
        b, h, n_q, d = query_shape
        return 2 * b * h * n_q * key_shape[-2] * (d + value_shape[-1])


def causal_pairs(n_q: int, n_k: int) -> int:
    """(i, j) pairs with j <= i: what a causal kernel computes (SDPA's top-left-aligned causal mask)."""
    full_rows = min(n_q, n_k)
    return full_rows * (full_rows + 1) // 2 + (n_q - full_rows) * n_k


def _fused_attention_formula(op: torch._ops.OpOverloadPacket) -> Callable[..., int]:
    """A FlopCounterMode formula for a fused SDPA operator: torch's count, scaled to the causal triangle."""
    names = [argument.name for argument in op.default._schema.arguments]
    causal_at = names.index("is_causal") - 3  # among the arguments after query, key and value

    def formula(
        query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
    ) -> int:
        causal = kwargs.get("is_causal", args[causal_at] if len(args) > causal_at else False)
        dense = sdpa_flop_count(query_shape, key_shape, value_shape)
        n_q, n_k = query_shape[-2], key_shape[-2]
        return dense * causal_pairs(n_q, n_k) // (n_q * n_k) if causal else dense

    return formula


def _fused_attention_formulas() -> dict[Any, Callable[..., int]]:
    names = (
        "_scaled_dot_product_flash_attention_for_cpu",  # not counted by torch at all
        "_scaled_dot_product_flash_attention",  # counted by torch as if never causal
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    ops = (getattr(torch.ops.aten, name, None) for name in names)
    return {op: _fused_attention_formula(op) for op in ops if op is not None}


def _in_place_baddbmm_flops(self_shape: Any, batch1_shape: Any, batch2_shape: Any, *args: Any, **kwargs: Any) -> int:
    """`x.baddbmm_(a, b)` (torch counts only the out-of-place baddbmm): two FLOPs per multiply-add of a @ b."""
    batch, rows, inner = batch1_shape
    return 2 * batch * rows * inner * batch2_shape[-1]


def _formulas() -> dict[Any, Callable[..., int]]:
    return {**_fused_attention_formulas(), torch.ops.aten.baddbmm_: _in_place_baddbmm_flops}


def count_matmul_flops(fn: Callable[[], Any]) -> int:
    """Matmul FLOPs of one call of `fn` (run it under torch.no_grad() to count a forward alone)."""
    counter = FlopCounterMode(display=False, custom_mapping=_formulas())
    with counter:
        fn()
    return counter.get_total_flops()
