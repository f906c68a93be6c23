"""Each decode step's fused form (`attnbench.kernels`: one C call) equals its eager form, registry-wide: outputs and
states after a prompt and several steps, float32, batch 2, grouped-query heads (6 query heads on 2 key/value heads
where the variant decodes them), head dims that are no vector width (24 and 40), prompts that are no multiple of any
block, page or group; and the settings that make each method evict, rank or flush within a few steps. A variant
whose step has no fused form is named here, so a new kernel (or a lost one) shows."""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import DecodeState
from attnbench.kernels import eager_steps, fused_calls, unavailable_reason
from attnbench.ops import softmax_step
from attnbench.registry import registry

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no kernels: {unavailable_reason()}")

SMALL = {  # settings that reach each method's eviction, ranking or flushing within a short prompt
    "band": [{"window": 20}, {"window": 20, "sinks": 3}],
    "topk": [{"block_size": 16, "top_k": 3}, {"block_size": 16, "top_k": 3, "keep_first_block": True,
                                             "select_per": "kv-head"}],
    "h2o": [{"budget": 48, "recent": 16}],
    "kivi": [{"group": 16, "residual": 32}, {"bits": 2, "group": 16, "residual": 32}],
    "duo-attention": [{"sinks": 4, "recent": 16}],  # streaming heads: a head-wise (ragged) cache
    "snapkv": [{"heads": "adaptive", "budget": 48}],  # AdaKV's head-wise budgets: ragged too
    "think": [{"prune_new": True}],  # later keys pruned too: one run of keys
    "strided": [{"stride": 8}, {"stride": 8, "factorize": True}],  # the run and the column, or split by heads
}
EAGER_ONLY: dict[str, str] = {}  # decoding variants whose step has no fused form (each still steps, eagerly): why
PROMPT, STEPS = 131, 9


def settings() -> list[tuple[str, dict]]:
    decoding = [name for name in registry.names() if registry.load(name).decodes()]
    return [(name, params) for name in decoding for params in [{}] + SMALL.get(name, [])]


def run(variant, state: DecodeState, q, k, v, eager: bool) -> tuple[torch.Tensor, DecodeState, int]:
    """STEPS steps from a copy of `state`: their outputs (b, h, STEPS, e), the state after them, the kernel calls."""
    state, outs, before = state.clone(), [], fused_calls()
    with torch.no_grad(), eager_steps(eager):
        for t in range(PROMPT, PROMPT + STEPS):
            out, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            outs.append(out)
    return torch.cat(outs, dim=-2), state, fused_calls() - before


@pytest.mark.parametrize("name, params", settings(), ids=[f"{n}{p or ''}" for n, p in settings()])
def test_the_fused_step_equals_the_eager_one(name: str, params: dict) -> None:
    variant = registry.create(name, **params)
    generator = torch.Generator().manual_seed(0)
    heads = 2 if variant.supports.grouped_kv else 6
    q = torch.randn(2, 6, PROMPT + STEPS, 24, generator=generator)
    k = torch.randn(2, heads, PROMPT + STEPS, 24, generator=generator)
    v = torch.randn(2, heads, PROMPT + STEPS, 40, generator=generator)
    with torch.no_grad():
        state = variant.prefill_state(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT], room=STEPS)
    fused, fused_state, calls = run(variant, state, q, k, v, eager=False)
    eager, eager_state, eager_calls = run(variant, state, q, k, v, eager=True)
    assert eager_calls == 0
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(fused_state.tensors(), eager_state.tensors()):  # float32 rounding apart
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, equal_nan=True)
    if name in EAGER_ONLY:
        assert calls == 0, f"{name} now has a fused step: take it out of EAGER_ONLY"
    else:
        assert calls >= STEPS, f"{name}'s step made {calls} kernel calls in {STEPS} steps (at least one each expected)"


@pytest.mark.parametrize("visible", [None, "b", "g", "bg", "n"])
def test_softmax_step_fused_equals_eager_with_its_masks_and_the_new_token_written(visible: str | None) -> None:
    generator = torch.Generator().manual_seed(1)
    b, h, g, n = 3, 9, 3, 1037  # awkward: no multiple of a chunk, a range, a vector
    q = torch.randn(b, h, 1, 24, generator=generator)
    k, v = torch.randn(b, g, n, 24, generator=generator), torch.randn(b, g, n, 40, generator=generator)
    shape = {None: None, "b": (b, 1, n), "g": (1, g, n), "bg": (b, g, n), "n": (n,)}[visible]
    mask = None if shape is None else torch.rand(shape, generator=generator) > 0.4
    if mask is not None:
        mask[..., 500] = True  # the new token's slot is always visible
    new = (torch.randn(b, g, 1, 24, generator=generator), torch.randn(b, g, 1, 40, generator=generator), 500)
    k2, v2 = k.clone(), v.clone()
    fused = softmax_step(q, k, v, mask, new=new)
    with eager_steps():
        eager = softmax_step(q, k2, v2, mask, new=new)
    assert (fused - eager).abs().max() < 1e-5
    assert torch.equal(k, k2) and torch.equal(v[:, :, 500], new[1][:, :, 0])
