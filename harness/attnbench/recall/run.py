"""Train a grid into its folder: the trainings that have no ok row yet, each row written as it ends; the grid as
resolved (grid.toml, what a resume reads back) and meta.json first. Shared by `attnbench recall` and `reproduce`."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from attnbench.plan.cells import spec_label
from attnbench.plan.config import toml_value
from attnbench.recall.execute import outcomes, row_of
from attnbench.recall.grid import MQARGrid, training_key
from attnbench.runfolder.trainings import TrainingsFolder, trained_keys

GRID_FILE = "grid.toml"  # the grid as resolved, in its folder: what --resume trains


def grid_toml(grid: MQARGrid) -> str:
    """The grid as resolved, as TOML (overrides applied, no shipped file needed to resume it)."""
    values = {
        "name": grid.name, "seq_lens": list(grid.seq_lens), "pairs": list(grid.pairs), "seeds": list(grid.seeds),
        **dict(grid.training), "variants": [{"name": v.name, **dict(v.params)} for v in grid.variants],
    }  # fmt: skip
    return "\n".join(f"{key} = {toml_value(value)}" for key, value in values.items()) + "\n"


def train_grid(
    grid: MQARGrid,
    folder: Path,
    *,
    jobs: int = 2,
    executor: str = "local",
    address: str | None = None,
    command: list[str] | None = None,
    say: Callable[[str], None] = lambda text: print(f"attnbench: {text}", file=sys.stderr),
) -> dict:
    """Train what of `grid` has no ok row in `folder` (RunFolderBusy when another process writes it); KeyboardInterrupt
    and RayUnavailable pass through with the finished rows kept. Returns the meta.json written."""
    specs = grid.specs()
    with TrainingsFolder(folder) as writer:
        done = trained_keys(folder)
        todo = [spec for spec in specs if training_key(spec) not in done]
        before, meta = writer.started_meta(
            command or ["attnbench", "recall", grid.name], left_out=list(grid.left_out),
            grid={"name": grid.name, **dict(grid.training)}, executor=executor, jobs=jobs,
        )  # fmt: skip
        writer.write_meta(meta)
        writer.write_text(GRID_FILE, grid_toml(grid))
        say(f"{len(todo)} trainings to run ({len(specs) - len(todo)} done already) -> {folder}/")
        for why in grid.left_out:
            say(f"left out: {why}")
        start = time.monotonic()
        for finished, outcome in enumerate(outcomes(todo, jobs=jobs, executor=executor, address=address, say=say), 1):
            writer.append(row_of(outcome))
            spec, result = outcome.spec, outcome.result
            what = f"{spec_label(spec.variant, spec.params)} N={spec.seq_len} P={spec.pairs} seed={spec.seed}"
            how = f"{result.accuracy:.1%} in {result.train_seconds:.1f} s" if result else f"FAILED: {outcome.reason}"
            say(f"[{finished}/{len(todo)}, {time.monotonic() - start:.0f} s] {what}: {how}")
        seconds = before.get("seconds", 0.0) + round(time.monotonic() - start, 1)  # every session's training time
        meta = {**meta, "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1)}
        writer.write_meta(meta)
    return meta
