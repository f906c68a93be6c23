"""Linformer (Wang et al. 2020): keys and values projected along the sequence to k rows, then exact softmax.

E, F (k x N) mix the N keys (values) into k: O(N * k * D) time, no N x N matrix. Projections:
- `random`: Johnson-Lindenstrauss Gaussian with entries N(0, 1/N), so a projected key has a key's scale
  (seeded; built per sequence length and cached);
- `pool`: the mean over k contiguous segments (the paper's convolution option; deterministic);
- `identity`: no projection (k clipped to N): exact attention, for checks.
`share_kv` uses E for values too (F = E); `share_heads=False` draws one projection per head.
Causal attention is undefined (the projection mixes future tokens into every projected key). Padded keys
are removed from the projection (their columns zeroed, the rest rescaled), and a projected key that
holds no real key is masked.

b - batch, h - heads, n - position, r - projected row (k of them), d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    Hyperparameter,
    Shape,
    kept_on_instance,
    softmax_attention_flops,
)
from attnbench.variants.blocks import segment_means
from einops import einsum
from torch import Tensor

PROJECTIONS = ("random", "pool", "identity")


class LinformerAttention(AttentionVariant):
    """Low-rank attention: softmax against k projected keys."""

    name = "linformer"
    family = "low-rank"
    exact = False
    supports = Capabilities(
        causal=False,
        subquadratic_memory=True,
        notes={"causal": "Linformer's projection mixes future tokens into every projected key; causal is undefined"},
    )
    hyperparameters = {
        "k": Hyperparameter(256, "projected length (clipped to N for pool and identity)", minimum=1),
        "projection": Hyperparameter(
            "random", "random (JL Gaussian), pool (segment means), identity", kind=str, choices=PROJECTIONS
        ),
        "share_kv": Hyperparameter(False, "project values with the keys' matrix (F = E)", kind=bool),
        "share_heads": Hyperparameter(True, "one projection for all heads", kind=bool),
    }

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed=seed, **hyperparams)
        # the identity projection is an N x N matrix (exact attention, for checks): not sub-quadratic
        self.supports = replace(type(self).supports, subquadratic_memory=self.projection != "identity")

    @kept_on_instance
    def projections(self, n: int, heads: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(E, F), each (h | 1, k, n), kept per sequence length."""
        return tuple(t.to(device) for t in self._build(n, heads, dtype))

    def _build(self, n: int, heads: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """E and F in `dtype`, drawn in float64 one at a time (so at most one float64 copy lives at once)."""
        copies = 1 if self.share_heads else heads
        if self.projection == "identity":
            eye = torch.eye(n, dtype=torch.float64).expand(copies, n, n).to(dtype)
            return eye, eye
        if self.projection == "pool":
            pool = segment_means(min(self.k, n), n).expand(copies, -1, -1).to(dtype)
            return pool, pool
        generator = torch.Generator().manual_seed(self.seed)

        def draw() -> Tensor:  # (copies, k, n): scaled in place, then cast
            return torch.randn(copies, self.k, n, generator=generator, dtype=torch.float64).div_(n**0.5).to(dtype)

        e = draw()
        return e, (e if self.share_kv else draw())

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        heads = q.shape[1]
        e, f = (p.expand(heads, -1, -1) for p in self.projections(k.shape[-2], heads, q.device, q.dtype))  # (h, r, n)
        if key_padding_mask is None:
            keys = einsum(e, k, "h r n, b h n d -> b h r d")
            values = einsum(f, v, "h r n, b h n e -> b h r e")
            return F.scaled_dot_product_attention(q, keys, values)
        real = (~key_padding_mask)[:, None, None, :]  # (b, 1, 1, n)
        e, f = self._restrict(e, real), self._restrict(f, real)
        keys = einsum(e, k, "b h r n, b h n d -> b h r d")
        values = einsum(f, v, "b h r n, b h n e -> b h r e")
        holds_real = (e != 0).any(dim=-1)[:, :, None, :]  # (b, h, 1, r): projected keys made of real keys
        sees_any = holds_real.any(dim=-1, keepdim=True)  # (b, h, 1, 1): False only if every key is padding
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=holds_real | ~sees_any)
        return out.masked_fill(~sees_any, 0.0)

    def _restrict(self, projection: Tensor, real: Tensor) -> Tensor:
        """(h, r, n) -> (b, h, r, n) over the real keys only, each row keeping its scale."""
        kept = projection[None] * real
        if self.projection == "random":  # entries N(0, 1/n) over the real keys become N(0, 1/n_real)
            n_real = (
                real.sum(dim=-1, keepdim=True).clamp(min=1).to(projection.dtype)
            )  # not float32: float64 stays exact
            return kept * (projection.shape[-1] / n_real) ** 0.5
        # pool and identity: a row averages its real keys
        return kept * (projection.sum(-1, keepdim=True) / kept.sum(-1, keepdim=True).clamp(min=1e-12))

    def cost(self, shape: Shape) -> Cost:
        s = shape
        rows = {"random": self.k, "pool": min(self.k, s.n_k), "identity": s.n_k}[self.projection]
        bh = s.batch * s.heads
        projection = 2 * bh * rows * s.n_k * (s.head_dim + s.value_dim)  # E K and F V
        attention, softmax = softmax_attention_flops(bh * s.n_q * rows, s)
        io = bh * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) * s.dtype_bytes
        copies = 1 if self.share_heads else s.heads  # of E and F, each (rows, n_k)
        working = bh * rows * (s.head_dim + s.value_dim) * s.dtype_bytes + 2 * copies * rows * s.n_k * s.dtype_bytes
        if self.projection == "random":  # the first call draws E and F in float64, one at a time
            working += copies * rows * s.n_k * 8
        return Cost(
            flops=projection + attention + softmax,
            bytes_moved=io,
            working_bytes=working,
            matmul_flops=projection + attention,
        )
