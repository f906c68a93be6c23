"""The model's vocabulary projection, applied without building the (b, n, vocab) logits whole.

At 8192 tokens SmolLM2's logits alone are 1.6 GB in float32, and a loss or a float64 comparison over them
doubles or triples that. So a forward pass runs with the projection (the model's output embeddings) handed no
positions: a pre-hook keeps what it would have projected, the head's input (b, n, e). Then
- the loss projects it a slice of positions (SLICE_BYTES of float32 logits) at a time, by transformers' own rule
  (`ForCausalLMLoss`, `ForMaskedLMLoss`): cross-entropy in float32, labels -100 ignored, a causal model's labels
  shifted one to the left, the mean over the labels kept;
- the comparison of two models' logits needs no logits at all: with the projection L = W x + c written as
  W' x' (x' = [x, 1]), ||L - L*||^2 = (x' - x*')^T G (x' - x*') and L . L* = x'^T G x*', where G = W'^T W' is
  (e + 1, e + 1): the relative error and the cosine of the logits, exactly, at a cost of n e^2, not n e v.
A model whose logits are more than its projection's output (soft-capping, a logit scale) is caught by the head
check (`attnbench.model.study`), which compares this against transformers' complete forward pass.

b - batch, n - positions, e - hidden size, v - vocabulary
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from weakref import WeakKeyDictionary

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SLICE_BYTES = 64 * 2**20  # one slice of float32 logits (the loss holds it and its log-softmax)
IGNORED = -100  # transformers' ignore_index: a label that takes no part in the loss


def positions_per_slice(vocabulary: int) -> int:
    """Positions whose float32 logits fit in SLICE_BYTES (at least one)."""
    return max(1, SLICE_BYTES // (4 * vocabulary))


@dataclass
class CapturedInput:
    """What the model handed its vocabulary projection in one forward pass: (b, n, e), or None before it ran."""

    value: Tensor | None = None


@contextmanager
def head_input(projection: nn.Module) -> Iterator[CapturedInput]:
    """Within the block, `projection` keeps its input in the yielded holder and projects no positions: the
    model's forward pass returns empty logits (b, 0, v) and computes no loss over them."""
    captured = CapturedInput()

    def keep(module: nn.Module, args: tuple) -> tuple:
        captured.value = args[0].detach()
        return (args[0][:, :0], *args[1:])

    handle = projection.register_forward_pre_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


def loss_targets(labels: Tensor, causal: bool) -> Tensor:
    """(b, n) the label each position's logits are scored against: a causal model's next token (the last
    position none), a masked model's own label; IGNORED where there is none."""
    if not causal:
        return labels
    return F.pad(labels[..., 1:], (0, 1), value=IGNORED)


class Head:
    """A model's vocabulary projection (an affine map: `weight` (v, e), an optional `bias` (v,)), applied without
    building the logits whole (module docstring)."""

    def __init__(self, projection: nn.Module) -> None:
        self.projection = projection

    @property
    def vocabulary(self) -> int:
        return self.projection.weight.shape[0]

    @cached_property
    def gram(self) -> Tensor:
        """(e + 1, e + 1) W'^T W' in float64, W' the weight with the bias as a last column; summed over slices of
        the vocabulary, so no float64 copy of the whole weight is made."""
        weight, bias = self.projection.weight.detach(), getattr(self.projection, "bias", None)
        bias = torch.zeros(self.vocabulary) if bias is None else bias.detach()
        gram = torch.zeros(weight.shape[1] + 1, weight.shape[1] + 1, dtype=torch.float64)
        step = max(1, SLICE_BYTES // (8 * (weight.shape[1] + 1)))  # rows of W' in float64
        for start in range(0, self.vocabulary, step):
            rows = torch.cat([weight[start : start + step], bias[start : start + step, None]], dim=1).double()
            gram += rows.T @ rows
        return gram

    def loss(self, hidden: Tensor, targets: Tensor) -> float:
        """Mean cross-entropy (nats per token) of the logits of `hidden` (b, n, e) against `targets` (b, n),
        IGNORED left out: float32, as transformers computes it, a slice of positions at a time."""
        step = positions_per_slice(self.vocabulary)
        total, count = 0.0, int((targets != IGNORED).sum())
        with torch.no_grad():
            for start in range(0, hidden.shape[1], step):
                logits = self.projection(hidden[:, start : start + step]).float()  # (b, step, v)
                chunk = targets[:, start : start + step].flatten()
                total += F.cross_entropy(logits.flatten(0, 1), chunk, ignore_index=IGNORED, reduction="sum").item()
        return total / count if count else float("nan")

    def compare(self, hidden: Tensor, reference: Tensor) -> tuple[float, float]:
        """The logits of `hidden` against those of `reference` (both (b, n, e)), in float64: relative Frobenius
        error, and the mean over positions of their cosine over the vocabulary (`attnbench.model.study.compare`
        of the two logits), from the Gram matrix."""
        x, ref = (F.pad(t.detach().double(), (0, 1), value=1.0) for t in (hidden, reference))  # (b, n, e + 1)
        difference = x - ref
        squared_error = torch.einsum("bne,ef,bnf->", difference, self.gram, difference).item()
        squared_norm = torch.einsum("bne,ef,bnf->", ref, self.gram, ref).item()
        x_gram, ref_gram = x @ self.gram, ref @ self.gram
        dot = (x_gram * ref).sum(-1)
        norms = ((x_gram * x).sum(-1).clamp(min=0) * (ref_gram * ref).sum(-1).clamp(min=0)).sqrt()
        cosine = (dot / norms.clamp(min=1e-30)).mean().item()
        return max(squared_error, 0.0) ** 0.5 / max(squared_norm**0.5, 1e-300), cosine


_HEADS: WeakKeyDictionary[nn.Module, Head] = WeakKeyDictionary()


def head_of(projection: nn.Module) -> Head:
    """The `Head` of a model's projection, made once per module: its Gram matrix (seconds, for a vocabulary of
    50k) then serves every length a study runs."""
    if projection not in _HEADS:
        _HEADS[projection] = Head(projection)
    return _HEADS[projection]
