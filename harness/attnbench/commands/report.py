"""`attnbench report`: (re)build a run folder's summary.md, report.md, report.html and plots/ from its results.csv
and meta.json, under the run's accuracy budget or one given here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench.commands.arguments import add_budget_flags, run_folder
from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `report` verb: a run folder, and the budget flags that override the one it recorded."""
    report = subparsers.add_parser(
        "report",
        help="(re)build report.md, report.html and plots/ for a run folder",
        description="Rebuild a run folder's report from its results.csv and meta.json.",
    )
    report.add_argument("run_dir", type=Path, help="a run folder, results/<run-id>")
    add_budget_flags(report, "default: the budget the run recorded, else ")


def main(args: argparse.Namespace) -> int:
    """The budget checked, then the folder read once and its summary and report rewritten; Exit.NOTHING_RAN when no
    cell ran ok, Exit.UNFINISHED when the run lacks some of its planned cells (every view says which)."""
    from attnbench.commands.terminal import terminal_width
    from attnbench.plan.budget import budget_problems
    from attnbench.report.run_report import write_report
    from attnbench.report.summary import terminal_answer, write_summary
    from attnbench.report.evidence import unfinished
    from attnbench.report.view import RunView
    from attnbench.runfolder.results import read_results

    problems = budget_problems(
        args.max_error, args.min_speedup, lambda key: "--" + key.replace("_", "-"), args.min_recall
    )
    if problems:  # before the folder is read
        print("\n".join(f"attnbench: {problem}" for problem in problems), file=sys.stderr)
        return Exit.USAGE
    started = (args.run_dir / "meta.json").is_file() and not (args.run_dir / "results.csv").exists()
    if not started and run_folder(args.run_dir) is None:
        return Exit.USAGE
    frame = None if started else read_results(args.run_dir)  # None: a run stopped before its first cell ended
    if frame is None or frame.empty:
        print(
            f"attnbench: {args.run_dir} has no finished cell (the run stopped before its first group ended): no report "
            f"written; continue it with: attnbench run --resume {args.run_dir}",
            file=sys.stderr,
        )
        return Exit.NOTHING_RAN
    try:
        if args.min_recall is not None and not frame.input.astype(str).str.startswith("needles").any():
            print(f"attnbench: --min-recall: {args.run_dir} has no `needles` input, so no recall to judge: run one "
                  "with [[inputs]] name = \"needles\"", file=sys.stderr)  # fmt: skip
            return Exit.USAGE
        view = RunView.read(args.run_dir, frame, args.max_error, args.min_speedup, args.min_recall)
        lacking = unfinished(args.run_dir, view.meta, view.frame)
        print(terminal_answer(view, lacking, terminal_width()))  # the verdict judged again, as `run` prints it
        write_summary(args.run_dir, view)  # the tables too: a run whose disk filled up before them gets them here
        report = write_report(args.run_dir, view)
    except OSError as error:
        error.add_note(f"the run's results are untouched; make room (or make it writable), then run again: "
                       f"attnbench report {args.run_dir}")  # fmt: skip
        raise
    print(f"attnbench: wrote summary.md, report.md and plots/; report: {report}")
    if not (frame.status == "ok").any():
        print(
            f"attnbench: no cell ran ok in this run ({', '.join(sorted(set(frame.status)))}): the report gives the "
            "reasons",
            file=sys.stderr,
        )
        return Exit.NOTHING_RAN
    if lacking is not None:
        print(f"attnbench: unfinished run: {lacking.recorded} of {lacking.planned} planned cells recorded (the lines "
              f"above the verdict, summary.md and report.md say which are missing); measure them with: {lacking.resume}", file=sys.stderr)  # fmt: skip
        return Exit.UNFINISHED
    return Exit.OK
