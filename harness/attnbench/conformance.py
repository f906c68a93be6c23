"""Conformance checks every variant must pass: the interface's promises, tested on small inputs.

Used by the registry-wide test in tests/ and by the sweep's per-run exactness self-check.
b - batch, h - heads, n - sequence, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from attnbench.interface import (
    CHOSEN_SUPPORT_CHECK_LEN,
    AttentionVariant,
    UnsupportedOptionError,
    chooses_support,
)
from attnbench.measure.memory import peak_memory
from attnbench.ops import (
    DECODE_CHECK,
    TOLERANCE,
    dense_masked_attention,
    exactness_error,
    generate,
    max_abs_difference,
    padding_mask,
)


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""


@dataclass(frozen=True)
class CheckContext:
    """Where and how the checks run: the variant's factory (same seed each call), a device and a dtype."""

    make: Callable[[], AttentionVariant]
    device: torch.device
    dtype: torch.dtype

    def tensors(self, *shapes: tuple[int, ...], seed: int = 0) -> list[Tensor]:
        generator = torch.Generator().manual_seed(seed)
        return [torch.randn(shape, generator=generator).to(self.device, self.dtype) for shape in shapes]

    @property
    def atol(self) -> float:
        return TOLERANCE[self.dtype]


def _refuses(call: Callable[[], object]) -> bool:
    try:
        call()
    except UnsupportedOptionError:
        return True
    return False


def _supports(
    ctx: CheckContext,
    variant: AttentionVariant,
    *,
    causal: bool = False,
    padded: bool = False,
    n_q: int = 8,
    n_k: int = 8,
    backward: bool = False,
) -> bool:
    """Whether this instance accepts these options (capabilities may depend on its hyperparameters)."""
    return (
        variant.unsupported_reason(
            device=ctx.device.type, dtype=ctx.dtype, causal=causal, padded=padded, n_q=n_q, n_k=n_k, backward=backward
        )
        is None
    )


def _causal_options(ctx: CheckContext, variant: AttentionVariant, **options: bool) -> list[bool]:
    """`AttentionVariant.causal_options` on the context's device and dtype."""
    return variant.causal_options(device=ctx.device.type, dtype=ctx.dtype, **options)


def _one_causal(ctx: CheckContext, variant: AttentionVariant, **options: bool) -> bool:
    """The `causal` a check that needs one call uses: non-causal where accepted, else causal (a causal-only one)."""
    return (_causal_options(ctx, variant, **options) or [False])[0]


# ---- the checks --------------------------------------------------------------------------------


def check_shapes(ctx: CheckContext) -> CheckResult:
    q, k, v = ctx.tensors((2, 3, 37, 16), (2, 3, 37, 16), (2, 3, 37, 24))
    variant = ctx.make()
    if not _supports(ctx, variant) and not _supports(ctx, variant, causal=True):  # a decode-only method
        ok = _refuses(lambda: variant(q, k, v)) and _refuses(lambda: variant(q, k, v, causal=True))
        return CheckResult("shapes", "pass" if ok else "fail", "no full-sequence call (decode only), refused" if ok
                           else "a full-sequence call ran although the variant declares none")  # fmt: skip
    out = variant(q, k, v, causal=_one_causal(ctx, variant))
    if tuple(out.shape) != (2, 3, 37, 24) or out.dtype != ctx.dtype or out.device.type != ctx.device.type:
        return CheckResult(
            "shapes", "fail", f"got {tuple(out.shape)} {out.dtype} on {out.device}, expected (2, 3, 37, 24) {ctx.dtype}"
        )
    if not torch.isfinite(out).all():
        return CheckResult("shapes", "fail", "output has NaN or Inf")
    return CheckResult("shapes", "pass", "(2, 3, 37, 16|24) -> (2, 3, 37, 24), finite")


def check_cross_attention(ctx: CheckContext) -> CheckResult:
    q, k, v = ctx.tensors((1, 2, 29, 16), (1, 2, 41, 16), (1, 2, 41, 16))
    variant = ctx.make()
    if not _supports(ctx, variant, n_q=29, n_k=41):
        ok = _refuses(lambda: variant(q, k, v))
        return CheckResult(
            "cross_attention",
            "pass" if ok else "fail",
            "undeclared Nq != Nk refused" if ok else "Nq != Nk ran although not declared",
        )
    out = variant(q, k, v)
    ok = tuple(out.shape) == (1, 2, 29, 16) and bool(torch.isfinite(out).all())
    return CheckResult("cross_attention", "pass" if ok else "fail", f"Nq=29, Nk=41 -> {tuple(out.shape)}")


CROSSING_CAP = 4113  # the longest N a check goes to for a large hyperparameter (its dense reference: N x N)


def crossing_length(variant: AttentionVariant) -> int:
    """An awkward N past twice the largest integer hyperparameter the variant declares (a block, window, chunk or
    bucket size), so what appears only across two of them is reached (17 with none; at most CROSSING_CAP)."""
    largest = max((v for v in variant.hparams.values() if isinstance(v, int) and not isinstance(v, bool)), default=0)
    return min(2 * largest + 17, CROSSING_CAP)


def leakage_lengths(variant: AttentionVariant) -> list[int]:
    """Sequence lengths the causal check runs at: small and awkward ones, and `crossing_length`, so a leak that
    appears only across blocks is reached."""
    return sorted({96, 160, crossing_length(variant)} - {17})


def check_causal_leakage(ctx: CheckContext) -> CheckResult:
    variant = ctx.make()
    if not _supports(ctx, variant, causal=True):
        q, k, v = ctx.tensors(*[(2, 2, 16, 16)] * 3)
        ok = _refuses(lambda: variant(q, k, v, causal=True))
        return CheckResult(
            "causal_leakage",
            "pass" if ok else "fail",
            "undeclared causal refused" if ok else "causal ran although not declared",
        )
    worst, where = 0.0, ""
    for n in leakage_lengths(variant):
        q, k, v, k2, v2 = ctx.tensors(*[(2, 2, n, 16)] * 5)
        t = n // 2 + 1
        future = torch.arange(n, device=ctx.device) > t
        before = variant(q, k, v, causal=True)[:, :, : t + 1]
        after = ctx.make()(q, torch.where(future[:, None], k2, k), torch.where(future[:, None], v2, v), causal=True)
        diff = max_abs_difference(before, after[:, :, : t + 1])
        if not diff < worst:  # NaN (an output that is not finite) is the worst, never a pass
            worst, where = diff, f"N={n}, t={t}"
    ok = worst <= ctx.atol
    lengths = ", ".join(map(str, leakage_lengths(variant)))
    return CheckResult(
        "causal_leakage",
        "pass" if ok else "fail",
        f"outputs up to t moved by at most {worst:.2e} ({where}) when keys/values after t changed, at N = {lengths} "
        f"(tol {ctx.atol:.0e})",
    )


def check_key_padding(ctx: CheckContext, n: int = 64) -> CheckResult:
    q, k, v, k2, v2 = ctx.tensors(*[(3, 2, n, 16)] * 5)
    variant = ctx.make()
    mask = padding_mask(3, n, 0.75, ctx.device)  # a quarter, a half and three quarters of the keys
    causal_options = _causal_options(ctx, variant, padded=True)
    if not causal_options:
        causal = _one_causal(ctx, variant)
        ok = _refuses(lambda: variant(q, k, v, causal=causal, key_padding_mask=mask))
        return CheckResult(
            "key_padding",
            "pass" if ok else "fail",
            "undeclared padding mask refused" if ok else "padding mask ran although not declared",
        )
    padded = mask[:, None, :, None]  # (b, 1, n, 1)
    diffs = []
    for causal in causal_options:
        before = variant(q, k, v, causal=causal, key_padding_mask=mask)
        after = ctx.make()(
            q, torch.where(padded, k2, k), torch.where(padded, v2, v), causal=causal, key_padding_mask=mask
        )
        diffs.append(max_abs_difference(before, after))
    ok = max(diffs) <= ctx.atol
    return CheckResult(
        "key_padding",
        "pass" if ok else "fail",
        f"output moved by {max(diffs):.2e} when padded keys/values changed (tol {ctx.atol:.0e})",
    )


def check_fully_padded(ctx: CheckContext, n: int = 32) -> CheckResult:
    """A query that sees no key outputs zeros: batch element 1 has every key padded, element 0 none."""
    q, k, v = ctx.tensors(*[(2, 2, n, 16)] * 3)
    variant = ctx.make()
    causal_options = _causal_options(ctx, variant, padded=True)
    if not causal_options:
        return CheckResult("fully_padded", "skip", "no key padding mask declared (key_padding checks it is refused)")
    mask = torch.arange(2, device=ctx.device)[:, None].expand(2, n) == 1  # (b, n): element 1 all padding
    wrong = []
    for causal in causal_options:
        out = variant(q, k, v, causal=causal, key_padding_mask=mask)
        kind = "causal" if causal else "non-causal"
        empty, other = out[1], out[0]
        if not torch.isfinite(empty).all():
            wrong.append(f"NaN or Inf ({kind})")
        elif (largest := empty.abs().max().item()) > ctx.atol:
            wrong.append(f"values up to {largest:.2e} ({kind}, tol {ctx.atol:.0e})")
        if not torch.isfinite(other).all():
            wrong.append(f"NaN or Inf in the unpadded batch element beside it ({kind})")
    if wrong:
        return CheckResult(
            "fully_padded",
            "fail",
            "batch element 1 has every key padded, so its queries see no key and must output zeros; got "
            + "; ".join(wrong),
        )
    return CheckResult("fully_padded", "pass", "every key of one batch element padded: its output is zeros, finite")


def check_determinism(ctx: CheckContext) -> CheckResult:
    q, k, v = ctx.tensors(*[(1, 2, 80, 16)] * 3)
    if not _causal_options(ctx, ctx.make()):  # a decode-only method: check_decode runs it
        return CheckResult("determinism", "skip", "no full-sequence call (decode only)")
    causal = _one_causal(ctx, ctx.make())
    diff = max_abs_difference(ctx.make()(q, k, v, causal=causal), ctx.make()(q, k, v, causal=causal))
    return CheckResult(
        "determinism", "pass" if diff == 0 else "fail", f"two instances with one seed differ by {diff:.2e}"
    )


def check_gradients(ctx: CheckContext) -> CheckResult:
    q, k, v = (t.requires_grad_() for t in ctx.tensors(*[(1, 2, 48, 16)] * 3))
    variant = ctx.make()
    causal = _one_causal(ctx, variant)
    if not _supports(ctx, variant, causal=causal, backward=True):
        ok = _refuses(lambda: variant(q, k, v, causal=causal))
        return CheckResult(
            "gradients",
            "pass" if ok else "fail",
            "undeclared backward refused" if ok else "backward ran although not declared",
        )
    grads = torch.autograd.grad(variant(q, k, v, causal=causal).square().sum(), (q, k, v), allow_unused=True)
    inputs = "qkv" if variant.reads_keys else "qv"  # a variant that ignores k (keys from q) owes it no gradient
    missing = [
        name
        for name, g in zip("qkv", grads)
        if name in inputs and (g is None or not torch.isfinite(g).all() or g.abs().sum() == 0)
    ]
    if missing:
        return CheckResult("gradients", "fail", f"no finite, non-zero gradient reaches {', '.join(missing)}")
    return CheckResult("gradients", "pass", f"finite, non-zero gradients reach {', '.join(inputs)}")


EXACT_CHECK_LENGTHS = (75, 300, 1100)  # across block and chunk sizes (64, 128, 256, 512, 1024), none a multiple


def check_exact_pattern(ctx: CheckContext, lengths: tuple[int, ...] = EXACT_CHECK_LENGTHS) -> CheckResult:
    """An exact-pattern variant against the dense masked reference of its own support, at several N: one below any
    default block, others crossing block and chunk boundaries with a ragged last one (a plugin's chunk of 256 once
    went unchecked at N=75 alone), causal and not, padded and not, where supported."""
    variant = ctx.make()
    if not variant.exact:
        what = "approximate variant" if variant.approximates_softmax else "a different operator from softmax"
        return CheckResult("exact_pattern", "skip", f"{what}: no exact pattern to check")
    options = [(c, p) for c in (False, True) for p in (False, True) if _supports(ctx, variant, causal=c, padded=p)]
    if chooses_support(type(variant)):
        lengths = tuple(sorted({*lengths, CHOSEN_SUPPORT_CHECK_LEN}))
    if (crossing := crossing_length(variant)) > max(lengths):  # a block or window larger than the defaults
        lengths = (*lengths, crossing)
    worst = max(
        exactness_error(variant, n=length, causal=c, padded=p, device=ctx.device, dtype=ctx.dtype)
        for c, p in options
        for length in lengths
    )
    ok = worst <= ctx.atol
    return CheckResult(
        "exact_pattern",
        "pass" if ok else "fail",
        f"max error {worst:.2e} against the dense reference of its own support over causal/padding combinations"
        f" at N = {', '.join(map(str, lengths))}",
    )


def check_subquadratic_memory(ctx: CheckContext) -> CheckResult:
    variant = ctx.make()
    if not variant.supports.subquadratic_memory:
        return CheckResult("subquadratic_memory", "skip", "not claimed")
    causal = _one_causal(ctx, variant)
    peaks = []
    for n in (1024, 4096):
        q, k, v = ctx.tensors(*[(1, 2, n, 16)] * 3)  # two heads: factorized patterns split across them
        with torch.no_grad():
            call = lambda: variant(q, k, v, causal=causal)  # noqa: E731
            call()  # warm: what it keeps between calls (cached patterns) is state, not per-call memory
            peaks.append(peak_memory(call, ctx.device, inputs=(q, k, v), tensors=variant.cpu_memory_trackable)[0])
    ratio = peaks[1] / max(peaks[0], 1)
    ok = ratio < 8  # quadratic would be 16
    return CheckResult(
        "subquadratic_memory",
        "pass" if ok else "fail",
        f"peak grew {ratio:.1f}x from N=1024 to 4096 (linear 4x, quadratic 16x)",
    )


DECODE_PROMPT, DECODE_STEPS = DECODE_CHECK


def check_decode(ctx: CheckContext) -> CheckResult:
    """The incremental form (`prefill` then `step`): the prompt's outputs equal the causal forward, and each step's
    output the last row of the causal forward over everything so far (where the variant says they should:
    `decode_equals_forward`); otherwise finite outputs of the right shape. A variant without it must refuse."""
    variant = ctx.make()
    options = dict(device=ctx.device.type, dtype=ctx.dtype, padded=False, causal=True)
    n, total = DECODE_PROMPT, DECODE_PROMPT + DECODE_STEPS
    if variant.unsupported_reason(**options, n_q=n, n_k=n, decode=True) is not None:
        q, k, v = ctx.tensors(*[(1, 2, n, 16)] * 3)
        ok = _refuses(lambda: variant.prefill(q, k, v))
        return CheckResult("decode", "pass" if ok else "fail", "no decode form, refused" if ok else "prefill ran "
                           "although the variant declares no decode form")  # fmt: skip
    q, k, v = ctx.tensors((2, 3, total, 16), (2, 3, total, 16), (2, 3, total, 24), seed=1)
    with torch.no_grad():
        forward = None
        if variant.unsupported_reason(**options, n_q=total, n_k=total) is None:
            forward = variant(q, k, v, causal=True)
        elif variant.exact and (pattern := variant.support_mask(total, total, True)) is not None:
            forward = dense_masked_attention(q, k, v, pattern)  # a decode-only setting: its pattern's reference
    prompt, steps_out, state = generate(variant, q, k, v, n)
    if tuple(prompt.shape) != (2, 3, n, 24) or tuple(steps_out.shape) != (2, 3, DECODE_STEPS, 24):
        return CheckResult("decode", "fail", f"outputs {tuple(prompt.shape)} and steps {tuple(steps_out.shape)}")
    if not (torch.isfinite(prompt).all() and torch.isfinite(steps_out).all()):
        return CheckResult("decode", "fail", "prefill or step output has NaN or Inf")
    if forward is None or not variant.decode_equals_forward:
        return CheckResult("decode", "pass", f"finite outputs of the right shape; state {state.nbytes} bytes")
    prompt_error = max_abs_difference(prompt, forward[:, :, :n])
    step_error = max_abs_difference(steps_out, forward[:, :, n:])
    ok = max(prompt_error, step_error) <= ctx.atol
    return CheckResult(
        "decode",
        "pass" if ok else "fail",
        f"prefill vs causal forward {prompt_error:.1e}, {DECODE_STEPS} steps vs its last rows {step_error:.1e} "
        f"(prompt {n})",
    )


CHECKS: dict[str, Callable[[CheckContext], CheckResult]] = {
    "shapes": check_shapes,
    "cross_attention": check_cross_attention,
    "causal_leakage": check_causal_leakage,
    "key_padding": check_key_padding,
    "fully_padded": check_fully_padded,
    "determinism": check_determinism,
    "gradients": check_gradients,
    "exact_pattern": check_exact_pattern,
    "subquadratic_memory": check_subquadratic_memory,
    "decode": check_decode,
}


CHECK_DTYPES = ("float64", "float32")  # float64 for exactness, float32 for what runs: a NaN may show in one only
FALLBACK_DTYPES = ("bfloat16", "float16")


def check_contexts(make: Callable[[], AttentionVariant]) -> list[CheckContext] | str:
    """Contexts on the first device the variant supports here: float64 and float32 where it supports them
    (else its first low-precision dtype), or why there is none."""
    variant = make()
    devices = [d for d in variant.supports.devices if d == "cpu" or (d == "cuda" and torch.cuda.is_available())]

    def supported(device: str, dtype_name: str) -> bool:  # a forward call, or decode only (a KV-cache method)
        options = dict(device=device, dtype=dtype_name, padded=False, n_q=8, n_k=8)
        return any(variant.unsupported_reason(**options, causal=causal, decode=decode) is None
                   for causal, decode in ((False, False), (True, True)))  # fmt: skip

    for device in devices:
        dtypes = [name for name in CHECK_DTYPES if supported(device, name)]
        dtypes = dtypes or [name for name in FALLBACK_DTYPES if supported(device, name)][:1]
        if dtypes:
            return [CheckContext(make, torch.device(device), getattr(torch, name)) for name in dtypes]
    return (
        variant.unsupported_reason(device="cpu", dtype="float32", causal=False, padded=False, n_q=8, n_k=8)
        or f"no device here that {variant.name} supports ({', '.join(variant.supports.devices)})"
    )


def run_check(name: str, ctx: CheckContext) -> CheckResult:
    """One check, an exception inside it reported as a failure with its message."""
    try:
        return CHECKS[name](ctx)
    except Exception as error:  # a check that crashes is a failed check, with the reason shown
        return CheckResult(name, "fail", f"{type(error).__name__}: {error}")
