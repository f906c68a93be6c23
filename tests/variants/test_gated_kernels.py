"""The gated and delta-rule kernels (attnbench.variants.gated_kernels): chunkwise = recurrent = a naive per-step
reference written from the definition here, at awkward N (not a multiple of the chunk), in float32 and bfloat16,
forward and gradients, with an initial state; and equal to fla's own naive references (fla-core), where installed.

Tolerances, relative to the largest magnitude of what is compared: float32 TOLERANCE["float32"] (the forms sum in
another order); bfloat16 TOLERANCE["bfloat16"]: inputs and outputs are bfloat16, the work float32 in every form, so
the forms differ by the output's rounding (2^-8 relative), and gradients by their own.

b - batch, h - heads, n - position, d - key dim, e - value dim
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from attnbench.variants.gated_kernels import (
    STABLE_LOG_DECAY,
    gated_delta_chunkwise,
    gated_delta_recurrent,
    gated_linear_chunkwise,
    gated_linear_recurrent,
)

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 1.6e-2, torch.float64: 1e-10}
B, H, D, E = 2, 3, 8, 6

KERNELS = ("gla", "retention", "deltanet", "gated-deltanet")


def inputs(kind: str, n: int, dtype: torch.dtype, seed: int = 0, strength: float = 1.0) -> dict[str, torch.Tensor]:
    """q, k, v and the kernel's gates for `kind`, and an initial state; `strength` multiplies the log decays."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, H, n, D, generator=g), torch.randn(B, H, n, D, generator=g)
    v, state = torch.randn(B, H, n, E, generator=g), torch.randn(B, H, D, E, generator=g)
    if kind in ("deltanet", "gated-deltanet"):  # the delta rule is stable with normalised keys and beta in (0, 1)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        gates = {"beta": torch.rand(B, H, n, generator=g)}
        gates["g"] = F.logsigmoid(torch.randn(B, H, n, generator=g)) * strength if kind == "gated-deltanet" else None
    else:
        width = D if kind == "gla" else 1
        gates = {"gk": F.logsigmoid(torch.randn(B, H, n, width, generator=g) + 2) * strength}
    cast = {name: t if t is None else t.to(dtype) for name, t in gates.items()}
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype), **cast, "initial_state": state}


def run(kind: str, form: str, x: dict, chunk_size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel of `kind` in `form` (chunkwise | recurrent): output and final state."""
    delta = kind in ("deltanet", "gated-deltanet")
    if form == "chunkwise":
        kernel: Callable = gated_delta_chunkwise if delta else gated_linear_chunkwise
        options = {"chunk_size": chunk_size}
    else:
        kernel, options = (gated_delta_recurrent if delta else gated_linear_recurrent), {}
    gates = (x["beta"], x["g"]) if delta else (x["gk"],)
    out, state = kernel(x["q"], x["k"], x["v"], *gates, initial_state=x["initial_state"], output_final_state=True,
                        **options)  # fmt: skip
    return out, state


def naive(kind: str, x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, one position at a time, in float64, as matrices: gated linear S_t = A_t S_{t-1} + k_t v_t^T
    with A_t = diag(exp gk_t); the delta rule S_t = (I - beta_t k_t k_t^T) exp(g_t) S_{t-1} + beta_t k_t v_t^T;
    o_t = S_t^T q_t / sqrt(d)."""
    q, k, v = (x[name].double() for name in "qkv")
    state = x["initial_state"].double()
    eye = torch.eye(D, dtype=torch.float64)
    outputs = []
    for t in range(q.shape[2]):
        k_t, v_t = k[:, :, t, :, None], v[:, :, t, None, :]  # (b, h, d, 1), (b, h, 1, e)
        if kind in ("gla", "retention"):
            transition = torch.diag_embed(x["gk"][:, :, t].double().exp().expand(B, H, D))
            state = transition @ state + k_t @ v_t
        else:
            beta = x["beta"][:, :, t, None, None].double()
            decay = x["g"][:, :, t, None, None].double().exp() if x["g"] is not None else 1.0
            state = (eye - beta * k_t @ k_t.transpose(-1, -2)) @ (decay * state) + beta * k_t @ v_t
        outputs.append((state.transpose(-1, -2) @ q[:, :, t, :, None])[..., 0] * D**-0.5)
    return torch.stack(outputs, dim=2), state


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> float:
    """max |a - b| relative to the largest magnitude of b."""
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("n, chunk", [(37, 16), (100, 64), (5, 16)])
@pytest.mark.parametrize("kind", KERNELS)
def test_chunkwise_equals_recurrent_equals_naive(kind: str, n: int, chunk: int, dtype: torch.dtype) -> None:
    x = inputs(kind, n, dtype)
    chunked, chunked_state = run(kind, "chunkwise", x, chunk)
    stepped, stepped_state = run(kind, "recurrent", x)
    reference, reference_state = naive(kind, x)
    assert chunked.dtype == stepped.dtype == dtype and chunked.shape == stepped.shape == (B, H, n, E)
    with torch.no_grad():  # the form without autograd writes over its own buffers: the same values
        assert torch.equal(run(kind, "chunkwise", x, chunk)[0], chunked)
    tolerance = TOLERANCE[dtype]
    assert close(chunked, stepped, dtype) <= tolerance
    assert close(chunked, reference, dtype) <= tolerance
    assert close(stepped, reference, dtype) <= tolerance
    assert close(chunked_state, reference_state, dtype) <= TOLERANCE[torch.float32]  # states are float32 in both
    assert close(stepped_state, reference_state, dtype) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KERNELS)
def test_gradients_of_chunkwise_equal_recurrent(kind: str, dtype: torch.dtype) -> None:
    """Through every input the forms take (q, k, v, gates, beta, the initial state), at N = 37 in chunks of 16."""
    x = inputs(kind, 37, dtype, seed=1)
    names = [name for name, t in x.items() if t is not None]
    weights = torch.randn(B, H, 37, E, generator=torch.Generator().manual_seed(2))
    grads = {}
    for form in ("chunkwise", "recurrent"):
        leaves = {name: x[name].detach().clone().requires_grad_() for name in names}
        out, state = run(kind, form, {**x, **leaves})
        loss = (out.double() * weights).sum() + state.double().square().sum()
        grads[form] = torch.autograd.grad(loss, [leaves[name] for name in names])
    for name, a, b in zip(names, grads["chunkwise"], grads["recurrent"]):
        assert torch.isfinite(a).all(), name
        assert close(a, b, dtype) <= TOLERANCE[dtype] * (4 if dtype == torch.bfloat16 else 10), name


@pytest.mark.parametrize("kind", ["gla", "retention", "gated-deltanet"])
def test_strong_gates_stay_exact(kind: str) -> None:
    """Log decays far past STABLE_LOG_DECAY in a chunk: the per-dimension scores go pair by pair there, the scalar
    ones never leave [0, 1]; values and gradients finite and equal to the recurrence."""
    x = inputs(kind, 70, torch.float32, strength=30.0)
    gate = x["gk"] if "gk" in x else x["g"]
    assert gate[:, :, :16].sum(dim=2).min() < -STABLE_LOG_DECAY  # the chunks are really strong
    chunked, _ = run(kind, "chunkwise", x, 32)
    assert torch.isfinite(chunked).all()
    assert close(chunked, run(kind, "recurrent", x)[0], torch.float32) <= TOLERANCE[torch.float32]
    leaves = {name: t.clone().requires_grad_() for name, t in x.items() if t is not None and name != "initial_state"}
    grads = torch.autograd.grad(run(kind, "chunkwise", {**x, **leaves}, 32)[0].sum(), list(leaves.values()))
    assert all(torch.isfinite(g).all() for g in grads)


def test_a_mixed_batch_of_strong_and_mild_chunks() -> None:
    """Only the chunks past the range go pair by pair; the others keep the fast form, and the two agree."""
    x = inputs("gla", 64, torch.float32)
    x["gk"] = x["gk"].clone()
    x["gk"][0, 1, 16:32] *= 200  # one chunk of one head of one batch element
    assert close(run("gla", "chunkwise", x, 16)[0], run("gla", "recurrent", x)[0], torch.float32) <= 2e-5


# ---- fla's naive references ------------------------------------------------------------------------------------


def fla_reference(family: str) -> object:
    """fla-core's `fla/ops/<family>/naive.py`, loaded as a file (its package imports need triton)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install --no-deps fla-core)")
    path = Path(list(spec.submodule_search_locations)[0]) / "ops" / family / "naive.py"
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{family}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def time_major(t: torch.Tensor) -> torch.Tensor:
    """(b, h, n, ...) -> fla's (b, n, h, ...)."""
    return t.transpose(1, 2)


def test_equals_fla_retention() -> None:
    fla = fla_reference("retention")
    x = inputs("retention", 45, torch.float32)
    heads = torch.arange(H, dtype=torch.float32)
    gk = torch.log1p(-torch.exp2(-5.0 - heads))[None, :, None, None].expand(B, H, 45, 1)
    ours, _ = gated_linear_chunkwise(x["q"], x["k"], x["v"], gk, chunk_size=16)
    assert close(ours, fla.naive_retention(x["q"], x["k"], x["v"]), torch.float32) <= TOLERANCE[torch.float32]


def test_equals_fla_gla() -> None:
    fla = fla_reference("gla")
    x = inputs("gla", 45, torch.float32)
    theirs, their_state = fla.naive_recurrent_gla(*(time_major(x[n]) for n in ("q", "k", "v", "gk")),
                                                  initial_state=x["initial_state"], output_final_state=True)  # fmt: skip
    ours, state = gated_linear_chunkwise(x["q"], x["k"], x["v"], x["gk"], chunk_size=16,
                                         initial_state=x["initial_state"], output_final_state=True)  # fmt: skip
    assert close(ours, time_major(theirs), torch.float32) <= TOLERANCE[torch.float32]
    assert close(state, their_state, torch.float32) <= TOLERANCE[torch.float32]


def test_equals_fla_delta_rule() -> None:
    fla = fla_reference("delta_rule")
    x = inputs("deltanet", 45, torch.float32)
    theirs, their_state = fla.delta_rule_recurrence(x["q"], x["k"], x["v"], x["beta"],
                                                    initial_state=x["initial_state"])  # fmt: skip
    ours, state = gated_delta_chunkwise(x["q"], x["k"], x["v"], x["beta"], chunk_size=16,
                                        initial_state=x["initial_state"], output_final_state=True)  # fmt: skip
    assert close(ours, theirs, torch.float32) <= TOLERANCE[torch.float32]
    assert close(state, their_state, torch.float32) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("their_form", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"])
def test_equals_fla_gated_delta_rule(their_form: str) -> None:
    fla = fla_reference("gated_delta_rule")
    x = inputs("gated-deltanet", 45, torch.float32)
    q, k, v, beta, g = (time_major(x[n]) for n in ("q", "k", "v", "beta", "g"))
    if their_form == "naive_chunk_gated_delta_rule":
        theirs, their_state = fla.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=16,
                                                               initial_state=x["initial_state"],
                                                               output_final_state=True)  # fmt: skip
    else:
        theirs, their_state = fla.naive_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=x["initial_state"],
                                                                   output_final_state=True)  # fmt: skip
    ours, state = gated_delta_chunkwise(x["q"], x["k"], x["v"], x["beta"], x["g"], chunk_size=16,
                                        initial_state=x["initial_state"], output_final_state=True)  # fmt: skip
    assert close(ours, time_major(theirs), torch.float32) <= TOLERANCE[torch.float32]
    assert close(state, their_state, torch.float32) <= TOLERANCE[torch.float32]


@pytest.mark.parametrize("strength", [1.0, 30.0], ids=["mild", "strong"])
@pytest.mark.parametrize("kind", ["deltanet", "gated-deltanet"])
def test_normalising_q_and_k_in_the_kernel(kind: str, strength: float) -> None:
    """`l2_normalize_qk` (fla's `use_qk_l2norm_in_kernel`) on raw q and k equals the kernel on unit ones, in both
    forms, with and without autograd, a zero key (padding) staying zero; its gradients reach the raw q and k."""
    x = inputs(kind, 45, torch.float32, strength=strength)
    lengths = lambda: 0.5 + 4.5 * torch.rand(B, H, 45, 1)  # noqa: E731  # (fla's eps 1e-6 is negligible at >= 0.5)
    raw = {**x, "q": x["q"] * lengths(), "k": x["k"] * lengths()}
    raw["k"][:, :, 7] = 0.0
    x["k"] = x["k"].clone()
    x["k"][:, :, 7] = 0.0
    expected = run(kind, "chunkwise", x)[0]
    gates = (raw["beta"], raw["g"])
    for kernel in (gated_delta_chunkwise, gated_delta_recurrent):
        got = kernel(raw["q"], raw["k"], raw["v"], *gates, initial_state=raw["initial_state"], l2_normalize_qk=True)[0]
        assert close(got, expected, torch.float32) <= TOLERANCE[torch.float32], kernel.__name__
    with torch.no_grad():
        got = gated_delta_chunkwise(raw["q"], raw["k"], raw["v"], *gates, initial_state=raw["initial_state"],
                                    l2_normalize_qk=True)[0]  # fmt: skip
    assert close(got, expected, torch.float32) <= TOLERANCE[torch.float32]
    q, k = raw["q"].clone().requires_grad_(), raw["k"].clone().requires_grad_()
    out = gated_delta_chunkwise(q, k, raw["v"], *gates, chunk_size=16, l2_normalize_qk=True)[0]
    grads = torch.autograd.grad(out.square().sum(), (q, k))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
@pytest.mark.parametrize("name", ["retnet", "gla", "deltanet", "gated-deltanet"])
def test_the_variants_decode_in_their_inputs_dtype(name: str, dtype: torch.dtype) -> None:
    """prefill then step: outputs in the inputs' dtype (the work in float32 or wider), equal to the causal forward to
    that dtype's tolerance; the state the same size after each step."""
    from attnbench.ops import generate
    from attnbench.registry import registry

    variant = registry.create(name, chunk_size=16)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(3))
    forward = variant(q, k, v, causal=True)
    prompt, steps, state = generate(variant, q, k, v, 33)
    assert prompt.dtype == steps.dtype == forward.dtype == dtype
    assert state.nbytes == 2 * 16 * 16 * max(torch.finfo(dtype).bits // 8, 4)
    tolerance = TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16])
    assert close(torch.cat([prompt, steps], dim=2), forward, dtype) <= tolerance


# ---- arguments, edges and the review's cases -----------------------------------------------------------------------


@pytest.mark.parametrize("gate_batch", [(1, H), (1, 1)], ids=["per-head", "shared"])
@pytest.mark.parametrize("strength", [1.0, 60.0], ids=["mild", "strong"])
def test_a_gate_shared_across_the_batch_broadcasts_in_every_path(gate_batch: tuple, strength: float) -> None:
    """gk (1, h|1, n, d): every batch row decays by it, also where its chunks run past float range."""
    x = inputs("gla", 40, torch.float32)
    x["gk"] = x["gk"][: gate_batch[0], : gate_batch[1]] * strength
    assert close(run("gla", "chunkwise", x, 16)[0], run("gla", "recurrent", x)[0], torch.float32) <= 2e-5


@pytest.mark.parametrize(
    "change, says",
    [
        ({"v": torch.zeros(B, H, 40, E)}, "same b, h, n"),
        ({"k": torch.zeros(B, H, 60, D)}, "same b, h, n"),
        ({"gk": torch.zeros(B, H, 40, 3)}, "gk must be (b|1, h|1, n, d|1)"),
        ({"gk": torch.zeros(B, H, 40, D)}, "gk must be"),
        ({"initial_state": torch.zeros(B, H, D, D)}, "initial_state must be (b, h, d, e)"),
        ({"chunk_size": 0}, "chunk_size must be a positive int"),
        ({"chunk_size": 2.5}, "chunk_size must be a positive int"),
        ({"scale": 0.0}, "scale must be a positive number"),
        ({"scale": float("nan")}, "scale must be a positive number"),
    ],
)
def test_bad_arguments_are_named_before_any_work(change: dict, says: str) -> None:
    x = inputs("gla", 50, torch.float32)
    arguments = {"q": x["q"], "k": x["k"], "v": x["v"], "gk": x["gk"], "initial_state": None, **change}
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        gated_linear_chunkwise(**arguments)


def test_a_reset_gate_of_minus_infinity_forgets_everything_before_it() -> None:
    """-inf (a decay of 0) in every form: finite, the forms agree, and what follows the reset is what the sequence
    from the reset on gives alone."""
    for kind in ("gla", "retention", "gated-deltanet"):
        x = inputs(kind, 40, torch.float32)
        gate = "g" if kind == "gated-deltanet" else "gk"
        x[gate] = x[gate].clone()
        x[gate][:, :, 21] = float("-inf")
        chunked, stepped = run(kind, "chunkwise", x, 16)[0], run(kind, "recurrent", x)[0]
        assert torch.isfinite(chunked).all() and close(chunked, stepped, torch.float32) <= 2e-5, kind
        alone = {name: t if t is None or name == "initial_state" else t[:, :, 21:] for name, t in x.items()}
        alone["initial_state"] = torch.zeros_like(x["initial_state"])
        assert close(chunked[:, :, 21:], run(kind, "chunkwise", alone, 16)[0], torch.float32) <= 2e-5, kind


def test_a_chunk_longer_than_the_sequence_is_the_sequence() -> None:
    """chunk_size past N works as chunk_size = N (no padding to a chunk of 4096 for 37 positions)."""
    for kind in KERNELS:
        x = inputs(kind, 37, torch.float32)
        assert torch.equal(run(kind, "chunkwise", x, 4096)[0], run(kind, "chunkwise", x, 37)[0]), kind


def test_no_positions_give_no_outputs_and_the_initial_state() -> None:
    for kind in KERNELS:
        x = inputs(kind, 0, torch.float32)
        for form in ("chunkwise", "recurrent"):
            out, state = run(kind, form, x)
            assert out.shape == (B, H, 0, E) and torch.equal(state, x["initial_state"]), (kind, form)
            assert state is not x["initial_state"]


def test_strong_per_dimension_gates_stay_within_their_memory() -> None:
    """Chunks past float range go through sub-blocks (about C^2 d / 16 per chunk, a few chunks at a time): a call whose
    every chunk of 256 is strong holds at most 3x what the same call with mild gates holds, and equals the recurrence."""
    from attnbench.measure.memory import peak_memory

    x = inputs("gla", 512, torch.float32)
    peaks = {}
    for strength in (1.0, 40.0):
        gk = x["gk"] * strength
        with torch.no_grad():
            call = lambda: gated_linear_chunkwise(x["q"], x["k"], x["v"], gk, chunk_size=256)  # noqa: E731
            peaks[strength] = peak_memory(call, torch.device("cpu"), inputs=(x["q"], x["k"], x["v"], gk))[0]
    assert peaks[40.0] <= 3 * peaks[1.0], peaks
    strong = {**x, "gk": x["gk"] * 40.0}
    assert close(run("gla", "chunkwise", strong, 100)[0], run("gla", "recurrent", strong)[0], torch.float32) <= 2e-5


def test_gla_gate_matrices_are_independent_across_seeds() -> None:
    """One variant's matrices are drawn in turn from its seed: seed s's second is not seed s + 1's first."""
    from attnbench.registry import registry

    shapes = ((D, 16), (16, D))
    second = registry.create("gla", seed=0).projections(shapes, torch.device("cpu"), torch.float64)[1]
    first = registry.create("gla", seed=1).projections(shapes, torch.device("cpu"), torch.float64)[0]
    assert not torch.allclose(second.flatten() * 16**0.5, first.flatten() * D**0.5)


def test_a_nan_gate_stays_in_its_own_sequence() -> None:
    """A NaN log decay spoils its own sequence and head from its chunk on (as the recurrence does), never another
    sequence, and never the chunks before it."""
    for kind in ("gated-deltanet", "gla"):
        x = inputs(kind, 64, torch.float32, strength=10.0 if kind == "gla" else 1.0)
        gate = "g" if kind == "gated-deltanet" else "gk"
        x[gate] = x[gate].clone()
        x[gate][1, 0, 60] = float("nan")
        out = run(kind, "chunkwise", x, 16)[0]
        assert torch.isfinite(out[0]).all() and torch.isfinite(out[1, 1:]).all(), kind
        assert torch.isfinite(out[1, 0, :48]).all() and not torch.isfinite(out[1, 0, 60:]).all(), kind


def test_inputs_set_the_work_dtype_and_integers_are_refused() -> None:
    x = inputs("gla", 20, torch.float32)
    out, state = gated_linear_chunkwise(x["q"], x["k"], x["v"], x["gk"].double(), output_final_state=True)
    assert out.dtype == torch.float32 and state.dtype == torch.float64  # worked in float64: a float64 input
    with pytest.raises(ValueError, match="floating point"):
        gated_linear_chunkwise(x["q"].long(), x["k"], x["v"], x["gk"])
    with pytest.raises(ValueError, match="scale must be a positive number"):
        gated_linear_chunkwise(x["q"], x["k"], x["v"], x["gk"], scale=True)
