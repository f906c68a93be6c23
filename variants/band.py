"""Band (sliding-window) attention: exact softmax over the keys within `window` positions of each query, and, with
`sinks` and `global_tokens`, over the first positions too (StreamingLLM's attention sinks, Longformer's global
attention: see `attnbench.variants.global_tokens`).

Convention: `window` w is one-sided. Bidirectional: query i sees keys j with |i - j| <= w (2w + 1 keys,
Longformer's "window 2w+1"). Causal: 0 <= i - j <= w (w + 1 keys; xformers' causal window W is our w).
FlexAttention examples that speak of a window of W mean W + 1 keys, i.e. our w = W.

The computation is `attnbench.variants.window` (block-wise, never N x N).
"""

from __future__ import annotations

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
    expand_kv_heads,
    query_group,
    softmax_attention_flops,
)
from attnbench.variants.blocks import (
    all_pairs,
)
from attnbench.variants.decoding import WindowState
from attnbench.variants.flex import BACKEND, FLEX_BACKEND, FlexBackend, flex_attention_call
from attnbench.variants.global_tokens import band_with_global_tokens, columns_and_rows, global_band_mask
from attnbench.variants.window import band_attention, band_layout
from torch import Tensor


class BandAttention(FlexBackend, AttentionVariant):
    """Sliding-window attention, computed block-wise at O(N * w) cost; with sinks or global tokens,
    O(N * (w + c) + g * N) for c = max(sinks, global_tokens) column keys and g global rows."""

    name = "band"
    family = "band"
    exact = True
    supports = Capabilities(
        cross_attention=False,
        subquadratic_memory=True,
        grouped_kv=True,
        notes={"cross_attention": "a window is defined on the positions of one sequence; use Nq == Nk"},
    )
    hyperparameters = {
        "window": Hyperparameter(256, "one-sided window w: |i - j| <= w (causal: 0 <= i - j <= w)", minimum=0),
        "block_size": Hyperparameter(
            None, "queries per block (default: min(32, max(16, w)))", minimum=1, optional=True
        ),
        "sinks": Hyperparameter(
            0, "attention sinks: the first s positions' keys are visible to every query (StreamingLLM)", minimum=0
        ),
        "global_tokens": Hyperparameter(
            0, "global tokens: the first g positions see every key and every query sees them (Longformer)", minimum=0
        ),
        "backend": BACKEND,
        "kv_cache": Hyperparameter(
            True, "decode against the kept keys and values; false: recompute the window's attention from its tokens "
            "every step (StreamingLLM's 'sliding window with re-computation'; decode only)", kind=bool,
        ),
    }  # fmt: skip

    def unsupported_reason(self, **options: Any) -> str | None:
        if not self.kv_cache and not options.get("decode"):
            return "band(kv_cache=false) differs from band only in decode (--mode decode)"
        return super().unsupported_reason(**options)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        window, sinks, global_tokens = self.window, self.sinks, self.global_tokens
        if self.backend == FLEX_BACKEND:

            def band_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
                return global_band_mask(q_idx, kv_idx, window, causal, sinks, global_tokens)

            return flex_attention_call(q, k, v, band_mod, key=("band", window, causal, sinks, global_tokens))
        options = {"window": window, "causal": causal, "key_padding_mask": key_padding_mask}
        if sinks or global_tokens:
            return band_with_global_tokens(
                q, k, v, **options, block_size=self.block_size, sinks=sinks, global_tokens=global_tokens
            )
        return band_attention(q, k, v, **options, block_size=self.block_size)

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The causal forward, then StreamingLLM's cache: the first max(sinks, global_tokens) positions and a ring
        of the last `window` (a token sees them and itself: the causal band's w + 1 keys). Its size does not grow
        with N (`room` is not needed). Positions are the prompt's: q and k arrive post-rotary, so the cache keeps
        them as they were encoded (StreamingLLM re-assigns positions inside its cache; that needs the rotary step,
        which here lies outside attention)."""
        columns, _ = columns_and_rows(self.sinks, self.global_tokens, 2**62)
        group = query_group(q, k)
        out = self.forward(q, expand_kv_heads(k, group), expand_kv_heads(v, group), causal=True, key_padding_mask=None)
        if not self.kv_cache:  # recomputing needs the window's queries too: one cache per query head
            k, v = torch.cat([q, expand_kv_heads(k, group)], dim=-1), expand_kv_heads(v, group)
        return out, WindowState.of(k, v, window=self.window, columns=columns)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        if not self.kv_cache:
            return self.prefill(q, k, v, room=room)[1]
        columns, _ = columns_and_rows(self.sinks, self.global_tokens, 2**62)
        return WindowState.of(k, v, window=self.window, columns=columns)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, WindowState):
            raise UnsupportedOptionError(f"band cannot step from a {type(state).__name__}")
        if self.kv_cache:
            return state.step(q, k, v), state
        # re-computation: the causal attention of every kept token, the new one last, recomputed; its last row is out
        group = q.shape[1] // k.shape[1]
        state.push(torch.cat([q, expand_kv_heads(k, group)], dim=-1), expand_kv_heads(v, group))
        tokens, values = state.ordered()  # (b, h, kept, 2d), (b, h, kept, e)
        queries, keys = tokens.split(q.shape[-1], dim=-1)
        return F.scaled_dot_product_attention(queries, keys, values, is_causal=True)[..., -1:, :], state

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor:
        i, j = all_pairs(n_q, n_k)  # (i, 1), (1, j)
        return global_band_mask(i, j, self.window, causal, self.sinks, self.global_tokens)

    def cost(self, shape: Shape) -> Cost:
        layout = band_layout(shape.n_k, self.window, shape.causal, self.block_size)
        columns, rows = columns_and_rows(self.sinks, self.global_tokens, shape.n_k)
        heads = shape.batch * shape.heads
        band_scores = heads * layout.scores(shape.n_q)  # scores computed, masked ones included
        # with sinks or global tokens: every query against the c column keys, and the g global rows against all
        extra_scores = heads * (shape.n_q * columns + rows * shape.n_k) if columns else 0
        computed = band_scores + extra_scores
        matmul, other = softmax_attention_flops(computed, shape)
        # the window's pairs: the blocks' padding past it is the implementation's (with sinks or global tokens the
        # parts overlap and their union is not counted here: all the work done is taken as needed)
        needed = None if columns else sum(softmax_attention_flops(heads * layout.pairs(shape.n_q, shape.causal), shape))
        io = (
            shape.batch
            * shape.heads
            * (shape.n_q * shape.head_dim + shape.n_k * (shape.head_dim + 2 * shape.value_dim))
        )
        # a chunk of query blocks at a time (`attnbench.variants.window`): its output and log-sum-exp, and under key
        # padding its own (b h) pattern and bias; with columns, its (rows, c) scores and weights; the global rows'
        # scores. The patterns of unpadded calls are kept between calls (state, not per-call memory).
        chunk = heads * min(layout.chunk_blocks(heads), -(-shape.n_q // layout.block)) * layout.block  # query rows
        working = (
            chunk * ((shape.value_dim + 1 + 3 * columns) * shape.dtype_bytes + layout.span * (1 + shape.dtype_bytes))
            + 2 * heads * rows * shape.n_k * shape.dtype_bytes
        )
        # under autograd every chunk's output and log-sum-exp are kept, then concatenated
        kept = 2 * heads * shape.n_q * (shape.value_dim + 1) * shape.dtype_bytes
        return Cost(
            flops=matmul + other,
            useful_flops=needed,
            bytes_moved=io * shape.dtype_bytes,
            working_bytes=working,
            matmul_flops=matmul,
            # autograd keeps each block's weights and its gathered key and value windows for the backward
            backward_working_bytes=working
            + kept
            + band_scores * shape.dtype_bytes * (1 + (shape.head_dim + shape.value_dim) / layout.block)
            + extra_scores * shape.dtype_bytes * 2,
        )
