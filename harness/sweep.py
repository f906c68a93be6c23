"""Run a sweep: for each cell, inputs -> self-check -> error -> timing -> memory -> one row, flushed.

A failure inside a cell (out of memory, an exception, a NaN output) becomes that cell's row and the
sweep goes on. Once a variant is over its time budget (or out of memory) at some N, its larger N are
skipped with that reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from attnbench.config import Cell, SweepConfig
from attnbench.conformance import TOLERANCE, exactness_error
from attnbench.inputs import Inputs, make_inputs
from attnbench.interface import AttentionVariant, Shape
from attnbench.machine import available_memory_bytes, machine_info, measure_peaks, retain_freed_memory
from attnbench.memory import peak_memory
from attnbench.metrics import error_metrics
from attnbench.reference import Reference, dropped_mass, exact_reference
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry
from attnbench.results import ResultsWriter, Row, read_results
from attnbench.timing import time_call
from tqdm import tqdm

GIB = 2**30
DROPPED_MASS_MAX_N = 4096  # the dropped mass needs the variant's dense (N, N) pattern


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    temporary = path.with_suffix(path.suffix + ".tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str))
    os.replace(temporary, path)


def new_run_dir(out_root: Path, name: str) -> Path:
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    candidate, suffix = out_root / stem, 1
    while candidate.exists():
        suffix += 1
        candidate = out_root / f"{stem}-{suffix}"
    candidate.mkdir(parents=True)
    return candidate


@dataclass
class SweepState:
    """What the sweep remembers between cells: current inputs and reference, budgets hit, self-checks done."""

    input_key: tuple | None = None
    inputs: Inputs | None = None
    reference: Reference | None = None
    over_budget: dict[tuple, str] = field(default_factory=dict)
    self_checks: dict[tuple, tuple[bool, str]] = field(default_factory=dict)


class Sweep:
    """Runs the cells of one config into one run directory."""

    def __init__(
        self,
        config: SweepConfig,
        run_dir: Path | None,
        *,
        registry: Registry = default_registry,
        progress: bool = True,
        isolate: bool = False,
    ) -> None:
        self.config = config
        self.run_dir = run_dir
        self.registry = registry
        self.progress = progress
        self.isolate = isolate
        self.state = SweepState()

    # ---- the run ------------------------------------------------------------------------------

    def run(self, resume: bool = False) -> Path:
        """Run every cell not yet in results.csv (all of them, unless resuming a killed run)."""
        assert self.run_dir is not None
        cells = self.config.cells()
        allocator = retain_freed_memory()  # every variant is timed warm, as CUDA's caching allocator would have it
        meta_path = self.run_dir / "meta.json"
        done = self._replay_finished(cells) if resume else set()
        if resume and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            meta.setdefault("resumed", []).append(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        else:
            meta = {
                "run_id": self.run_dir.name,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "config": self.config.to_dict(),
                "cells": len(cells),
                "machine": machine_info(self.config.device),
                "cpu_allocator": allocator,
                "peaks": self._measure_peaks(),
                "isolated": self.isolate,
            }
        write_json_atomic(meta_path, meta)
        todo = [cell for cell in cells if cell.key() not in done]
        with ResultsWriter(self.run_dir / "results.csv") as writer:
            bar = tqdm(todo, disable=not self.progress, unit="cell", dynamic_ncols=True)
            for cell in bar:
                bar.set_description(f"{cell.variant.label()[:32]} N={cell.seq_len}")
                row = self.run_isolated(cell) if self.isolate else self.run_cell(cell)
                self._note_budget(cell, row.status, row.time_median_s)
                writer.append(row)
        counts = read_results(self.run_dir).status.value_counts().to_dict()
        meta.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status_counts=counts)
        write_json_atomic(meta_path, meta)
        return self.run_dir

    def _replay_finished(self, cells: list[Cell]) -> set[str]:
        """Keys of the cells already recorded, their budget outcomes replayed so skips stay the same."""
        path = self.run_dir / "results.csv"
        if not path.exists():
            return set()
        finished = read_results(self.run_dir).set_index("cell_key")
        for cell in cells:
            if cell.key() in finished.index:
                row = finished.loc[cell.key()]
                self._note_budget(cell, row.status, row.time_median_s)
        return set(finished.index)

    def _note_budget(self, cell: Cell, status: str, median_s: float | None) -> None:
        """After a cell: over its time budget, out of memory, crashed or timed out, its larger N are skipped."""
        reason = None
        if status in ("oom", "crashed", "timeout"):
            reason = f"{'out of memory' if status == 'oom' else status} at N={cell.seq_len}"
        elif status == "ok" and median_s is not None and median_s > self.config.time_budget_s:
            reason = (
                f"{cell.variant.label()} took {median_s:.2f} s at N={cell.seq_len}, "
                f"over time_budget_s={self.config.time_budget_s:g}"
            )
        if reason is not None:
            self.state.over_budget.setdefault(cell.budget_key(), reason)

    def run_isolated(self, cell: Cell) -> Row:
        """The cell in its own process: a segfault, a hard out-of-memory kill or a hang marks only this cell."""
        budget = self.state.over_budget.get(cell.budget_key())  # the child does not know what earlier cells hit
        if budget is not None:
            return Row.for_cell(cell, status="skipped", reason=f"larger N skipped: {budget}")
        payload = json.dumps({"config": self.config.to_dict(), "cell": cell.key()})
        try:
            done = subprocess.run(
                [sys.executable, "-m", "attnbench.worker"],
                input=payload,
                capture_output=True,
                text=True,
                timeout=self.config.cell_timeout_s,
            )
        except subprocess.TimeoutExpired:
            return Row.for_cell(
                cell,
                status="timeout",
                reason=f"no result within cell_timeout_s="
                f"{self.config.cell_timeout_s:g} s; the cell's process was killed",
            )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            if done.returncode < 0:
                name = signal.Signals(-done.returncode).name
                why = f"killed by {name}" + (" (likely the system's out-of-memory killer)" if name == "SIGKILL" else "")
            else:
                why = f"exited with status {done.returncode}"
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            return Row.for_cell(cell, status="crashed", reason=f"the cell's process {why}: {tail}"[:500])
        return Row(**json.loads(lines[-1]))

    def _measure_peaks(self) -> dict[str, Any]:
        peaks = {}
        for device in self.config.device:
            for dtype in self.config.dtype:
                key = f"{device}/{dtype}"
                try:
                    peaks[key] = measure_peaks(device, getattr(torch, dtype))
                except Exception as error:  # e.g. cuda asked for on a machine without it: cells say so too
                    peaks[key] = {"error": f"{type(error).__name__}: {error}"}
        return peaks

    # ---- one cell -----------------------------------------------------------------------------

    def run_cell(self, cell: Cell) -> Row:
        """Measure one cell; every outcome, failures included, is a row."""
        try:
            variant = self.registry.create(cell.variant.name, seed=cell.seed, **dict(cell.variant.hparams))
        except Exception as error:
            return Row.for_cell(cell, status="error", reason=f"could not build the variant: {error}")
        row = Row.for_cell(cell, family=variant.family, exact=variant.exact)
        skip_reason = self._why_not_run(cell, variant)
        if skip_reason is not None:
            row.status, row.reason = skip_reason
            return row
        try:
            self._measure(cell, variant, row)
        except Exception as error:
            row.status = "oom" if is_out_of_memory(error) else "error"
            row.reason = f"{type(error).__name__}: {error}".strip()[:500]
            if row.status == "oom" and torch.device(cell.device).type == "cuda":
                torch.cuda.empty_cache()
        return row

    def _why_not_run(self, cell: Cell, variant: AttentionVariant) -> tuple[str, str] | None:
        device = torch.device(cell.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            return "unsupported", "CUDA is not available on this machine"
        reason = variant.unsupported_reason(
            device=cell.device,
            dtype=cell.dtype,
            causal=cell.causal,
            padded=cell.padding > 0,
            n_q=cell.seq_len,
            n_k=cell.seq_len,
            backward=cell.mode == "fwd+bwd",
        )
        if reason is not None:
            return "unsupported", reason
        budget = self.state.over_budget.get(cell.budget_key())
        if budget is not None:
            return "skipped", f"larger N skipped: {budget}"
        estimate = self._estimated_bytes(cell, variant)
        limit = self._memory_limit(cell.device)
        if estimate > limit:
            return "skipped", (
                f"estimated working memory {estimate / GIB:.1f} GiB exceeds the limit "
                f"{limit / GIB:.1f} GiB (set memory_limit_gb to change it)"
            )
        return None

    def _estimated_bytes(self, cell: Cell, variant: AttentionVariant) -> float:
        shape = self._shape(cell)
        working = variant.cost(shape).working_bytes
        inputs = 4 * cell.batch * cell.heads * cell.seq_len * cell.head_dim * shape.dtype_bytes
        return (2 if cell.mode == "fwd+bwd" else 1) * working + inputs

    def _memory_limit(self, device: str) -> float:
        if self.config.memory_limit_gb is not None:
            return self.config.memory_limit_gb * GIB
        return 0.8 * available_memory_bytes(device)

    @staticmethod
    def _shape(cell: Cell) -> Shape:
        itemsize = torch.empty((), dtype=getattr(torch, cell.dtype)).element_size()
        return Shape(
            cell.batch,
            cell.heads,
            cell.seq_len,
            cell.seq_len,
            cell.head_dim,
            cell.head_dim,
            causal=cell.causal,
            dtype_bytes=itemsize,
        )

    def _inputs_for(self, cell: Cell) -> Inputs:
        if self.state.input_key != cell.input_key():
            self.state.inputs = self.state.reference = None  # free the previous group first
            self.state.inputs = make_inputs(
                cell.input.name,
                dict(cell.input.params),
                batch=cell.batch,
                heads=cell.heads,
                seq_len=cell.seq_len,
                head_dim=cell.head_dim,
                dtype=getattr(torch, cell.dtype),
                device=torch.device(cell.device),
                seed=cell.seed,
                padding=cell.padding,
            )
            self.state.input_key = cell.input_key()
        assert self.state.inputs is not None
        return self.state.inputs

    def _reference_for(self, inputs: Inputs, cell: Cell) -> Reference:
        if self.state.reference is None:
            self.state.reference = exact_reference(
                inputs.q, inputs.k, inputs.v, causal=cell.causal, key_padding_mask=inputs.key_padding_mask
            )
        return self.state.reference

    def _self_check(self, cell: Cell, variant: AttentionVariant) -> tuple[bool, str]:
        """Exact variants against the dense reference of their own pattern at small N, once per run."""
        key = (cell.variant, cell.device, cell.dtype, cell.causal, cell.padding > 0)
        if key not in self.state.self_checks:
            dtype = getattr(torch, cell.dtype)
            error = exactness_error(
                variant,
                n=self.config.self_check_len,
                causal=cell.causal,
                padded=cell.padding > 0,
                device=torch.device(cell.device),
                dtype=dtype,
            )
            tolerance = max(TOLERANCE[dtype], 1e-5 if dtype == torch.float32 else 0.0)
            passed = error <= tolerance
            self.state.self_checks[key] = (
                passed,
                f"{'pass' if passed else 'FAIL'} (max err {error:.1e} at N={self.config.self_check_len})",
            )
        return self.state.self_checks[key]

    def _measure(self, cell: Cell, variant: AttentionVariant, row: Row) -> None:
        device = torch.device(cell.device)
        inputs = self._inputs_for(cell)
        mask = inputs.key_padding_mask
        if variant.exact and variant.support_mask(2, 2, cell.causal) is not None:
            passed, row.self_check = self._self_check(cell, variant)
            if not passed:
                row.status, row.reason = "error", f"self-check against its own support_mask failed: {row.self_check}"
                return

        with torch.no_grad():
            output = variant(inputs.q, inputs.k, inputs.v, causal=cell.causal, key_padding_mask=mask)
        if not torch.isfinite(output).all():
            row.status, row.reason = "error", "output has NaN or Inf"
            return
        if self.config.error:
            reference = self._reference_for(inputs, cell)
            for column, value in error_metrics(output, reference).as_row().items():
                setattr(row, column, value)
            row.input_entropy, row.input_band_mass = reference.entropy, reference.band_mass
            if variant.exact and variant.family != "exact" and cell.seq_len <= DROPPED_MASS_MAX_N:
                row.dropped_mass = dropped_mass(
                    inputs.q,
                    inputs.k,
                    variant.support_mask(cell.seq_len, cell.seq_len, cell.causal),
                    causal=cell.causal,
                    key_padding_mask=mask,
                )
        del output

        call, held = self._call(cell, variant, inputs)
        timing = time_call(call, device, min_run_time=self.config.min_run_time)
        row.time_median_s, row.time_iqr_s, row.time_repeats = timing.median_s, timing.iqr_s, timing.repeats
        if device.type == "cpu" and not variant.cpu_memory_trackable:
            row.mem_method = "not measured: compiled kernels allocate out of the CPU tracker's sight"
        else:
            row.peak_mem_bytes, row.mem_method = peak_memory(call, device, inputs=held)
        cost = variant.cost(self._shape(cell))
        row.flops, row.bytes_moved = cost.flops, cost.bytes_moved

    def _call(self, cell: Cell, variant: AttentionVariant, inputs: Inputs) -> tuple[Callable[[], Any], tuple]:
        """The timed callable for the cell's mode, and the tensors it holds that are not its own memory."""
        mask = inputs.key_padding_mask
        held = tuple(t for t in (inputs.q, inputs.k, inputs.v, mask) if t is not None)
        if cell.mode == "fwd":

            def forward() -> None:
                with torch.no_grad():
                    variant(inputs.q, inputs.k, inputs.v, causal=cell.causal, key_padding_mask=mask)

            return forward, held

        q, k, v = (t.detach().requires_grad_() for t in (inputs.q, inputs.k, inputs.v))
        generator = torch.Generator().manual_seed(cell.seed + 1)
        grad_out = torch.randn(inputs.v.shape, generator=generator).to(inputs.v)

        def forward_backward() -> tuple[torch.Tensor, ...]:
            out = variant(q, k, v, causal=cell.causal, key_padding_mask=mask)
            return torch.autograd.grad(out, (q, k, v), grad_out)

        grads = forward_backward()
        if not all(torch.isfinite(g).all() for g in grads):
            raise FloatingPointError("gradients have NaN or Inf")
        return forward_backward, (*held, q, k, v, grad_out)


def run_sweep(
    config: SweepConfig,
    out_root: Path = Path("results"),
    *,
    registry: Registry = default_registry,
    progress: bool = True,
    run_dir: Path | None = None,
    resume: bool = False,
    isolate: bool = False,
) -> Path:
    """Run every cell of `config` into a new folder under `out_root` (or `run_dir`); returns the folder.

    With `resume`, `run_dir` is an earlier run: only the cells missing from its results.csv run.
    """
    run_dir = run_dir or new_run_dir(out_root, config.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    return Sweep(config, run_dir, registry=registry, progress=progress, isolate=isolate).run(resume=resume)
