"""The vocabulary projection without its logits built whole (`attnbench.model.head`): the same loss, relative error
and cosine as from the whole logits, and a forward pass that hands the projection no positions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.model import head
from attnbench.model.head import IGNORED, Head, head_input, loss_targets
from attnbench.model.study import compare
from torch import nn

V, E, N = 50, 8, 37


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 3 positions (and of the Gram matrix's rows), so N positions take many and a ragged last."""
    monkeypatch.setattr(head, "SLICE_BYTES", 3 * 4 * V)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_the_loss_and_the_comparison_are_those_of_the_whole_logits(small_slices: None, causal: bool, bias: bool) -> None:
    generator = torch.Generator().manual_seed(0)
    projection = nn.Linear(E, V, bias=bias)
    hidden, reference = torch.randn(1, N, E, generator=generator), torch.randn(1, N, E, generator=generator)
    labels = torch.randint(V, (1, N), generator=generator)
    labels[0, ::5] = IGNORED  # masked-LM style: unlabelled positions take no part
    assert head.positions_per_slice(V) == 3
    sliced = Head(projection)
    with torch.no_grad():
        logits, exact = projection(hidden), projection(reference)
    if causal:  # transformers' ForCausalLMLoss: position i scored against label i + 1
        whole = F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=IGNORED)
    else:
        whole = F.cross_entropy(logits[0], labels[0], ignore_index=IGNORED)
    assert sliced.loss(hidden, loss_targets(labels, causal)) == pytest.approx(whole.item(), rel=1e-6)
    rel, cosine = compare(logits, exact)
    # float32 sums taken slice by slice, in another order: a relative error of ~5e-4 agrees to ~1e-6 of itself
    assert sliced.compare(hidden, reference) == pytest.approx((rel, cosine), rel=1e-5)
    assert sliced.compare(reference, reference) == pytest.approx((0.0, 1.0), abs=1e-12)


def test_a_forward_pass_under_head_input_keeps_the_heads_input_and_projects_nothing() -> None:
    body, projection = nn.Linear(E, E), nn.Linear(E, V)
    x = torch.randn(2, N, E)
    with head_input(projection) as captured:
        logits = projection(body(x))
    assert logits.shape == (2, 0, V) and torch.equal(captured.value, body(x).detach())
    assert projection(x).shape == (2, N, V)  # the hook is gone after the block
