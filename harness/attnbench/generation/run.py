"""Run a generation grid into its folder: the units with a row missing (or not ok), each unit's rows written as it
ends; the grid as resolved (grid.toml, what a resume reads back) and meta.json first. In this process, one unit
after another (the model loaded once), or each unit a Ray task (`--executor ray`). Before it runs, what it will
take (`grid_estimate`, for `attnbench generate --dry-run`): the grid's forward passes in FLOPs, at the speed of the
model's own forward pass timed here (on this machine's CPU when the placement's device is not here: a Ray cluster's
nodes bring the GPUs).

n - prompt tokens, t - tokens a row appends, c - positions a row attends to
"""

from __future__ import annotations

import heapq
import json
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from attnbench.generation.grid import GenerationGrid, Setting, Unit, row_key
from attnbench.generation.placement import Placement
from attnbench.generation.tasks import Sample
from attnbench.generation.unit import UnitJob, UnitOutcome, run_unit, setting_row, unit_samples
from attnbench.plan.config import toml_value
from attnbench.runfolder.generations import GenerationRow, GenerationsFolder, generated_keys

GRID_FILE = "grid.toml"  # the grid as resolved, in its folder: what --resume runs
THREADS = 2  # CPUs a unit takes (a Ray task asks for them; local workers share them)


def unit_threads(executor: str, workers: int) -> int:
    """torch's threads in a unit's worker: a Ray task's own CPUs, or this machine's shared by the local workers."""
    return THREADS if executor == "ray" else max(1, THREADS // workers)


def grid_toml(grid: GenerationGrid) -> str:
    """The grid as resolved (overrides applied), as TOML."""
    return "\n".join(f"{key} = {toml_value(value)}" for key, value in grid.raw.items()) + "\n"


def unit_keys(grid: GenerationGrid, unit: Unit) -> list[str]:
    """The keys of every row a unit writes (shares and method specs do not depend on the prompt's length)."""
    return [row_key(unit, sample, setting) for sample in unit.samples for setting in grid.settings(unit.seq_len, protocol=unit.protocol)]


def units_to_run(grid: GenerationGrid, done: set[str]) -> list[Unit]:
    return [unit for unit in grid.units() if not set(unit_keys(grid, unit)) <= done]


def missing_units(folder: Path) -> int | None:
    """How many units of the folder's grid (its grid.toml) have a row missing or not ok: 0 for a finished grid, None
    when its grid cannot be read any more (a user's task file moved): the rows are reported as they are."""
    from attnbench.generation.grid import read_grid
    from attnbench.plan.config import ConfigError

    if not (folder / GRID_FILE).is_file():
        return 0
    try:
        return len(units_to_run(read_grid(str(folder / GRID_FILE)), generated_keys(folder)))
    except ConfigError:
        return None


def run_on_node(job: UnitJob) -> UnitOutcome:
    """A Ray task: one unit on the node Ray chose, naming it."""
    import ray

    outcome = run_unit(job)
    outcome.node = ray.get_runtime_context().get_node_id()[:8]
    for row in outcome.rows:
        row.node, row.host = outcome.node, ""
    return outcome


def outcomes(jobs: list[UnitJob], executor: str, workers: int, address: str | None,
             say: Callable[[str], None]) -> Iterator[UnitOutcome]:  # fmt: skip
    """The units' outcomes as they end: Ray tasks, `workers` processes here, or one after another in this process."""
    failed = lambda job, why: UnitOutcome(job, reason=why)  # noqa: E731
    if executor == "ray":
        from attnbench.run.ray_executor import tasks_on_ray

        return tasks_on_ray(jobs, run_on_node, cpus=lambda job: job.threads, failed=failed, address=address, say=say,
                            gpus=lambda job: int(job.placement.device == "cuda"))  # fmt: skip
    if workers > 1 and len(jobs) > 1:
        from attnbench.run.worker_pool import in_worker_processes

        return in_worker_processes(jobs, run_unit, jobs=workers, key=lambda job: job.unit.name(), failed=failed)
    return (run_unit(job) for job in jobs)


def failed_rows(grid: GenerationGrid, outcome: UnitOutcome) -> list[GenerationRow]:
    """A unit that failed whole: an error row for each of its rows, with the reason."""
    unit, host = outcome.job.unit, socket.gethostname() if not outcome.node else ""
    return [setting_row(unit, sample, setting, status="error", reason=outcome.reason, host=host, node=outcome.node)
            for sample in unit.samples for setting in grid.settings(unit.seq_len, protocol=unit.protocol)]  # fmt: skip


def model_layout(model_dir: Path) -> str | None:
    """The model's hybrid layout in words (`layer_kinds.layout_text`; None without sliding layers or a config)."""
    from attnbench.model.layer_kinds import layout_text

    try:
        return layout_text(json.loads((model_dir / "config.json").read_text()))
    except (OSError, ValueError):
        return None


def run_grid(
    grid: GenerationGrid,
    folder: Path,
    model_dir: Path,
    *,
    executor: str = "local",
    workers: int = 1,
    address: str | None = None,
    command: list[str] | None = None,
    placement: Placement = Placement(),
    say: Callable[[str], None] = lambda text: print(f"attnbench: {text}", file=sys.stderr),
) -> dict:
    """Run what of `grid` has no ok row in `folder` (RunFolderBusy when another process writes it) on the placement's
    device and dtype (recorded in meta.json); KeyboardInterrupt and RayUnavailable pass through with the finished
    units' rows kept. Returns the meta.json written."""
    with GenerationsFolder(folder) as writer:
        done = generated_keys(folder)
        todo = units_to_run(grid, done)
        before, meta = writer.started_meta(command or ["attnbench", "generate", grid.name], model_dir=str(model_dir),
                                           grid=grid.name, executor=executor, workers=workers,
                                           device=placement.device, dtype=placement.dtype,
                                           layers=model_layout(model_dir))  # fmt: skip
        writer.write_meta(meta)
        if meta.get("layers"):
            say(f"{model_dir.name}: {meta['layers']}")
        writer.write_text(GRID_FILE, grid_toml(grid))
        total = len(grid.units())
        say(f"{len(todo)} of {total} units to run ({total - len(todo)} done already), "
            f"{len(grid.settings(grid.seq_lens[0]))} method settings each -> {folder}/")  # fmt: skip
        start = time.monotonic()
        threads = unit_threads(executor, workers)
        jobs = [UnitJob(grid, unit, str(model_dir), threads, placement) for unit in todo]
        phases = dict(before.get("phases", {}))
        for finished, outcome in enumerate(outcomes(jobs, executor, workers, address, say), 1):
            for phase, seconds in outcome.phases.items():
                phases[phase] = round(phases.get(phase, 0.0) + seconds, 3)
            rows = outcome.rows if not outcome.reason else failed_rows(grid, outcome)
            for row in rows:
                if row.key not in done:
                    writer.append(row)
            elapsed = time.monotonic() - start
            left = elapsed / finished * (len(todo) - finished)
            say(f"[{finished}/{len(todo)} units, {elapsed:.0f} s, ~{left:.0f} s left] {outcome.job.unit.name()}: "
                + (f"FAILED: {outcome.reason}" if outcome.reason else summary(outcome.rows)))  # fmt: skip
        seconds = before.get("seconds", 0.0) + round(time.monotonic() - start, 1)
        meta = {**meta, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1), "phases": phases}
        writer.write_meta(meta)
    if phases:
        say(phase_breakdown(phases))
    return meta


def phase_breakdown(phases: dict[str, float]) -> str:
    """One line: the seconds spent in each phase over the units (summed over workers), and each one's share."""
    total = sum(phases.values()) or 1.0
    parts = ", ".join(f"{name} {seconds:.0f} s ({seconds / total:.0%})" for name, seconds in phases.items() if seconds)
    return f"time by phase (summed over units): {parts}"


def summary(rows: list[GenerationRow]) -> str:
    """A progress line's figures: the exact model's score, and how many rows failed."""
    exact = [r for r in rows if r.variant == "full" and not r.quantize and r.status == "ok"]
    errors = sum(r.status != "ok" for r in rows)
    scores = [r.score for r in exact if r.score is not None]
    text = f"exact model {sum(scores) / len(scores):.0%}" if scores else "continuation"
    return text + (f", {errors} rows failed" if errors else "")


# ---- what a grid will take, before it runs ------------------------------------------------------------------------

CALIBRATION_TOKENS = 256  # the prompt the model's speed is timed on: long enough for its matmuls to reach speed


@dataclass(frozen=True)
class ModelFlops:
    """A causal LM's forward pass in FLOPs, from its config.json: per token through the weights (projections and
    MLP), per (query, key) pair in attention (scores and values, every head and layer), per token's logits."""

    per_token: float
    per_pair: float
    per_logits: float

    @classmethod
    def of(cls, config: dict[str, Any]) -> "ModelFlops":
        layers, hidden = config.get("num_hidden_layers", 1), config.get("hidden_size", 1)
        heads = config.get("num_attention_heads", 1)
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or hidden // heads
        mlp = config.get("intermediate_size", 4 * hidden)
        weights = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * mlp  # q, o; k, v
        return cls(2 * layers * weights, 4 * layers * heads * head_dim, 2 * hidden * config.get("vocab_size", 0))

    def prompt(self, n: int) -> float:
        """n tokens in one causal pass, the last position's logits read out."""
        return n * self.per_token + self.per_pair * n * n / 2 + self.per_logits

    def appended(self, t: int, c: float, logits: int) -> float:
        """t tokens of one row after the c positions it attends to, `logits` of them read out."""
        return t * self.per_token + self.per_pair * t * (c + t / 2) + logits * self.per_logits


def sample_flops(flops: ModelFlops, sample: Sample, settings: list[Setting], aware: bool) -> tuple[float, float]:
    """One sample's forward passes as `decoder.InModelDecoder.run` makes them, every setting a row: the exact prompt
    once (and H2O's pass over its scores), each own prefill, then each row's question, its continuation (teacher
    forced) or its answer. A row attends to its share of the prompt. The answer is a range: it ends at its first
    token (low) or runs to its budget (high)."""
    n = len(sample.context) + (len(sample.question) if aware else 0)
    question = 0 if aware else len(sample.question)
    own = sum(s.method.prefill != "dense" for s in settings)  # the rest share the exact prompt (full is always dense)
    fixed = flops.prompt(n) * (1 + own)
    fixed += flops.per_pair * n * n / 2 if any(s.method.variant.name == "h2o" for s in settings) else 0.0
    answer_steps = max(0, sample.answer_tokens - 1) if sample.answers else 0  # its first token comes with the question
    step = 0.0
    for setting in settings:
        c = n * (setting.share or 1.0)
        fixed += flops.appended(question, c, 1) if question else 0.0
        forced = len(sample.continuation) - 1  # the first forced token is scored on the question's logits
        fixed += flops.appended(forced, c + question, forced) if forced > 0 else 0.0
        step += flops.appended(1, c + question, 1)
    return fixed, fixed + answer_steps * step


@dataclass(frozen=True)
class GridEstimate:
    """What a grid will take on this machine: its wall time as a range (answers ending at once, or at their
    budgets), and what that rests on."""

    low_s: float
    high_s: float
    flops_per_s: float  # the model's forward pass, timed here over CALIBRATION_TOKENS
    load_s: float  # loading the model, once per worker
    threads: int  # torch's threads per worker
    workers: int
    timed_on: Placement = Placement()  # where the speed was timed: the grid's placement, or this machine's CPU


def timing_placement(placement: Placement) -> tuple[Placement, str | None]:
    """Where the estimate can time the model here: the placement itself, or, when its device is not on this machine
    (a Ray cluster's nodes bring the GPUs), this machine's CPU in the same dtype, with the line that says so."""
    from attnbench.generation.placement import cuda_problem

    if cuda_problem(placement) is None:
        return placement, None
    cpu = Placement("cpu", placement.dtype)
    return cpu, (f"{placement.device} is not available here (the units run on the cluster's nodes): the estimate "
                 f"below is of this machine's CPU, the model timed on it in {cpu.dtype}, not of the nodes' "
                 f"{placement.device} devices")  # fmt: skip


def model_speed(model_dir: Path, threads: int, vocabulary: int, flops: ModelFlops,
                placement: Placement = Placement()) -> tuple[float, float]:  # fmt: skip
    """(FLOPs per second of the model's forward pass at `threads` on the placement's device and dtype, the seconds
    loading it there took): a prompt of CALIBRATION_TOKENS timed twice after a short warm-up, the faster kept (a
    shared machine's busy moment is noise)."""
    import torch

    from attnbench.model.study import load_model

    started = time.perf_counter()
    model = placement.place(load_model(model_dir)[0])
    placement.synchronize()
    load_s = time.perf_counter() - started
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ids = torch.randint(0, vocabulary, (1, CALIBRATION_TOKENS), generator=torch.Generator().manual_seed(0))
        ids = ids.to(placement.device)
        seconds = []
        with torch.no_grad():
            for prompt in (ids[:, :16], ids, ids):
                started = time.perf_counter()
                model(input_ids=prompt, use_cache=False, logits_to_keep=1)
                placement.synchronize()
                seconds.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(before)
    return flops.prompt(CALIBRATION_TOKENS) / min(seconds[1:]), load_s


def finish_time(durations: list[float], workers: int, start_s: float) -> float:
    """When the last of units taking `durations` ends, handed in order to whichever of `workers` is free first, each
    worker starting after `start_s` (its model's loading)."""
    free = [start_s] * max(1, min(workers, len(durations)))
    for seconds in durations:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free)


def grid_estimate(grid: GenerationGrid, units: list[Unit], model_dir: Path, tokenizer: Any, *, executor: str,
                  workers: int, placement: Placement = Placement(),
                  say: Callable[[str], None] = lambda text: print(f"attnbench: {text}", file=sys.stderr),
                  ) -> GridEstimate:  # fmt: skip
    """`units` of `grid` on this machine: their samples built (the tokenizer's lengths), their FLOPs at the model's
    speed timed now with a worker's threads on the placement's device (this machine's CPU where that device is not
    here, `say`ing so), shared out over the workers (a Ray run: one unit at a time here)."""
    config = json.loads((model_dir / "config.json").read_text())
    flops = ModelFlops.of(config)
    workers = 1 if executor == "ray" else workers
    threads = unit_threads(executor, workers)
    timed_on, why = timing_placement(placement)
    if why is not None:
        say(why)
    speed, load_s = model_speed(model_dir, threads, config.get("vocab_size", 1), flops, timed_on)
    low, high = [], []
    for unit in units:
        samples = unit_samples(grid, unit, tokenizer)
        settings = grid.settings(unit.seq_len, protocol=unit.protocol)  # the shares a row keeps (its hyperparameters do not change its FLOPs)
        ranges = [sample_flops(flops, sample, settings, unit.protocol == "question-aware") for sample in samples]
        low.append(sum(r[0] for r in ranges) / speed)
        high.append(sum(r[1] for r in ranges) / speed)
    return GridEstimate(finish_time(low, workers, load_s), finish_time(high, workers, load_s), speed, load_s,
                        threads, workers, timed_on)  # fmt: skip
