"""Resume: a run continued from its folder — the config it was started with, validated again, its isolation,
and which of its cells are finished (a group a kill cut short counts as not done, whole)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnbench.plan.cells import Plan
from attnbench.plan.config import ConfigError, SweepConfig, load_config, parse_config
from attnbench.run.budgets import Budgets
from attnbench.runfolder.folder import RunFolder
from attnbench.runfolder.meta import RunMeta
from attnbench.runfolder.results import read_results, results_table_problem


def stored_config(run_dir: Path, overrides: dict[str, Any], cluster: bool = False) -> SweepConfig:
    """The config a run was started with, validated again: from its meta.json, or, where that is gone, from the
    config.toml every run writes beside it."""
    meta_path, stored = run_dir / "meta.json", run_dir / "config.toml"
    if not meta_path.is_file() and not stored.is_file():
        raise ConfigError(
            str(run_dir), ["not a run folder (no meta.json, no config.toml): --resume takes results/<run-id>"]
        )
    if overrides:
        raise ConfigError(str(run_dir), [f"--resume runs the stored config; drop {', '.join(overrides)}"])
    problem = results_table_problem(run_dir / "results.csv")
    if problem:
        raise ConfigError(str(run_dir), [problem])
    if not meta_path.is_file():
        return load_config(str(stored), cluster=cluster)
    config = RunMeta.read(run_dir).raw.get("config")
    if not isinstance(config, dict):
        raise ConfigError(str(meta_path), ["has no stored config: it is not the record of an attnbench run"])
    return parse_config(config, source=str(meta_path), cluster=cluster)


def stored_isolation(run_dir: Path | None) -> bool:
    """A resumed run keeps the isolation it was started with (a crashing variant must not take it down)."""
    if run_dir is None or not (run_dir / "meta.json").is_file():
        return False
    return RunMeta.read(run_dir).isolated


def finished_cells(folder: RunFolder, plan: Plan, budgets: Budgets) -> set[str]:
    """Keys of the cells a resumed run keeps, their budgets replayed. A group whose rows a kill cut short is
    measured again whole (with its baseline); every row and sample of a cell not done is forgotten first (a group
    cut short, or samples written with no rows before a full disk): a resume sees a group done or not, never half."""
    done: set[str] = set()
    if (folder.path / "results.csv").exists():
        finished = read_results(folder.path).drop_duplicates("cell_key", keep="last").set_index("cell_key")
        done = set(finished.index)
        half: set[str] = set()
        for group in plan.groups:
            keys = {cell.key() for cell in group.cells}
            if 0 < len(keys & done) < len(keys):
                half |= keys
        done -= half
        for cell in plan.cells:
            if cell.key() in done:
                row = finished.loc[cell.key()]
                budgets.note(cell, row["status"], row["time_median_s"], row.get("peak_mem_bytes"))
    folder.forget({cell.key() for cell in plan.cells} - done)
    return done
