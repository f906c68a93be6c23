"""Run a grid's trainings and hand each one's row to the writer as it ends: in this process, in `jobs` worker
processes on this machine, or as Ray tasks (one training each, `threads` CPUs each) on a local runtime or a cluster.

A training that raises is its own `error` row and the grid goes on; a worker process that dies (a segfault, the
OOM killer) costs the trainings it held, recorded `error` with that reason. The caller writes the rows, so a kill
loses only the trainings in flight, and a resume trains what has no row yet.
"""

from __future__ import annotations

import json
import math
import socket
from dataclasses import dataclass
from typing import Callable, Iterator

from attnbench.plan.cells import spec_label
from attnbench.recall.grid import training_key
from attnbench.recall.model import CONV_KERNEL
from attnbench.recall.mqar import within_reach
from attnbench.recall.train import TrainResult, TrainSpec, train_mqar
from attnbench.runfolder.trainings import TrainingRow


@dataclass(frozen=True)
class Outcome:
    """One training's end: its result, or why it has none."""

    spec: TrainSpec
    result: TrainResult | None
    reason: str = ""
    node: str = ""


def train_safely(spec: TrainSpec) -> Outcome:
    """`train_mqar`, its exception turned into the training's reason (what a worker returns)."""
    try:
        return Outcome(spec, train_mqar(spec))
    except Exception as error:
        return Outcome(spec, None, f"{type(error).__name__}: {error}")


def chance_of(spec: TrainSpec) -> float:
    """What a model whose mixer sees nothing scores: a guess among the value tokens, plus the queries whose key its
    two short convolutions reach (2 (kernel - 1) positions back)."""
    return 1 / len(spec.task.values) + within_reach(spec.task, spec.layers * (CONV_KERNEL - 1))


def row_of(outcome: Outcome) -> TrainingRow:
    """The trainings.csv row of one outcome."""
    spec, result = outcome.spec, outcome.result
    base = dict(
        key=training_key(spec),
        label=spec_label(spec.variant, spec.params),
        variant=spec.variant,
        hparams=json.dumps(dict(spec.params), sort_keys=True),
        seq_len=spec.seq_len,
        pairs=spec.pairs,
        seed=spec.seed,
        d_model=spec.d_model,
        vocab=spec.task.vocab,
        chance=chance_of(spec),
        host=socket.gethostname() if not outcome.node else "",
        node=outcome.node,
        threads=spec.threads,
    )
    if result is None:
        return TrainingRow(**base, status="error", reason=outcome.reason)
    diverged = not math.isfinite(result.final_loss)
    return TrainingRow(
        **base,
        status="error" if diverged else "ok",
        reason=f"the training diverged (loss {result.final_loss}) after {result.steps} steps: lower lr" if diverged else "",
        accuracy=result.accuracy,
        queries=result.queries,
        train_accuracy=result.train_accuracy,
        train_seconds=result.train_seconds,
        steps=result.steps,
        final_loss=result.final_loss,
        parameters=result.parameters,
        state_bytes=result.state_bytes,
    )


def in_process(specs: list[TrainSpec]) -> Iterator[Outcome]:
    for spec in specs:
        yield train_safely(spec)


def in_workers(specs: list[TrainSpec], jobs: int) -> Iterator[Outcome]:
    """`jobs` worker processes (spawned: a fresh torch each), the outcomes in the order they end; a worker that dies
    costs the trainings it may have held (`attnbench.run.worker_pool.in_worker_processes`)."""
    from attnbench.run.worker_pool import in_worker_processes

    return in_worker_processes(
        specs, train_safely, jobs=jobs, key=training_key, failed=lambda spec, why: Outcome(spec, None, why)
    )


def train_on_node(spec: TrainSpec) -> Outcome:
    """A Ray task: one training on the node Ray chose, naming it."""
    import ray

    outcome = train_safely(spec)
    return Outcome(outcome.spec, outcome.result, outcome.reason, node=ray.get_runtime_context().get_node_id()[:8])


def on_ray(specs: list[TrainSpec], address: str | None, say: Callable[[str], None]) -> Iterator[Outcome]:
    """Each training a Ray task asking for its `threads` CPUs; a local runtime started here is stopped at the end."""
    from attnbench.run.ray_executor import tasks_on_ray

    return tasks_on_ray(
        specs, train_on_node, cpus=lambda spec: spec.threads, failed=lambda spec, why: Outcome(spec, None, why),
        address=address, say=say,
    )  # fmt: skip


def outcomes(
    specs: list[TrainSpec], *, jobs: int, executor: str, address: str | None, say: Callable[[str], None]
) -> Iterator[Outcome]:
    """The trainings' outcomes as they end, from the executor asked for."""
    if executor == "ray":
        return on_ray(specs, address, say)
    if jobs <= 1 or len(specs) <= 1:
        return in_process(specs)
    return in_workers(specs, jobs)
