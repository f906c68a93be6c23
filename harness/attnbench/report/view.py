"""A run folder read once for what is shown of it: its rows, per-round samples and meta.json, and its verdict
computed once. The terminal's verdict, summary.md and the report all take this one view."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench.plan.budget import AccuracyBudget
from attnbench.report.analysis import of_roofline, raised_peaks, read_bandwidth
from attnbench.report.evidence import Evidence, evidence
from attnbench.report.verdict import InputVerdict, VerdictBlock, verdict_blocks, verdicts
from attnbench.runfolder.folder import read_samples
from attnbench.runfolder.meta import RunMeta
from attnbench.runfolder.results import RunFolderUnreadable, read_results
from attnbench.runfolder.tuning import read_tuning


@dataclass
class RunView:
    run_dir: Path
    frame: pd.DataFrame  # results.csv
    samples: dict[str, list[float]]  # cell key -> seconds per round (samples.csv)
    meta: RunMeta  # meta.json
    peaks: dict[str, dict]  # the run's measured peaks, raised to the fastest rate a cell reached (`raised_peaks`)
    verdicts: list[InputVerdict]  # per setting and input, N by N
    blocks: list[VerdictBlock]  # the verdicts as shown: those with the same content merged
    budget: AccuracyBudget  # what the verdict was judged with: the run's recorded budget, or `report`'s flags
    evidence: list[Evidence]  # per causal setting, which input answers at each N: real heads or `realistic`
    tuning: pd.DataFrame  # tuning.csv (`--tune`): every knob value probed, the picks timed; empty when not tuned

    @classmethod
    def read(
        cls,
        run_dir: Path,
        frame: pd.DataFrame | None = None,
        max_error: float | None = None,
        min_speedup: float | None = None,
        min_recall: float | None = None,
    ) -> RunView:
        """The view of `run_dir` (`frame`: its results.csv where the caller has read it already), each row with its
        share of the roofline (`of_roofline`) and a decode row with its achieved read bandwidth (`read_bandwidth`)
        at the run's peaks, judged with the accuracy budget the run recorded
        (`max_error`, `min_speedup`: `attnbench report`'s flags in its place, already checked)."""
        frame = read_results(run_dir) if frame is None else frame
        meta = RunMeta.read(run_dir)
        budget = AccuracyBudget.of_config(meta.config).with_flags(max_error, min_speedup, min_recall)
        if problems := budget.problems():  # a hand edit: the flags checked theirs before any work
            raise RunFolderUnreadable(f"{run_dir / 'meta.json'}: its config's budget is not one a run writes "
                                      f"({'; '.join(problems)}): restore it, or give --max-error")  # fmt: skip
        peaks, _ = raised_peaks(frame, meta.peaks)
        frame = frame.assign(of_roofline=of_roofline(frame, peaks), **read_bandwidth(frame, peaks))
        samples = read_samples(run_dir)
        found = verdicts(frame, samples, budget)
        return cls(run_dir, frame, samples, meta, peaks, found, verdict_blocks(found), budget,
                   evidence(frame, samples, budget, found), read_tuning(run_dir))  # fmt: skip
