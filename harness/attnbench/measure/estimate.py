"""What a cell will cost before it runs: the bytes it will hold at once and the seconds it will take.

From the variant's `cost()` (FLOPs, bytes moved and working set of one forward call) and this machine's measured
matmul and copy peaks: a call's time is at least its roofline, max(FLOPs / matmul peak, bytes / copy peak). The
guard (`attnbench.measure`) skips a cell whose estimate is over the memory limit or the time budget before any of
its buffers is allocated, with the figure as the reason; `attnbench run --dry-run` prints the same estimates.

b - batch, h - heads, i - query position (n_q), j - key position (n_k), d - head dim, e - value dim
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from attnbench.interface import AttentionVariant, Cost, Shape, mode_work
from attnbench.measure.reference import REFERENCE_CHUNK_COPIES, REFERENCE_CHUNK_ELEMENTS, reference_chunk_rows
from attnbench.plan.cells import Cell

FLOAT64 = 8
INPUT_COPIES = 3  # Q, K and V are drawn in float32, sliced, then cast and made contiguous: ~3 copies at once
REFERENCE_PASSES = 12  # reads and writes of the float64 scores per element: matmul out, scale, mask, softmax, ...
BACKWARD_MEMORY = 2.0  # ... and, unless its cost() says otherwise, holds twice the forward's working set
# cost() gives the algorithm's working set; the measured per-call peaks of the built-ins reached up to 2.2x it
# (kernels' own temporaries, masks in the kernel's dtype; the default preset, fwd and fwd+bwd, N up to 16384),
# so the guard counts the variant's part twice
VARIANT_MARGIN = 2.0
SLOW_ROUNDS = 3  # samples of a warm call slower than time_budget_s (fewer than min_rounds; larger N are skipped)
CALLS_AT_BUDGET = 2 + SLOW_ROUNDS  # first call, warm-up, slow rounds: what a cell at the edge of the budget costs
OTHER_CALLS = 2  # besides timing: the output (error) call and the memory call
# Skip only what is over its allowance by more than this: the peaks are measured on a shared machine, where a
# busy stretch reads them low (2.5x seen here), and no call reaches its roofline. Borderline cells run, and
# the measured budget rule (a call slower than time_budget_s skips larger N) takes over.
ESTIMATE_SLACK = 4.0


@dataclass(frozen=True)
class Peaks:
    """This machine's measured yardsticks for one device and dtype (from `attnbench.measure.machine.measure_peaks`)."""

    matmul_flops_per_s: float
    copy_bytes_per_s: float

    @classmethod
    def of(cls, measured: dict[str, Any] | None) -> Peaks | None:
        if not measured or not measured.get("matmul_flops_per_s") or not measured.get("copy_bytes_per_s"):
            return None
        return cls(float(measured["matmul_flops_per_s"]), float(measured["copy_bytes_per_s"]))

    def seconds(self, flops: float, bytes_moved: float) -> float:
        """The roofline: no call doing this work can take less."""
        return max(flops / self.matmul_flops_per_s, bytes_moved / self.copy_bytes_per_s)


def shape_of(cell: Cell) -> Shape:
    itemsize = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}[cell.dtype]
    return Shape(cell.batch, cell.heads, cell.seq_len, cell.n_k, cell.head_dim, cell.v_dim, cell.causal, itemsize)


@dataclass(frozen=True)
class GroupCost:
    """What every cell of a comparison group shares: its inputs and, when error is measured, the exact reference."""

    inputs_bytes: float  # while the inputs are drawn (transient copies included)
    held_inputs_bytes: float  # Q, K, V held while the group is measured
    reference_peak_bytes: float  # while the float64 reference is computed, beyond the held inputs
    reference_kept_bytes: float  # the reference's output and uniform average, held while the group is measured
    reference_s: float  # the reference's time at the float64 roofline (NaN when no peak is known)

    @property
    def setup_peak_bytes(self) -> float:
        return max(self.inputs_bytes, self.held_inputs_bytes + self.reference_peak_bytes)


def group_cost(cell: Cell, *, error: bool, float64_peaks: Peaks | None, decode_steps: int = 0) -> GroupCost:
    """The shared cost of the group `cell` belongs to (every cell of a group has the same shapes). A decode group
    draws N + `decode_steps` positions and needs the reference of the steps' rows only."""
    s = shape_of(cell)
    b, h, n_q, n_k, d, e = s.batch, s.heads, s.n_q, s.n_k, s.head_dim, s.value_dim
    if cell.mode == "decode":
        n_q, n_k = decode_steps, n_k + decode_steps
    held = b * h * (n_q * d + n_k * (d + e)) * s.dtype_bytes
    drawn = INPUT_COPIES * b * h * max(n_q, n_k) * (2 * d + e) * 4
    if not error:
        return GroupCost(drawn, held, 0.0, 0.0, 0.0)
    copies = held / s.dtype_bytes * FLOAT64  # Q, K, V in float64
    kept = 2 * b * h * n_q * e * FLOAT64  # output and uniform average
    rows = min(n_q, reference_chunk_rows(b, h, n_k, REFERENCE_CHUNK_ELEMENTS))
    chunk = REFERENCE_CHUNK_COPIES * b * h * rows * n_k * FLOAT64
    scores = b * h * n_q * n_k
    seconds = (
        float64_peaks.seconds(2 * scores * (d + e), REFERENCE_PASSES * scores * FLOAT64) if float64_peaks else math.nan
    )
    return GroupCost(drawn, held, copies + kept + chunk, kept, seconds)


@dataclass(frozen=True)
class CellEstimate:
    """One cell's memory and time before it runs. Times are roofline lower bounds (NaN with no peak known)."""

    group: GroupCost
    dense_default: bool  # the variant does not override cost(): dense attention's figures are assumed
    variant_bytes: float  # the variant's working set in the cell's mode (with VARIANT_MARGIN), and its output
    call_s: float  # one call at the roofline

    @property
    def peak_bytes(self) -> float:
        """The most the process holds at once for this cell: the group's set-up, or the held inputs and
        reference while the variant runs."""
        during_call = self.group.held_inputs_bytes + self.group.reference_kept_bytes + self.variant_bytes
        return max(self.group.setup_peak_bytes, during_call)

    def calls(self, min_rounds: int, min_run_time: float, time_budget_s: float) -> int:
        """How many calls the cell makes at least: first call, warm-up, its timed rounds, and the memory call."""
        if self.call_s != self.call_s:
            return 2 + min_rounds + OTHER_CALLS
        if self.call_s > time_budget_s:
            return CALLS_AT_BUDGET + OTHER_CALLS
        return 2 + max(min_rounds, math.ceil(min_run_time / max(self.call_s, 1e-9))) + OTHER_CALLS

    def seconds(self, min_rounds: int, min_run_time: float, time_budget_s: float) -> float:
        """The cell's own time at least (its calls; the group's reference is counted once, apart)."""
        return self.call_s * self.calls(min_rounds, min_run_time, time_budget_s)


def cell_estimate(
    cell: Cell, variant: AttentionVariant, *, error: bool, peaks: dict[str, Any], decode_steps: int = 0
) -> CellEstimate:
    """`peaks` maps "device/dtype" to measured peaks; the reference uses the device's float64 entry. A decode cell's
    call is its prefill (a causal forward over the prompt, the largest call it makes); its state is about the
    inputs' size, counted with them."""
    s = shape_of(cell)
    cost = variant.cost(s)
    backward = cell.mode == "fwd+bwd"
    output = s.batch * s.heads * s.n_q * s.value_dim * s.dtype_bytes
    device_type = cell.device.split(":")[0]
    own = Peaks.of(peaks.get(f"{cell.device}/{cell.dtype}") or peaks.get(f"{device_type}/{cell.dtype}"))
    float64 = Peaks.of(peaks.get(f"{cell.device}/float64") or peaks.get(f"{device_type}/float64"))
    call = own.seconds(cost.flops, cost.bytes_moved) if own else math.nan
    return CellEstimate(
        group=group_cost(cell, error=error, float64_peaks=float64, decode_steps=decode_steps),
        dense_default=type(variant).cost is AttentionVariant.cost,
        variant_bytes=VARIANT_MARGIN * (_backward_bytes(cost) if backward else cost.working_bytes) + output,
        call_s=mode_work(cell.mode) * call,
    )


def _backward_bytes(cost: Cost) -> float:
    """What a forward and backward call holds at once: the variant's figure, else twice its forward's."""
    if cost.backward_working_bytes is not None:
        return cost.backward_working_bytes
    return BACKWARD_MEMORY * cost.working_bytes


def mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def seconds_text(value: float) -> str:
    """'0.12 s', '3.4 min', '5.0 h', '2.1 days'."""
    if value != value:
        return "unknown"
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if value >= size * 2:
            return f"{value / size:,.1f} {unit}"
    return f"{value:.2g} s"


DENSE_DEFAULT_HINT = (
    "; the variant does not override cost(), so dense attention's N × N scores and work are assumed: a variant that "
    "needs less should say so in cost()"
)


def over_limit_reason(estimate: CellEstimate, limit_bytes: float, *, limit_source: str) -> str | None:
    """Why the cell would not fit in memory (None when it fits), with the figures."""
    if estimate.peak_bytes <= limit_bytes:
        return None
    g = estimate.group
    parts = [f"inputs {mib(g.held_inputs_bytes)}", f"variant {mib(estimate.variant_bytes)}"]
    if g.reference_peak_bytes:
        parts.insert(1, f"float64 reference {mib(g.reference_peak_bytes)}")
    without_reference = max(g.inputs_bytes, g.held_inputs_bytes + estimate.variant_bytes)
    hint = (
        "; without the reference it fits: --no-error (error = false in a config) measures time and memory only"
        if without_reference <= limit_bytes
        else ""
    )
    hint += DENSE_DEFAULT_HINT if estimate.dense_default else ""
    return (
        f"estimated peak memory {mib(estimate.peak_bytes)} ({', '.join(parts)}) exceeds the limit "
        f"{mib(limit_bytes)} ({limit_source}){hint}"
    )


def over_budget_reason(estimate: CellEstimate, time_budget_s: float) -> str | None:
    """Why the cell would take too long (None when it may run): one call whose roofline alone exceeds
    ESTIMATE_SLACK × time_budget_s, or a reference over ESTIMATE_SLACK × the time of a cell at the edge of the
    budget (CALLS_AT_BUDGET calls)."""
    call_allowance = ESTIMATE_SLACK * time_budget_s
    reference_allowance = call_allowance * CALLS_AT_BUDGET
    if estimate.group.reference_s > reference_allowance:
        return (
            f"the float64 exact reference would take at least {seconds_text(estimate.group.reference_s)} "
            f"(over {ESTIMATE_SLACK:g} × time_budget_s × {CALLS_AT_BUDGET} = {seconds_text(reference_allowance)}); "
            "--no-error (error = false in a config) times it without error"
        )
    if estimate.call_s > call_allowance:
        return (
            f"one call would take at least {seconds_text(estimate.call_s)} at this machine's measured peaks "
            f"(roofline), over {ESTIMATE_SLACK:g} × time_budget_s = {seconds_text(call_allowance)}"
            + (DENSE_DEFAULT_HINT if estimate.dense_default else "")
        )
    return None
