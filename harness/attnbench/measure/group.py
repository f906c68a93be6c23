"""Measure one comparison group: its cells in, their rows and timing samples out. No file I/O.

A group that is not `timed` (an input after the first, unless `time_every_input`) has its error measured
and nothing else: time barely depends on the input, and its setting's first input was timed.

Inputs and the exact reference are built once for the group; each variant is self-checked (exact ones),
its error measured, then every variant of the group is timed **in interleaved rounds**: each round calls
each variant once (a block of calls for very fast ones), in an order shuffled per round from the group's
seed, until every variant has `min_run_time` seconds and at least `min_rounds` samples. A slow stretch of
a shared machine then falls on all of them alike, and the speedup against the baseline is taken round by
round (paired). Memory is measured after timing, outside it. A failure in one cell is that cell's row.
A timed group runs at the torch threads the user set, else at as many as the idle cores hold
(`attnbench.measure.threads`); one whose times are the scheduler's (`attnbench.measure.stalls`) is measured once more,
at one thread unless the user set them, and where it still is, its rows are marked unusable.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from attnbench.inputs.catalogue import Inputs, make_inputs
from attnbench.interface import (
    CHOSEN_SUPPORT_CHECK_LEN,
    AttentionVariant,
    UnsupportedOptionError,
    chooses_support,
)
from attnbench.measure.compiled import (
    call_of,
    compiled_graphs,
    compiler_reason,
    fresh_compile_cache,
    is_compiler_failure,
    no_recompiling,
)
from attnbench.measure.estimate import (
    SLOW_ROUNDS,
    CellEstimate,
    cell_estimate,
    over_budget_reason,
    over_limit_reason,
    shape_of,
)
from attnbench.measure.machine import available_memory_bytes, device_description, peaks_for, warm_allocator
from attnbench.measure.memory import call_memory
from attnbench.measure.metrics import error_metrics, needle_fields
from attnbench.measure.noise import MEASURED_AGAIN, LoadWatch, cpu_mhz, load_average, noise_reason
from attnbench.measure.stalls import Timed, floor_seconds, scheduler_bound
from attnbench.measure.threads import fit_threads, note_competing, usable_ceiling
from attnbench.measure.reference import Reference, dropped_masses, exact_reference
from attnbench.measure.timing import time_in_turns, timed_call
from attnbench.ops import TOLERANCE, exactness_error
from attnbench.plan.cells import Cell, Group
from attnbench.plan.config import Settings
from attnbench.plan.fit import input_unfit
from attnbench.registry import Registry
from attnbench.runfolder.rows import row_for
from attnbench.stats import Spread, paired_speedup

GIB = 2**30
DROPPED_MASS_MAX_N = 4096  # the dropped mass needs the variant's dense (N, N) pattern
# what a row of an unusable group withholds: no ratio is drawn from the scheduler's times
SPEEDUP_COLUMNS = ("speedup", "speedup_low", "speedup_high", "speedup_coverage",
                   "compiled_speedup", "compiled_speedup_low", "compiled_speedup_high")  # fmt: skip


@dataclass
class GroupResult:
    rows: list[Any]  # attnbench.runfolder.rows.Row, one per cell of the group
    samples: list[tuple[str, int, float]] = field(default_factory=list)  # (cell_key, round, seconds per call)


Progress = Callable[[str, str], None]  # (step, cell_key): called before each step that might crash or hang
GROUP_STEP = ""  # the cell_key of a step of the whole group (its inputs, its reference)


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def failure(error: BaseException, *, compiled: bool = False) -> dict[str, str]:
    """A cell's status and reason for an exception raised while measuring it. A variant that refuses an option
    only at the call (one its capabilities cannot express, e.g. too few heads) is `unsupported`, not broken; so is
    a compiled call that the compiler itself fails on (`attnbench.measure.compiled`)."""
    if isinstance(error, UnsupportedOptionError):
        return {"status": "unsupported", "reason": str(error)}
    if compiled and is_compiler_failure(error):
        return {"status": "unsupported", "reason": compiler_reason(error)}
    if isinstance(error, SystemExit):  # a plugin ending the process is that cell's failure, not the run's end
        return {"status": "error", "reason": f"the variant called sys.exit({error.code!r})"}
    return {
        "status": "oom" if is_out_of_memory(error) else "error",
        "reason": f"{type(error).__name__}: {error}".strip(),
    }


def timing_fields(spread: Spread) -> dict[str, Any]:
    """A row's time columns from the spread of its samples (one measurement, or several processes' pooled)."""
    return {
        "time_median_s": spread.median,
        "time_p10_s": spread.p10,
        "time_p25_s": spread.p25,
        "time_p75_s": spread.p75,
        "time_p90_s": spread.p90,
        "time_iqr_s": spread.iqr,
        "time_repeats": spread.count,
    }


def is_baseline(cell: Cell, baseline: str) -> bool:
    """`baseline` names a variant with its defaults (`full`) or a setting by its label (`band(window=64)`)."""
    return cell.label() == baseline


@dataclass
class Admission:
    """Whether a cell may run, decided before anything of it is allocated: its variant (None when it could not
    be built), the row fields so far (a status and reason when it may not run), and its estimate."""

    variant: AttentionVariant | None
    fields: dict[str, Any]
    estimate: CellEstimate | None = None

    @property
    def runs(self) -> bool:
        return self.variant is not None and "status" not in self.fields


def memory_limit(settings: Settings, device: str) -> tuple[float, str]:
    """The bytes a cell may hold at once, and where that figure comes from."""
    if settings.memory_limit_gb is not None:
        return settings.memory_limit_gb * GIB, f"memory_limit_gb={settings.memory_limit_gb:g}"
    return 0.8 * available_memory_bytes(device), "80% of the memory available now; set memory_limit_gb to change it"


def admit(cell: Cell, settings: Settings, registry: Registry) -> Admission:
    """Build the cell's variant and apply the guard: unsupported options, CUDA missing, and the estimates of
    memory (inputs, float64 reference, the variant's working set) and time (the roofline of a call, the
    reference) against the limits. Nothing of the cell's size is allocated."""
    try:
        variant = registry.create(cell.variant.name, seed=cell.seed, **dict(cell.variant.params))
    except (Exception, SystemExit) as error:  # SystemExit: a plugin's sys.exit() is its cell's error
        return Admission(None, {"status": "error", "reason": f"could not build the variant: {error}"})
    fields: dict[str, Any] = {
        "family": variant.family, "exact": variant.exact, "approximates_softmax": variant.approximates_softmax
    }
    if cell.device.startswith("cuda") and not torch.cuda.is_available():
        return Admission(variant, {**fields, "status": "unsupported", "reason": "CUDA is not available on this machine"})
    reason = variant.unsupported_reason(
        device=cell.device,
        dtype=cell.dtype,
        causal=cell.causal,
        padded=cell.padding > 0,
        n_q=cell.seq_len,
        n_k=cell.n_k,
        backward=cell.mode == "fwd+bwd",
        decode=cell.mode == "decode",
    )
    if reason is None and cell.compiled and variant.compiles_itself:
        reason = (f"{cell.variant.label()} is compiled code already (FlexAttention): its uncompiled cell times the "
                  "compiled kernel; run it without compile")  # fmt: skip
    if reason is not None:
        return Admission(variant, {**fields, "status": "unsupported", "reason": reason})
    if unfit := input_unfit(cell, settings.decode_steps):
        return Admission(variant, {**fields, "status": "skipped", "reason": unfit})
    peaks = peaks_for(cell.device, (cell.dtype, "float64"))
    estimate = cell_estimate(cell, variant, error=settings.error, peaks=peaks, decode_steps=settings.decode_steps)
    limit, source = memory_limit(settings, cell.device)
    too_big = over_limit_reason(estimate, limit, limit_source=source)
    too_slow = over_budget_reason(estimate, settings.time_budget_s)
    if too_big or too_slow:
        return Admission(variant, {**fields, "status": "skipped", "reason": too_big or too_slow}, estimate)
    return Admission(variant, fields, estimate)


class GroupMeasurement:
    """The state of measuring one group: its settings, registry, inputs, reference and the cells still running."""

    def __init__(
        self,
        group: Group,
        settings: Settings,
        registry: Registry,
        *,
        self_checks: dict[tuple, tuple[bool, str]] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.group = group
        self.settings = settings
        self.registry = registry
        self.setting = group.setting
        self.device = torch.device(self.setting.device)
        self.self_checks = {} if self_checks is None else self_checks  # shared across groups of a run
        self.progress = progress or (lambda step, key: None)
        self.fields: dict[str, dict[str, Any]] = {cell.key(): {} for cell in group.cells}
        self.supports: dict[str, torch.Tensor] = {}  # exact-pattern variants' supports, for their dropped mass
        self.variants: dict[str, AttentionVariant] = {}
        self.calls: dict[str, Callable[..., torch.Tensor]] = {}  # what each cell times: the call, or it compiled
        self.compiled = {cell.key() for cell in group.cells if cell.compiled}
        self.first_call: dict[str, float] = {}  # seconds of each cell's first call at its shape
        self.inputs: Inputs | None = None
        self.reference: Reference | None = None

    # ---- the steps ----------------------------------------------------------------------------

    def run(self) -> GroupResult:
        """The group measured at the threads the user set, else at those the idle cores hold (`fit_threads`). A group
        whose times turn out to be the scheduler's (`scheduler_bound`) is measured once more from the start, at one
        thread unless the user set them; where it still is, its rows are marked unusable (`noisy`) and carry no
        speedup."""
        watch = LoadWatch.start()
        choice = fit_threads(self.settings.threads, watch) if self.group.timed else None
        threads = choice.threads if choice else self.settings.threads or usable_ceiling()
        samples, competing, bound = self._measured_at(threads, watch)
        if not bound:
            return self._result(samples, threads, watch, competing, "")
        again = type(self)(self.group, self.settings, self.registry, self_checks=self.self_checks,
                           progress=self.progress)  # fmt: skip
        retry = self.settings.threads or 1
        watch = LoadWatch.start()
        samples, competing, still = again._measured_at(retry, watch)
        reruns = f"{MEASURED_AGAIN} {threads} thread{'s' * (threads > 1)} ({bound}): measured again at {retry}"
        # the rows say the threads of the measurement they hold; `reruns` why there were two
        return again._result(samples, retry, watch, competing, still, reruns)

    def _measured_at(self, threads: int, watch: LoadWatch) -> tuple[list[tuple[str, int, float]], float | None, str]:
        """Every cell prepared and measured at `threads` torch threads (restored after): the samples, the other
        processes' load since `watch` started, and why the times are the scheduler's ('' when nothing says so)."""
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for cell in self.group.cells:
                self._prepare(cell)
            with fresh_compile_cache() if self.compiled else contextlib.nullcontext():
                samples = self._measure()
        finally:
            torch.set_num_threads(previous)
        competing = watch.competing_cores()
        note_competing(competing)  # the next group of this process fits its threads to it, without a watch of its own
        return samples, competing, self._scheduler_bound(samples, threads, competing)

    def _scheduler_bound(self, samples: list[tuple[str, int, float]], threads: int, competing: float | None) -> str:
        """`scheduler_bound` on the group's timed cells: their medians, fastest samples and work's floors."""
        by_key: dict[str, list[float]] = {}
        for key, _round, seconds in samples:
            by_key.setdefault(key, []).append(seconds)
        s = self.setting
        peak = peaks_for(s.device, (s.dtype,)).get(f"{s.device}/{s.dtype}", {})
        timed = {}
        for cell in self.group.cells:
            values, fields = by_key.get(cell.key()), self.fields[cell.key()]
            if not values or fields.get("time_median_s") is None or fields.get("status", "ok") != "ok":
                continue
            floor = floor_seconds(s.mode, fields.get("flops"), fields.get("bytes_moved"), peak)
            timed[cell.label()] = Timed(fields["time_median_s"], min(values), len(values), floor)
        return scheduler_bound(timed, threads=threads, competing=competing, cores=os.cpu_count() or 1)

    def _result(self, samples: list[tuple[str, int, float]], threads: int, watch: LoadWatch, competing: float | None,
                bound: str, reruns: str = "") -> GroupResult:  # fmt: skip
        """The group's rows: each cell's fields, where and how it ran, its noise; `bound` (the scheduler's times)
        makes each timed row unusable, its speedups withheld."""
        common = dict(
            host=socket.gethostname(),
            device_name=device_description(self.setting.device),
            threads=threads,
            load_before=watch.load_before,
            load_after=load_average(),
            cpu_mhz=cpu_mhz(),
            reruns=reruns,
        )
        rows = []
        for cell in self.group.cells:
            values = {**common, "timed": self.group.timed, **self.fields[cell.key()]}
            if values.get("time_median_s") is not None:
                values["noisy"] = noise_reason(values["time_median_s"], values["time_iqr_s"], competing, bound)
                if bound:
                    values.update(dict.fromkeys(SPEEDUP_COLUMNS))
            rows.append(row_for(cell, **values))
        return GroupResult(rows, samples)

    def _measure(self) -> list[tuple[str, int, float]]:
        """Inputs and reference, each cell's checks and error, then timing in turns and memory: the samples."""
        samples: list[tuple[str, int, float]] = []
        if not self.variants:
            return samples
        try:
            self.progress("building the inputs", GROUP_STEP)
            self.inputs = self._make_inputs()
            if self.settings.error:
                self.progress("computing the exact reference", GROUP_STEP)
                self.reference = exact_reference(
                    self.inputs.q,
                    self.inputs.k,
                    self.inputs.v,
                    causal=self.setting.causal,
                    key_padding_mask=self.inputs.key_padding_mask,
                )
        except Exception as error:  # inputs the machine cannot build fail every cell of the group
            for key in list(self.variants):
                self._fail(key, failure(error))
        for cell in self.group.cells:
            if cell.key() in self.variants:
                self._check_and_error(cell)
        self._dropped_masses()
        if self.group.timed:
            with warm_allocator():
                samples = self._time_in_turns()
            for cell in self.group.cells:
                if cell.key() in self.variants:
                    self._memory_and_cost(cell)
        return samples

    def _fail(self, key: str, outcome: dict[str, str]) -> None:
        self.fields[key].update(outcome)
        self.variants.pop(key, None)
        self.calls.pop(key, None)

    def _failed(self, key: str, error: BaseException) -> None:
        """The cell's row for an exception raised while measuring it (`failure`)."""
        self._fail(key, failure(error, compiled=key in self.compiled))

    def _prepare(self, cell: Cell) -> None:
        """Build the variant; cells it cannot run, or that would not fit in memory or time, get their row now."""
        admission = admit(cell, self.settings, self.registry)
        self.fields[cell.key()].update(admission.fields)
        if admission.runs:
            self.variants[cell.key()] = admission.variant
            self.calls[cell.key()] = call_of(admission.variant, cell.compiled)

    def _make_inputs(self, positions: int | None = None, queries_from: int = 0) -> Inputs:
        """The group's inputs; `positions` overrides N for queries and keys alike (decode: the prompt and its steps),
        and needles' queries come at positions >= `queries_from` (decode: the steps)."""
        s = self.setting
        return make_inputs(
            s.input.name,
            dict(s.input.params),
            batch=s.batch,
            heads=s.heads,
            seq_len=positions or s.seq_len,
            kv_len=positions or s.n_k,
            head_dim=s.head_dim,
            value_dim=s.v_dim,
            dtype=getattr(torch, s.dtype),
            device=self.device,
            seed=s.seed,
            padding=s.padding,
            causal=s.causal,
            queries_from=queries_from,
        )

    def _check_and_error(self, cell: Cell) -> None:
        """Self-check an exact variant against its own pattern, then one output: finite, and its error."""
        key, variant = cell.key(), self.variants[cell.key()]
        assert self.inputs is not None
        try:
            if variant.exact and cell.seq_len == cell.n_k:
                self.progress("self-check", key)
                passed, self.fields[key]["self_check"] = self._self_check(cell, variant)
                if not passed:
                    reason = f"self-check against its own support failed: {self.fields[key]['self_check']}"
                    return self._fail(key, {"status": "error", "reason": reason})
            self.progress("compiling" if cell.compiled else "output", key)
            inputs, call = self.inputs, self.calls[key]

            def first_call() -> torch.Tensor:  # the first call at this shape: compilation and lazy set-up land here
                with torch.no_grad():
                    return call(
                        inputs.q, inputs.k, inputs.v, causal=cell.causal, key_padding_mask=inputs.key_padding_mask
                    )

            graphs = compiled_graphs()
            output, self.first_call[key] = timed_call(first_call, self.device)
            expected = (cell.batch, cell.heads, cell.seq_len, cell.v_dim)
            if tuple(output.shape) != expected or output.dtype != inputs.q.dtype:
                wrong = f"output is {tuple(output.shape)} {str(output.dtype).removeprefix('torch.')}"
                reason = f"{wrong}, expected (b, h, Nq, Dv) = {expected} {cell.dtype}, the inputs' dtype"
                return self._fail(key, {"status": "error", "reason": reason})
            if not torch.isfinite(output).all():
                return self._fail(key, {"status": "error", "reason": "output has NaN or Inf"})
            self.fields[key].update(needle_fields(output, inputs, causal=cell.causal))
            if self.reference is not None:
                self._error_fields(key, output)
                if variant.exact and variant.family != "exact" and cell.seq_len == cell.n_k <= DROPPED_MASS_MAX_N:
                    # measured for every such variant of the group in one pass over the exact weights, after
                    self.supports[key] = variant.support_for(
                        inputs.q, inputs.k, causal=cell.causal, key_padding_mask=inputs.key_padding_mask
                    )
            del output
            if cell.mode == "fwd+bwd":
                self.progress("backward", key)
                grads, self.first_call[key] = timed_call(self._call(cell, call), self.device)  # its first call
                if not all(torch.isfinite(g).all() for g in grads if g is not None):
                    return self._fail(key, {"status": "error", "reason": "gradients have NaN or Inf"})
            if cell.compiled:
                self.fields[key]["compiled_graphs"] = compiled_graphs() - graphs
        except (Exception, SystemExit) as error:
            self._failed(key, error)

    def _error_fields(self, key: str, output: torch.Tensor) -> None:
        """The cell's error against the reference, and what the reference says of the input's attention."""
        assert self.reference is not None
        self.fields[key].update(error_metrics(output, self.reference).as_row())
        self.fields[key].update(
            input_entropy=self.reference.entropy,
            input_band_mass=self.reference.band_mass,
            input_sink_mass=self.reference.sink_mass,
            input_head_spread=self.reference.head_spread,
        )

    def _dropped_masses(self) -> None:
        """The exact attention mass outside each exact-pattern variant's support, all from one pass over the exact
        weights (one softmax per chunk of queries, however many variants: at N=4096 each pass takes seconds)."""
        supports, self.supports = self.supports, {}
        if not supports or self.inputs is None:
            return
        self.progress("dropped mass", GROUP_STEP)
        try:
            masses = dropped_masses(
                self.inputs.q,
                self.inputs.k,
                supports,
                causal=self.setting.causal,
                key_padding_mask=self.inputs.key_padding_mask,
            )
        except Exception as error:  # a support that does not fit the inputs is its variant's failure
            for key in supports:
                self._fail(key, failure(error))
            return
        for key, mass in masses.items():
            self.fields[key]["dropped_mass"] = mass

    def _self_check(self, cell: Cell, variant: AttentionVariant) -> tuple[bool, str]:
        """Exact variants against the dense reference of their own pattern at small N, once per run."""
        check_key = (cell.variant, cell.device, cell.dtype, cell.causal, cell.padding > 0)
        if check_key not in self.self_checks:
            dtype = getattr(torch, cell.dtype)
            n = self.settings.self_check_len
            if chooses_support(type(variant)):  # a selection must have blocks to leave out
                n = max(n, CHOSEN_SUPPORT_CHECK_LEN)
            error = exactness_error(
                variant, n=n, causal=cell.causal, padded=cell.padding > 0, device=self.device, dtype=dtype
            )
            tolerance = TOLERANCE[dtype]
            passed = error <= tolerance
            self.self_checks[check_key] = (passed, f"{'pass' if passed else 'FAIL'} (max err {error:.1e} at N={n})")
        return self.self_checks[check_key]

    def _call(self, cell: Cell, variant: Callable[..., torch.Tensor]) -> Callable[[], Any]:
        """The timed callable of the cell's mode (forward without autograd, or forward and backward) of `variant`:
        a variant, or its compiled call."""
        assert self.inputs is not None
        inputs, causal, mask = self.inputs, cell.causal, self.inputs.key_padding_mask
        if cell.mode == "fwd":

            def forward() -> None:
                with torch.no_grad():
                    variant(inputs.q, inputs.k, inputs.v, causal=causal, key_padding_mask=mask)

            return forward
        q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        grad_out = torch.randn(
            v.shape[:-2] + (q.shape[-2], v.shape[-1]), generator=torch.Generator().manual_seed(cell.seed + 1)
        )
        grad_out = grad_out.to(inputs.v)

        def forward_backward() -> tuple[torch.Tensor, ...]:
            out = variant(q, k, v, causal=causal, key_padding_mask=mask)
            # allow_unused: a variant may derive keys from the queries (shared-QK LSH) and never read k
            return torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)

        return forward_backward

    def _held(self) -> tuple[torch.Tensor, ...]:
        """Tensors the timed calls hold that are not their own memory."""
        assert self.inputs is not None
        return tuple(
            t for t in (self.inputs.q, self.inputs.k, self.inputs.v, self.inputs.key_padding_mask) if t is not None
        )

    # ---- timing in turns ----------------------------------------------------------------------

    def _time_in_turns(self) -> list[tuple[str, int, float]]:
        """Every running cell timed in turns (`time_in_turns`, the order reproducible per group); returns
        (cell_key, round, s/call)."""
        calls = {}
        for cell in self.group.cells:
            key = cell.key()
            if key in self.variants:
                try:
                    calls[key] = self._call(cell, self.calls[key])
                except (Exception, SystemExit) as error:
                    self._failed(key, error)
        with no_recompiling() if self.compiled else contextlib.nullcontext():  # compiled: every call compiled
            samples = time_in_turns(
                calls,
                self.device,
                min_rounds=self.settings.min_rounds,
                min_run_time=self.settings.min_run_time,
                order_seed=self.group.key(),
                slow_after_s=self.settings.time_budget_s,  # a call over the time budget stops at SLOW_ROUNDS samples
                slow_rounds=SLOW_ROUNDS,
                on_step=self.progress,
                on_failure=self._failed,
            )
        for key, values in samples.items():
            spread = Spread.of(values)
            self.fields[key].update(
                **timing_fields(spread),
                compile_s=max(0.0, self.first_call.get(key, spread.median) - spread.median),
            )
        self._speedups(samples, set(samples))
        self._compiled_speedups(samples)
        return [(key, index, seconds) for key, values in samples.items() for index, seconds in enumerate(values)]

    def _speedups(self, samples: dict[str, list[float]], timed: set[str]) -> None:
        """Speedup of each timed cell against the group's baseline, round by round, with its order-statistic
        interval and that interval's coverage."""
        baseline = next((c.key() for c in self.group.cells if is_baseline(c, self.settings.baseline)), None)
        for key in timed:  # named even where it did not run: a report then says which baseline is missing
            self.fields[key]["baseline"] = self.settings.baseline
        if baseline is None or baseline not in timed:
            return
        for key in timed:
            interval = paired_speedup(samples[baseline], samples[key])
            self.fields[key].update(
                speedup=interval.estimate,
                speedup_low=interval.low,
                speedup_high=interval.high,
                speedup_coverage=interval.coverage,
            )

    def _compiled_speedups(self, samples: dict[str, list[float]]) -> None:
        """What compiling did to each compiled cell: its eager twin's time over its own, round by round."""
        for key, twin in self.group.eager_twins().items():
            if key in samples and twin in samples:
                interval = paired_speedup(samples[twin], samples[key])
                self.fields[key].update(
                    compiled_speedup=interval.estimate,
                    compiled_speedup_low=interval.low,
                    compiled_speedup_high=interval.high,
                )

    # ---- memory and cost ----------------------------------------------------------------------

    def _memory_and_cost(self, cell: Cell) -> None:
        key, variant = cell.key(), self.variants[cell.key()]
        cost = variant.cost(shape_of(cell))
        self.fields[key].update(flops=cost.flops, useful_flops=cost.needed_flops, bytes_moved=cost.bytes_moved)
        # on CPU compiled code runs under no dispatch mode: the allocator's peak alone, and no kept state (counted
        # by live tensors); CUDA's allocator gives both for any call
        tensors = self.device.type != "cpu" or (variant.cpu_memory_trackable and not cell.compiled)
        try:
            self.progress("memory", key)
            first = None  # a fresh instance's first call: the state it keeps
            if tensors:
                fresh = self.registry.create(cell.variant.name, seed=cell.seed, **dict(cell.variant.params))
                first = self._call(cell, call_of(fresh, cell.compiled))
            calls = self._call(cell, self.calls[key]), first
            memory = call_memory(*calls, self.device, inputs=self._held(), tensors=tensors)
            self.fields[key].update(
                peak_mem_bytes=memory.peak_bytes, state_mem_bytes=memory.state_bytes, mem_method=memory.method,
                tensor_mem_bytes=memory.tensor_peak_bytes,
            )
        except (Exception, SystemExit) as error:
            self._failed(key, error)
