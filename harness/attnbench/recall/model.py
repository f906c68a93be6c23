"""A tiny language model for MQAR whose sequence mixer is an attnbench variant (Zoology's setting).

token embedding -> `layers` blocks -> norm -> LM head (tied to the embedding, as Zoology's); each block, pre-norm and
residual throughout: a short causal convolution, the sequence mixer, an MLP. No position embedding: the convolution
gives the local order recall needs, the mixer finds the key.

- The convolution is Zoology's BaseConv: depthwise, kernel 4, causal, times a linear gate of the same input, so the
  value's position can carry its key (measured: band and linear attention learn MQAR faster with the gate).
- The mixer projects to q, k, v per head, calls `variant(q, k, v, causal=True)`, normalises each head's output
  (RMSNorm, as fla's gated and delta-rule layers do, RetNet's GroupNorm) and projects back. The norm makes the mixers'
  output scales alike: the delta rule's output is beta / sqrt(d) of a value, softmax's a whole one, and without the
  norm deltanet and linear attention stayed near the convolution's local plateau for a thousand steps.
- One head by default: a head of dimension d_model is where a fixed-state mixer (linear attention's d x d state) has
  the most room, so recall depends on the mixer's kind rather than on how the width is split.

`BLIND` names a mixer that sees no other position (its output at i is v_i): the sanity check that recall needs the
mixer. It is not a registered variant, and no registered variant may take its name. The convolutions still see the
last 2 * (kernel - 1) positions, so a blind model recalls the queries that close to their key.

b - batch, h - heads, n - position, d - head dim, c - model width
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from attnbench.interface import AttentionVariant, VariantError
from attnbench.registry import Registry
from einops import rearrange
from torch import Tensor, nn

BLIND = "blind"
CONV_KERNEL = 4


class Attend(Protocol):
    """What the mixer calls: q, k, v (b, h, n, d) -> (b, h, n, d), causal."""

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor: ...


def _initialise(module: nn.Module, std: float) -> None:
    """Linear and embedding weights N(0, std^2), biases zero."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def blind(q: Tensor, k: Tensor, v: Tensor, *, causal: bool) -> Tensor:
    """A mixer that sees no other position: each position's own value."""
    return v


def make_attention(name: str, params: Mapping[str, Any], seed: int, seq_len: int, registry: Registry) -> Attend:
    """The mixer named `name`: `BLIND`, or a registered variant built with `params` and `seed`; a clear error when it
    cannot be trained as a causal mixer on CPU at this length."""
    if name == BLIND:
        if BLIND in registry.names():
            raise VariantError(f"a registered variant is named '{BLIND}', MQAR's name for its blind mixer: rename it")
        if params:
            raise VariantError(f"the blind mixer takes no parameters, got {dict(params)}")
        return blind
    variant = registry.create(name, seed=seed, **params)
    options = dict(device="cpu", dtype="float32", causal=True, padded=False, n_q=seq_len, n_k=seq_len, backward=True)
    if (reason := variant.unsupported_reason(**options)) is not None:
        raise VariantError(f"variant '{name}' cannot be an MQAR mixer (causal, trained on CPU): {reason}")
    return variant


class ShortConv(nn.Module):
    """A causal depthwise convolution over the positions (position i sees i - kernel + 1 .. i), gated by a linear
    map of position i (Zoology's BaseConv)."""

    def __init__(self, width: int, kernel: int = CONV_KERNEL) -> None:
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel, groups=width, padding=kernel - 1)
        self.gate = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        y = self.conv(rearrange(x, "b n c -> b c n"))[..., :n]  # the left padding only: causal
        return rearrange(y, "b c n -> b n c") * self.gate(x)


class SequenceMixer(nn.Module):
    """Project to q, k, v per head, attend causally, normalise each head's output, project back."""

    def __init__(self, width: int, heads: int, attend: Attend) -> None:
        super().__init__()
        self.heads, self.attend = heads, attend
        self.to_qkv = nn.Linear(width, 3 * width, bias=False)
        self.out_norm = nn.RMSNorm(width // heads)
        self.to_out = nn.Linear(width, width, bias=False)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (b, n, c) -> q, k, v (b, h, n, d)."""
        q, k, v = rearrange(self.to_qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.heads)
        return q, k, v

    def forward(self, x: Tensor) -> Tensor:
        out = self.out_norm(self.attend(*self.qkv(x), causal=True))  # (b, h, n, d)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


class Block(nn.Module):
    """Short convolution, sequence mixer, MLP: each pre-norm, each residual."""

    def __init__(self, width: int, heads: int, attend: Attend, mlp_ratio: int) -> None:
        super().__init__()
        self.conv_norm, self.conv = nn.LayerNorm(width), ShortConv(width)
        self.mix_norm, self.mixer = nn.LayerNorm(width), SequenceMixer(width, heads, attend)
        self.mlp_norm = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.conv(self.conv_norm(x))
        x = x + self.mixer(self.mix_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class RecallLM(nn.Module):
    """Token ids (b, n) -> next-token logits (b, n, vocab), with one mixer per layer."""

    def __init__(self, vocab: int, width: int, heads: int, mixers: list[Attend], mlp_ratio: int = 2) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"d_model {width} is not a multiple of heads {heads}")
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, attend, mlp_ratio) for attend in mixers)
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        # N(0, 1 / width): GPT-2's 0.02 (Zoology's) leaves attention uniform for longer at this width, and training
        # escapes its first plateau several hundred steps later (measured at N = 128, P = 16)
        self.apply(lambda module: _initialise(module, width**-0.5))
        self.head.weight = self.embed.weight  # tied, as Zoology's

    def features(self, tokens: Tensor) -> Tensor:
        """Token ids (b, n) -> the normalised last hidden states (b, n, c) the head reads."""
        x = self.embed(tokens)  # (b, n, c)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.features(tokens))

    def logits_at(self, tokens: Tensor, where: Tensor) -> Tensor:
        """The logits (m, vocab) at the m positions where `where` (b, n) is True only: what MQAR scores, without the
        head's work at every other position."""
        return self.head(self.features(tokens)[where])

    def state_bytes(self, seq_len: int) -> int | None:
        """What the mixers keep to decode after a length-`seq_len` prompt, summed over layers (float32; the
        convolutions' few positions not counted): a KV cache grows with N, a recurrent state does not; 0 for the
        blind mixer; None when a mixer has no decode form."""
        total = 0
        for block in self.blocks:
            attend, heads = block.mixer.attend, block.mixer.heads
            if attend is blind:
                continue
            if not (isinstance(attend, AttentionVariant) and attend.decodes()):
                return None
            dummy = torch.randn(1, heads, seq_len, self.embed.embedding_dim // heads)  # (1, h, n, d)
            with torch.no_grad():
                total += attend.prefill(dummy, dummy, dummy)[1].nbytes
        return total
