"""`attnbench compare`: two run folders cell by cell, time ratios B / A with bootstrap intervals and a verdict
per cell; with --fail-above, a gate for CI."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from attnbench.commands.arguments import run_folder
from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `compare` verb: run folders A and B, the gate's threshold and margin, what is compared."""
    compare = subparsers.add_parser(
        "compare",
        help="compare two runs cell by cell, deciding from their timing samples (bootstrap intervals)",
        description="Compare two run folders cell by cell: time ratios B / A with bootstrap intervals and verdicts.",
        epilog="exit status: 0 no regression; 1 a regression (with --fail-above: a cell slower beyond PCT, or a "
        "cell ok in A that is not ok in B); 2 usage (e.g. not a run folder); 4 with --fail-above: no regression, "
        "but some cells inconclusive (the message says how many)",
    )
    compare.add_argument("run_a", type=Path, help="run folder A, the reference")
    compare.add_argument("run_b", type=Path, help="run folder B, compared against A")
    compare.add_argument(
        "--fail-above",
        type=float,
        metavar="PCT",
        help="exit 1 if a cell is slower by more than PCT percent (its whole 95%% interval beyond PCT) or a cell ok "
        "in A is not ok in B, 4 if none is but some cells are inconclusive (for CI); without it the verdicts use 5%%",
    )
    compare.add_argument(
        "--margin",
        type=float,
        metavar="PCT",
        help="'same' only when a cell's whole interval lies within ±PCT percent (default: the threshold)",
    )
    compare.add_argument(
        "--measure",
        choices=["auto", "speedup", "time"],
        default="auto",
        help="auto (default): each cell's in-turn speedup against its baseline where both runs have one (whole-run "
        "shifts of the machine cancel), else its time; speedup: only cells with both speedups; time: absolute "
        "median times (only comparable on one machine, quiet both times)",
    )
    compare.add_argument("--speedups", action="store_true", help="the same as --measure speedup")


def main(args: argparse.Namespace) -> int:
    """Both folders and the percentages checked, the comparison printed; with --fail-above, exit 1 on a regression
    and 4 when nothing is known to hold."""
    from attnbench.report.compare import DEFAULT_THRESHOLD, compare_runs, format_comparison
    from attnbench.runfolder.folder import being_written

    for run in (args.run_a, args.run_b):  # first: a run just started has no results.csv yet
        if (holder := being_written(run)) is not None:
            print(f"attnbench: {run} is still being written ({holder}): compare it once the run ends", file=sys.stderr)
            return Exit.USAGE
    if run_folder(args.run_a) is None or run_folder(args.run_b) is None:
        return Exit.USAGE
    if args.fail_above is not None and not 0 <= args.fail_above < math.inf:
        print(f"attnbench: --fail-above must be a finite percentage >= 0, got {args.fail_above:g}", file=sys.stderr)
        return Exit.USAGE
    if args.margin is not None and not 0 <= args.margin < math.inf:
        print(f"attnbench: --margin must be a finite percentage >= 0, got {args.margin:g}", file=sys.stderr)
        return Exit.USAGE
    threshold = DEFAULT_THRESHOLD if args.fail_above is None else args.fail_above / 100
    margin = None if args.margin is None else args.margin / 100
    measure = "speedup" if args.speedups else args.measure
    try:
        result = compare_runs(args.run_a, args.run_b, threshold=threshold, margin=margin, measure=measure)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError) as error:  # pandas' parser errors are ValueErrors
        print(f"attnbench: a run folder is unreadable: {type(error).__name__}: {error}", file=sys.stderr)
        return Exit.USAGE
    print(format_comparison(result, args.run_a, args.run_b))
    if result.table.empty and result.broken.empty:
        print("attnbench: the two runs have no cell in common that ran ok in both", file=sys.stderr)
        if args.fail_above is not None:  # a gate that compared nothing has not passed
            print("attnbench: --fail-above: nothing was compared, so nothing is known to hold", file=sys.stderr)
            return Exit.INCONCLUSIVE
    if args.fail_above is not None:
        slower, broken = len(result.regressions()), len(result.broken)
        if slower or broken:
            print(
                f"attnbench: regression: {slower} cell(s) slower by more than {args.fail_above:g}% (the whole 95% "
                f"interval beyond it), {broken} cell(s) no longer ok",
                file=sys.stderr,
            )
            return Exit.REGRESSION
        if result.inconclusive():
            print(
                f"attnbench: no regression found, but {result.inconclusive()} of {len(result.table)} cell(s) are "
                "inconclusive (their verdicts say why): this gate could not judge them; where an interval was too "
                "wide, more rounds (min_run_time) or a quieter machine narrow it",
                file=sys.stderr,
            )
            return Exit.INCONCLUSIVE
    return Exit.OK
