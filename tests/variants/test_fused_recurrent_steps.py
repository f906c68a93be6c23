"""The RNN states' fused decode steps (attnbench.kernels.recurrent_steps, recurrent.c) against their eager form: the
same steps under `eager_steps()` from a clone of the same prefilled state, outputs and states compared after every
step. Every registered variant whose state is a FeatureState or a RecurrentState is covered for free; awkward sizes
(d = 24, e = 40, B = 2, H = 3), tokens sliced out of a longer sequence (strided), strong gates, performer's running
scale rising, and the kernels' explicit-gate paths (a plugin's own `gates`) besides."""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import AttentionVariant, DecodeState
from attnbench.kernels import eager_steps, recurrent_steps, unavailable_reason
from attnbench.kernels.recurrent_steps import delta_step, gated_linear_step, linear_step
from attnbench.registry import registry
from attnbench.variants.decoding import FeatureState, RecurrentState
from attnbench.variants.gated_linear import GLA, DeltaNet, GatedDeltaNet, GatedRecurrence
from torch.utils._python_dispatch import TorchDispatchMode

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no kernels: {unavailable_reason()}")

B, H, D, E, PROMPT, STEPS = 2, 3, 24, 40, 9, 6


def inputs(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """q, k (B, H, PROMPT + STEPS, D), v (..., E): the steps' tokens are slices of these (strided, not copies)."""
    generator = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, PROMPT + STEPS, D, generator=generator, dtype=dtype) for _ in range(2))
    return q, k, torch.randn(B, H, PROMPT + STEPS, E, generator=generator, dtype=dtype)


def rnn_state(variant: AttentionVariant) -> DecodeState | None:
    """The variant's prefilled state on tiny inputs when it is an RNN state (a FeatureState or RecurrentState)."""
    if not variant.decodes() or variant.unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False,
                                                           n_q=PROMPT, n_k=PROMPT, decode=True):  # fmt: skip
        return None
    q, k, v = inputs()
    with torch.no_grad():
        state = variant.prefill(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT])[1]
    return state if isinstance(state, (FeatureState, RecurrentState)) else None


def close(fused: torch.Tensor, eager: torch.Tensor) -> bool:
    """Equal up to float32 rounding in a different order of sums, relative to the tensor's scale."""
    return bool((fused - eager).abs().max() <= 1e-4 * eager.abs().max() + 1e-6)


class KernelCalls:
    """Counts the C kernels' calls (`recurrent_steps.step_kernel`) while patched in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count = 0
        real = recurrent_steps.step_kernel

        def counted(name: str):
            function = real(name)

            def call(*args):
                self.count += 1
                return function(*args)

            return call

        monkeypatch.setattr(recurrent_steps, "step_kernel", counted)


def fused_and_eager(variant: AttentionVariant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    monkeypatch: pytest.MonkeyPatch) -> tuple[DecodeState, DecodeState]:  # fmt: skip
    """Prefill, then STEPS steps fused and the same steps eager from a clone; each step's outputs and states compared.
    -> the two final states."""
    with torch.no_grad():
        fused = variant.prefill(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT])[1]
    eager = fused.clone()
    calls = KernelCalls(monkeypatch)
    for t in range(PROMPT, PROMPT + STEPS):
        token = [x[:, :, t : t + 1] for x in (q, k, v)]
        with torch.no_grad():
            out, fused = variant.step(fused, *token)
            with eager_steps():
                expected, eager = variant.step(eager, *token)
        assert out.shape == expected.shape == (B, H, 1, v.shape[-1]) and out.dtype == expected.dtype
        assert close(out, expected), f"step {t}: output off by {(out - expected).abs().max():.3g}"
        for mine, theirs in zip(fused.tensors(), eager.tensors()):
            assert close(mine, theirs), f"step {t}: state off by {(mine - theirs).abs().max():.3g}"
        assert fused.length == eager.length == t + 1
    assert calls.count == STEPS, "one kernel call per fused step"
    return fused, eager


@pytest.mark.parametrize("name", registry.names())
def test_fused_step_equals_eager_for_every_rnn_state(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    variant = registry.create(name)
    if rnn_state(variant) is None:
        pytest.skip(f"{name} does not decode with a FeatureState or RecurrentState")
    fused_and_eager(variant, *inputs(), monkeypatch)


@pytest.mark.parametrize("name", ["gla", "gated-deltanet"])
def test_strong_gates_decay_the_state_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """gate_normalizer 1: decays of sigmoid(x) itself, the state forgetting most of itself each step."""
    q, k, v = inputs(1)
    fused, eager = fused_and_eager(registry.create(name, gate_normalizer=1.0), q, k * 4, v, monkeypatch)
    assert fused.state.abs().max() < 50 * v.abs().max()  # decayed: not a sum over every step


def test_performer_rescales_its_state_when_a_key_raises_the_running_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt's keys zero (every key log feature 0), each step's key along one of the feature directions w (its
    log feature |w|^2 / 2 there): the running max of key log features rises, so the state is rescaled inside the
    kernel as in the eager form."""
    q, k, v = inputs(2)
    variant = registry.create("performer", features=40)
    directions = variant.projection(D, torch.device("cpu"), torch.float32) * D**0.25  # (m, d): w, in k's units
    k = torch.cat([torch.zeros_like(k[:, :, :PROMPT]), directions[:STEPS].expand(B, H, STEPS, D)], dim=2)
    fused, eager = fused_and_eager(variant, q, k, v, monkeypatch)
    assert bool((fused.scale > 1).all())  # from 0 after the prompt
    assert close(fused.scale, eager.scale)


class ExplicitGLA(GLA):
    """GLA's gates computed in torch and handed to the kernel (a plugin's path: the base `fused_step`)."""

    fused_step = GatedRecurrence.fused_step


class ExplicitDeltaNet(DeltaNet):
    fused_step = GatedRecurrence.fused_step


class ExplicitGatedDeltaNet(GatedDeltaNet):
    fused_step = GatedRecurrence.fused_step


@pytest.mark.parametrize("variant_class", [ExplicitGLA, ExplicitDeltaNet, ExplicitGatedDeltaNet])
def test_gates_given_to_the_kernel_equal_the_eager_form(variant_class, monkeypatch: pytest.MonkeyPatch) -> None:
    fused_and_eager(variant_class(seed=3), *inputs(3), monkeypatch)


@pytest.mark.parametrize("name", ["linear", "performer", "retnet", "gla", "deltanet", "gated-deltanet"])
def test_a_fused_step_is_one_kernel_call_and_one_allocation(name: str) -> None:
    """Nothing but the output's allocation dispatched to torch: the features and gates are the kernel's."""
    variant = registry.create(name)
    q, k, v = inputs()
    with torch.no_grad():
        state = variant.prefill(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT])[1]
        variant.step(state, q[:, :, PROMPT : PROMPT + 1], k[:, :, PROMPT : PROMPT + 1], v[:, :, PROMPT : PROMPT + 1])
        token = [x[:, :, PROMPT + 1 : PROMPT + 2] for x in (q, k, v)]
        with OpLog() as log:
            variant.step(state, *token)
    assert len(log.ops) == 1 and "empty" in log.ops[0], log.ops


class OpLog(TorchDispatchMode):
    """The ATen operators dispatched inside."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name, tokens", [("linear", 1), ("gla", 1), ("gla", 2), ("deltanet", 2)])
def test_steps_outside_the_kernels_reach_take_the_eager_form(name: str, tokens: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """float64, or two tokens at once (a recurrence's step takes several): no kernel call, the eager form's results."""
    variant = registry.create(name)
    calls = KernelCalls(monkeypatch)
    dtype = torch.float64 if tokens == 1 else torch.float32
    q, k, v = inputs(4, dtype)
    with torch.no_grad():
        state = variant.prefill(q[:, :, :PROMPT], k[:, :, :PROMPT], v[:, :, :PROMPT])[1]
        out, state = variant.step(state, *(x[:, :, PROMPT : PROMPT + tokens] for x in (q, k, v)))
    assert out.shape == (B, H, tokens, E) and out.dtype == dtype and state.length == PROMPT + tokens
    assert calls.count == 0


def test_the_wrappers_refuse_what_the_kernels_would_misread() -> None:
    """A state of other rows, gates of another dtype, a projection of another width: a ValueError, never a write
    past a buffer."""
    q, k, v = (x[:, :, :1] for x in inputs())
    with pytest.raises(ValueError, match="one token per row"):
        linear_step(q, k, v, torch.zeros(B, H + 1, D, E + 1))
    with pytest.raises(ValueError, match="one token per row"):
        gated_linear_step(q, k, v, torch.zeros(B, H, D, E + 1), scale=1.0, gk=torch.zeros(1, H, 1, 1))
    with pytest.raises(ValueError, match="float32"):
        gated_linear_step(q, k, v, torch.zeros(B, H, D, E), scale=1.0, gk=torch.zeros(1, H, 1, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="weights"):
        delta_step(q, k, v, torch.zeros(B, H, D, E), scale=1.0, weights=torch.zeros(D + 1, 2))
