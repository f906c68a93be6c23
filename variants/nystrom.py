"""Nyströmformer (Xiong et al., 2021, "Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention").

Softmax attention S = softmax(Q Kᵀ / √d) is approximated from m landmarks (§3.2–3.3, eq. 11):

    Q̃, K̃ = segment means of Q and K over m contiguous segments         (m, d)
    F̃ = softmax(Q K̃ᵀ / √d)      (n, m)
    Ã = softmax(Q̃ K̃ᵀ / √d)      (m, m)
    B̃ = softmax(Q̃ Kᵀ / √d)      (m, n)
    Ŝ V = F̃ · Ã⁺ · (B̃ · V)

Ã⁺, the Moore–Penrose pseudo-inverse, by the paper's iteration (eq. 9, after Razavi et al. 2014):
Z₀ = Ãᵀ / (‖Ã‖₁ ‖Ã‖∞), Z ← ¼ Z (13 I − Ã Z (15 I − Ã Z (7 I − Ã Z))), `pinv_iterations` times (the paper's 6);
`pinv_iterations=0` takes the exact pseudo-inverse instead (`torch.linalg.pinv`; its SVD is not counted in `cost`),
for checks — with few landmarks Ã is ill-conditioned and the paper's 6 iterations, which regularize it, are the
more accurate (at N=1024, m=64: error 0.75 against 1.74 exact), so it is not a sweep setting: with m = N landmarks
(each its own segment) and the exact inverse, F̃ Ã⁺ B̃ = S S⁺ S = S, so the output is softmax attention exactly.

`conv_kernel=k` adds the paper's skip connection, a depthwise convolution of V along the sequence (kernel 33 in
its experiments), its weights drawn from the seed as at initialization. It is part of the model the paper trains,
not of the approximation of softmax attention, so it raises the error measured here: off (0) by default.

Padding: padded keys leave the key landmarks' means and B̃'s keys (a landmark with no real key is masked), and each
key landmark averages only its segment's real keys (the official code zeroes padded tokens and divides by the whole
segment); query landmarks average every query. A batch element with no real key outputs zeros. Causal attention
is undefined (a landmark mixes future tokens). Never N x N: the largest tensors are (n, m).

b - batch, h - heads, n - query position, j - key position, l - landmark, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import AttentionVariant, Capabilities, Cost, Hyperparameter, Shape, kept_on_instance
from attnbench.ops import default_scale
from attnbench.variants.blocks import segment_means
from einops import einsum, rearrange
from torch import Tensor


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """The Moore–Penrose pseudo-inverse of each (m, m) matrix in `a`, by the paper's Newton–Schulz-type iteration
    (eq. 9); 0 iterations: the exact one."""
    if iterations == 0:
        return torch.linalg.pinv(a.double()).to(a.dtype)
    eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)  # (l, l): A Z is square even where A is not
    norms = a.abs().sum(dim=-2).amax(dim=-1) * a.abs().sum(dim=-1).amax(dim=-1)  # ‖A‖₁ ‖A‖∞ per matrix
    z = a.transpose(-1, -2) / norms.clamp(min=torch.finfo(a.dtype).tiny)[..., None, None]  # A = 0 (no key): Z = 0
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def masked_softmax(scores: Tensor, allowed: Tensor | None) -> Tensor:
    """softmax over the last axis where `allowed`; a row with nothing allowed is zeros."""
    if allowed is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)


class NystromAttention(AttentionVariant):
    """Softmax attention approximated through m landmarks and the pseudo-inverse of their attention."""

    name = "nystromformer"
    family = "low-rank"
    exact = False
    supports = Capabilities(
        causal=False,
        subquadratic_memory=True,
        notes={"causal": "a landmark is the mean of a segment, so it mixes future tokens; causal is undefined"},
    )
    hyperparameters = {
        "landmarks": Hyperparameter(64, "m: landmarks, segment means of Q and K (clipped to N)", minimum=1),
        "pinv_iterations": Hyperparameter(
            6, "iterations of the pseudo-inverse (the paper's 6); 0: the exact pseudo-inverse", minimum=0
        ),
        "conv_kernel": Hyperparameter(
            0, "depthwise convolution of V added as a skip (the paper's 33; part of the model): 0 is off", minimum=0
        ),
    }

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed=seed, **hyperparams)
        if self.conv_kernel:  # the skip adds a convolution of V to the output: one position per query
            notes = {**self.supports.notes, "cross_attention": "the conv_kernel skip adds V to the output: Nq == Nk"}
            self.supports = replace(self.supports, cross_attention=False, notes=notes)

    @kept_on_instance
    def conv_weights(self, heads: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(h, 1, k): one kernel per head, as nn.Conv2d initializes it (uniform in ±1/√k), from the seed."""
        generator = torch.Generator().manual_seed(self.seed)
        bound = self.conv_kernel**-0.5
        weights = (torch.rand(heads, 1, self.conv_kernel, generator=generator) * 2 - 1) * bound
        return weights.to(device=device, dtype=dtype)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n_q, d = q.shape
        n_k = k.shape[-2]
        m_q, m_k = min(self.landmarks, n_q), min(self.landmarks, n_k)
        real = None if key_padding_mask is None else ~key_padding_mask  # (b, j)
        scale = default_scale(d)
        query_means = segment_means(m_q, n_q, device=q.device).to(q.dtype).expand(b, -1, -1)  # (b, l, n)
        key_means = segment_means(m_k, n_k, real, q.device).to(q.dtype).expand(b, -1, -1)  # (b, l, j)
        q_landmarks = einsum(query_means, q, "b l n, b h n d -> b h l d")
        k_landmarks = einsum(key_means, k, "b l j, b h j d -> b h l d")
        landmark_has_key = None if real is None else (key_means.sum(dim=-1) > 0)[:, None, None, :]  # (b, 1, 1, l)
        key_allowed = None if real is None else real[:, None, None, :]  # (b, 1, 1, j)
        f = masked_softmax(einsum(q, k_landmarks, "b h n d, b h l d -> b h n l") * scale, landmark_has_key)
        a = masked_softmax(einsum(q_landmarks, k_landmarks, "b h l d, b h k d -> b h l k") * scale, landmark_has_key)
        bv = einsum(
            masked_softmax(einsum(q_landmarks, k, "b h l d, b h j d -> b h l j") * scale, key_allowed),
            v,
            "b h l j, b h j e -> b h l e",
        )
        out = einsum(f, iterative_pinv(a, self.pinv_iterations) @ bv, "b h n l, b h l e -> b h n e")
        if self.conv_kernel:
            out = out + self.conv_skip(v, key_padding_mask)
        if real is not None:
            out = out.masked_fill(~real.any(dim=-1)[:, None, None, None], 0.0)  # no real key: zeros
        return out

    def conv_skip(self, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """The depthwise convolution of V along the sequence, one kernel per head shared over e (padded V zeroed)."""
        b, h, n, e = v.shape
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask[:, None, :, None], 0.0)
        weights = self.conv_weights(h, v.device, v.dtype)  # (h, 1, k)
        columns = rearrange(v, "b h n e -> (b e) h n")
        mixed = F.conv1d(columns, weights, padding=self.conv_kernel // 2, groups=h)[..., :n]
        return rearrange(mixed, "(b e) h n -> b h n e", b=b)

    def cost(self, shape: Shape) -> Cost:
        s = shape
        heads = s.batch * s.heads
        m_q, m_k = min(self.landmarks, s.n_q), min(self.landmarks, s.n_k)
        d, e = s.head_dim, s.value_dim
        multiply_adds = (
            (m_q * s.n_q + m_k * s.n_k) * d  # the landmarks: segment means, (l, n) @ (n, d)
            + (s.n_q * m_k + m_q * m_k + m_q * s.n_k) * d  # the scores of F̃, Ã and B̃
            + (m_q * s.n_k + m_k * m_q + s.n_q * m_k) * e  # B̃ V, Ã⁺ (B̃ V), F̃ (Ã⁺ B̃ V)
            + self.pinv_iterations * (2 * m_q * m_q * m_k + 2 * m_q**3)  # A Z, two (l, l) products, Z (...)
        )
        conv = 2 * heads * s.n_k * e * self.conv_kernel  # FlopCounterMode counts a convolution as matmul work
        matmul = 2 * heads * multiply_adds + conv
        softmax = 5 * heads * (s.n_q * m_k + m_q * m_k + m_q * s.n_k)
        io = heads * (s.n_q * d + s.n_k * (d + e) + s.n_q * e)
        # F̃ and B̃ with their scores, the landmark matrices, and the segment weights
        working = heads * (2 * s.n_q * m_k + 2 * m_q * s.n_k + 4 * m_q * m_k) + s.batch * (m_q * s.n_q + m_k * s.n_k)
        return Cost(
            flops=matmul + softmax,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=working * s.dtype_bytes,
            matmul_flops=matmul,
        )
