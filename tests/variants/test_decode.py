"""Decode forms of the built-ins beyond the registry-wide `check_decode`: the decode-only settings (no KV cache:
the prefix or the window recomputed every step) against their pattern's dense reference, and what each state holds
as the context grows: a ring, sinks and an RNN state stay constant in N, a KV cache grows linearly."""

from __future__ import annotations

import pytest
import torch
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry

DECODE_ONLY = [
    ("full", {"kv_cache": False}),
    ("band", {"window": 5, "kv_cache": False}),
    ("band", {"window": 5, "sinks": 3, "kv_cache": False}),
    ("band", {"window": 4, "sinks": 40, "kv_cache": False}),  # more sinks than the prompt: later tokens join them
]


def generate(variant, q, k, v, prompt: int):
    """Prefill the first `prompt` positions, then step through the rest: (prompt outputs, step outputs, state)."""
    with torch.no_grad():
        out, state = variant.prefill(q[:, :, :prompt], k[:, :, :prompt], v[:, :, :prompt], room=q.shape[-2] - prompt)
        steps = []
        for t in range(prompt, q.shape[-2]):
            step, state = variant.step(state, q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
            steps.append(step)
    return out, torch.cat(steps, dim=-2), state


@pytest.mark.parametrize("name, params", DECODE_ONLY, ids=[f"{n}{p}" for n, p in DECODE_ONLY])
@pytest.mark.parametrize("prompt", [1, 9, 33])
def test_decode_only_settings_equal_their_patterns_reference(name: str, params: dict, prompt: int) -> None:
    variant = registry.create(name, **params)
    assert variant.unsupported_reason(device="cpu", dtype="float64", causal=True, padded=False, n_q=8, n_k=8) is not None
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, prompt + 7, 16, generator=generator, dtype=torch.float64) for _ in range(3))
    n = q.shape[-2]
    expected = dense_masked_attention(q, k, v, variant.support_mask(n, n, True))
    out, steps, _ = generate(variant, q, k, v, prompt)
    assert (out - expected[:, :, :prompt]).abs().max() < 1e-12
    assert (steps - expected[:, :, prompt:]).abs().max() < 1e-12


@pytest.mark.parametrize(
    "name, params, grows",
    [
        ("full", {}, True),
        ("full", {"kv_cache": False}, True),
        ("band", {"window": 16}, False),
        ("band", {"window": 16, "sinks": 4}, False),
        ("linear", {}, False),
        ("performer", {"features": 32}, False),
        ("retnet", {}, False),
        ("gla", {}, False),
        ("deltanet", {}, False),  # its final state once was a view holding every chunk's state (32 MiB at 16K)
        ("gated-deltanet", {}, False),
    ],
)
def test_cache_bytes_constant_in_n_or_linear(name: str, params: dict, grows: bool) -> None:
    """Cache bytes after a prompt of N (room for 4 steps): constant for a window or a state, linear for a cache."""
    variant = registry.create(name, **params)
    sizes = {}
    for n in (64, 256, 1024):
        q, k, v = (torch.randn(1, 2, n, 8) for _ in range(3))
        with torch.no_grad():
            sizes[n] = variant.prefill(q, k, v, room=4)[1].nbytes
    if grows:  # linear in N + room: the ratio of sizes follows the ratio of positions
        assert sizes[1024] / sizes[64] == pytest.approx((1024 + 4) / (64 + 4), rel=1e-9)
    else:
        assert sizes[64] == sizes[256] == sizes[1024] > 0


def test_a_kv_cache_grows_when_its_room_runs_out() -> None:
    """A step past the room given at prefill still works: the cache's buffers double."""
    variant = registry.create("full")
    q, k, v = (torch.randn(1, 2, 10, 8, dtype=torch.float64) for _ in range(3))
    _, steps, state = generate(variant, q, k, v, prompt=3)  # room 7 for 7 steps; then more below
    extra = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    out, state = variant.step(state, extra, extra, extra)
    assert state.length == 11 and state.keys.shape[-2] >= 11 and torch.isfinite(out).all()


@pytest.mark.parametrize("name, params, why", [("linformer", {}, "causal"), ("lsh", {"shared_qk": True}, "decode")])
def test_a_variant_without_a_decode_form_says_why(name: str, params: dict, why: str) -> None:
    variant = registry.create(name, **params)
    reason = variant.unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False, n_q=8, n_k=8,
                                        decode=True)  # fmt: skip
    assert reason is not None and why in reason


class ForgetfulCache(registry.load("full")):  # type: ignore[misc]
    """Claims exactness, but its steps read only the last 8 cached positions."""

    name = "forgetful"

    def step(self, state, q, k, v):
        state.append(k, v)
        from attnbench.ops import softmax_step

        return softmax_step(q, state.k[..., -8:, :], state.v[..., -8:, :]), state


class WrongShape(registry.load("linear")):  # type: ignore[misc]
    name = "wrong-shape"

    def step(self, state, q, k, v):
        out, state = super().step(state, q, k, v)
        return out[:, :, 0], state  # (b, h, e): the token axis dropped


def run_decode(registry_, variants: list[str]):
    from attnbench.measure.dispatch import measure_group
    from attnbench.plan.config import parse_config

    config = parse_config(
        {"variants": variants, "seq_lens": [48], "heads": 2, "head_dim": 16, "mode": "decode", "causal": True,
         "decode_steps": 3, "min_run_time": 1e-4, "min_rounds": 2},
        registry=registry_,
    )  # fmt: skip
    [group] = config.plan().groups
    return {row.label: row for row in measure_group(group, config.settings, registry_).rows}


def test_a_decode_run_self_checks_what_claims_to_be_exact(toy_registry) -> None:
    """A variant that says it is exact has its decoding checked against its own pattern before it is measured: a
    step that forgets keys is an error, not an 'exact' row the verdict could recommend; a wrong shape is named."""
    rows = run_decode(toy_registry(ForgetfulCache, WrongShape), ["full", "forgetful", "wrong-shape"])
    assert rows["full"].status == "ok" and rows["full"].self_check.startswith("pass")
    assert rows["forgetful"].status == "error" and "decode self-check" in rows["forgetful"].reason
    assert rows["wrong-shape"].status == "error" and "expected (b, h, 1, Dv)" in rows["wrong-shape"].reason


def one_step(variant, window: int) -> tuple[float, int, list[int]]:
    """One decode step after a prompt of 3 windows: its matmul FLOPs, the state's bytes after it, and the query
    lengths of every SDPA call it made; the eager form (a FLOP counter sees no C kernel; the fused form's outputs equal
    the eager's: tests/variants/test_fused_steps.py)."""
    from unittest import mock

    from attnbench.kernels import eager_steps
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = (torch.randn(1, 2, 3 * window + 1, 16) for _ in range(3))
    n = 3 * window
    calls: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        calls.append(query.shape[-2])
        return real(query, *args, **kwargs)

    with torch.no_grad():
        _, state = variant.prefill(q[:, :, :n], k[:, :, :n], v[:, :, :n], room=1)
        with eager_steps(), FlopCounterMode(display=False) as counter, mock.patch(
            "torch.nn.functional.scaled_dot_product_attention", spy
        ):
            _, state = variant.step(state, q[:, :, n:], k[:, :, n:], v[:, :, n:])
    return counter.get_total_flops(), state.nbytes, calls


def test_the_ring_reads_its_window_once_and_recomputation_redoes_the_windows_attention() -> None:
    """What each decode form of band is for (their outputs are equal by construction on post-rotary inputs, tested
    above against the pattern): the cached ring's step attends one query to its w + 1 keys, its work linear in w,
    and it keeps k and v; re-computation (StreamingLLM's baseline) recomputes every kept token's attention (w + 1
    queries: work quadratic in w), so it must keep the window's queries too."""
    ring = {w: one_step(registry.create("band", window=w), w) for w in (16, 64)}
    again = one_step(registry.create("band", window=64, kv_cache=False), 64)
    assert ring[64][0] / ring[16][0] == pytest.approx(65 / 17, rel=0.05) and not ring[64][2]  # one query, w + 1 keys
    assert again[2] == [65]  # every kept token's query, the new one last
    assert ring[64][1] == 2 * 65 * 2 * 16 * 4 + 65 * 8  # k and v of w + 1 positions, 2 heads, float32; positions
    assert again[1] == 2 * 65 * 3 * 16 * 4 + 65 * 8  # q, k and v of them
