"""`attnbench recall`: train Zoology's MQAR on tiny models with each variant as the sequence mixer, on this machine's
CPU (or on Ray), and report accuracy by N, pairs and state with intervals over seeds.

The grid is checked whole before any training; each training is appended to results/<id>/trainings.csv as it
ends, so `--resume DIR` (after a kill, or to add seeds) trains only what has no row yet; the report is rewritten at
the end (`--report DIR` rewrites it alone, e.g. with another `--min-recall`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench.commands.terminal import grid_table, resume_problem, terminal_width
from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `recall` verb: a grid (shipped or a file), overrides, where and how to train."""
    from attnbench.recall.grid import DEFAULT_GRID, grid_names

    recall = subparsers.add_parser(
        "recall",
        help="train multi-query associative recall (MQAR) with each variant as the mixer; accuracy by N and pairs",
        description="Train Zoology's MQAR task on 2-layer models (a short convolution and the variant as the "
        "sequence mixer) on CPU, for every variant × N × pairs × seed of a grid, and report test accuracy with a 95% "
        "interval over seeds, training time, and accuracy against the state each mixer keeps. Exit 0 when every "
        "training ran and the sanity checks hold, 1 when a training failed or a check does not hold, 2 for a bad "
        "grid or flag, 3 when no training ran ok, 130 when interrupted (the finished trainings are kept).",
        epilog=f"grids: {', '.join(grid_names())} (configs/recall/); the default {DEFAULT_GRID} took 585 s on 2 "
        "cores",
    )
    recall.add_argument("grid", nargs="?", default=None, help=f"a shipped grid or a TOML file (default: {DEFAULT_GRID})")
    recall.add_argument("--variants", help="comma-separated mixers replacing the grid's, as reports label them, e.g. "
                        "'full,band(window=16),linear,blind'")  # fmt: skip
    recall.add_argument("--seq-lens", help="comma-separated N replacing the grid's, e.g. 64,256")
    recall.add_argument("--pairs", help="comma-separated numbers of key-value pairs, e.g. 4,16,64")
    recall.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    recall.add_argument("--jobs", type=int, default=2, help="trainings at once on this machine, each in its own "
                        "process of `threads` threads (default 2)")  # fmt: skip
    recall.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="local: worker processes here; ray: each training a Ray task")  # fmt: skip
    recall.add_argument("--address", help="with --executor ray: a cluster's address (default: a local runtime)")
    recall.add_argument("--min-recall", type=float, default=None, metavar="R",
                        help="the verdict's bar: mean accuracy at least R at every number of pairs (default 0.9)")  # fmt: skip
    recall.add_argument("--out", type=Path, default=Path("results"), help="where the grid's folder goes (results/)")
    recall.add_argument("--resume", type=Path, metavar="DIR", help="continue the grid in DIR: train what has no row")
    recall.add_argument("--report", type=Path, metavar="DIR", help="only rewrite DIR's report (no training)")
    recall.add_argument("--dry-run", action="store_true", help="list the trainings and stop")
    recall.add_argument("--list", action="store_true", help="list the shipped grids")


def _names(text: str | None, kind: type) -> list | None:
    if text is None:
        return None
    try:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated {kind.__name__}s, got {text!r}") from None


def _settings(text: str | None) -> list | None:
    """`--variants` as a grid's `variants`: settings as reports label them (`band(window=16)`), `blind` by name."""
    if text is None:
        return None
    from attnbench.plan.cells import VariantSpec

    return [{"name": spec.name, **dict(spec.params)} for spec in VariantSpec.parse(text)] if text.strip(",").strip() else []


def main(args: argparse.Namespace) -> int:
    from attnbench.plan.config import ConfigError
    from attnbench.recall.grid import DEFAULT_GRID, grid_descriptions, read_grid
    from attnbench.recall.run import GRID_FILE
    from attnbench.report.mqar import DEFAULT_MIN_RECALL

    if args.list:
        print(grid_table(grid_descriptions(), "what it trains"))
        return Exit.OK
    min_recall = DEFAULT_MIN_RECALL if args.min_recall is None else args.min_recall
    problems = [] if 0 < min_recall <= 1 else [f"--min-recall: must be a share in (0, 1], got {min_recall!r}"]
    problems += [] if args.jobs >= 1 else [f"--jobs: must be >= 1, got {args.jobs}"]
    if args.address and args.executor != "ray":
        problems.append("--address names a Ray cluster: use it with --executor ray")
    if problems:
        print("\n".join(f"attnbench: {p}" for p in problems), file=sys.stderr)
        return Exit.USAGE
    if args.report is not None:
        return _report_only(args.report, min_recall)
    folder, grid_source = None, args.grid or DEFAULT_GRID
    if args.resume is not None:
        if (problem := resume_problem(args.resume, args.grid, GRID_FILE, "an MQAR grid")) is not None:
            print(f"attnbench: {problem}", file=sys.stderr)
            return Exit.USAGE
        folder, grid_source = args.resume, str(args.resume / GRID_FILE)
    try:
        overrides = dict(
            variants=_settings(args.variants), seq_lens=_names(args.seq_lens, int), pairs=_names(args.pairs, int),
            seeds=_names(args.seeds, int),
        )  # fmt: skip
        grid = read_grid(grid_source, **overrides)
    except ValueError as error:  # ConfigError lists every problem
        print(str(error) if isinstance(error, ConfigError) else f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    specs = grid.specs()
    if args.dry_run:
        from attnbench.plan.cells import spec_label
        from attnbench.recall.grid import training_key
        from attnbench.runfolder.trainings import trained_keys

        done = trained_keys(folder) if folder is not None else set()
        todo = [spec for spec in specs if training_key(spec) not in done]
        for spec in todo:
            print(f"{spec_label(spec.variant, spec.params)} N={spec.seq_len} pairs={spec.pairs} seed={spec.seed}")
        for why in grid.left_out:
            print(f"left out: {why}")
        print(f"total: {len(todo)} trainings" + (f" ({len(specs) - len(todo)} done already)" if done else ""))
        return Exit.OK
    return _train(args, grid, folder, min_recall)


def _train(args: argparse.Namespace, grid, folder: Path | None, min_recall: float) -> int:
    import signal

    from attnbench.recall.run import train_grid
    from attnbench.run.ray_executor import RayUnavailable
    from attnbench.runfolder.folder import RunFolderBusy, new_run_dir

    def stop(*_: object) -> None:  # SIGTERM as Ctrl-C: the workers are stopped, the finished rows kept
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    folder = folder or new_run_dir(args.out, grid.name if grid.name.startswith("mqar") else f"mqar-{grid.name}")
    try:
        meta = train_grid(grid, folder, jobs=args.jobs, executor=args.executor, address=args.address,
                          command=args.command_line)  # fmt: skip
    except (RunFolderBusy, RayUnavailable) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        print(f"attnbench: interrupted: the finished trainings are kept in {folder}/; continue with: "
              f"attnbench recall --resume {folder}", file=sys.stderr)  # fmt: skip
        return Exit.INTERRUPTED
    return _finish(folder, meta, min_recall)


def _finish(folder: Path, meta: dict, min_recall: float) -> int:
    """The report written and summed up (verdict, accuracy table, sanity checks); the exit status they give."""
    from attnbench.report.mqar import sanity, terminal_summary, write_mqar_report
    from attnbench.runfolder.trainings import read_trainings

    trainings = read_trainings(folder)
    report = write_mqar_report(folder, trainings, meta, min_recall)
    print(terminal_summary(trainings, min_recall, terminal_width()))
    checks = sanity(trainings)
    for check in checks:
        outcome = {True: "holds", False: "FAILS", None: "not checked"}[check.holds]
        print(f"sanity: {check.what}: {outcome} ({check.figures})")
    print(f"attnbench: {len(trainings)} training(s) in {folder}/ (trainings.csv, report.md, plots/); report: {report}",
          file=sys.stderr)  # fmt: skip
    if not (trainings.status == "ok").any():
        return Exit.NOTHING_RAN
    failed = (trainings.status != "ok").any() or any(check.holds is False for check in checks)
    return Exit.REGRESSION if failed else Exit.OK


def _report_only(folder: Path, min_recall: float) -> int:
    """--report DIR: the report again (another --min-recall), with the exit status a run would give."""
    from attnbench.runfolder.meta import read_meta
    from attnbench.runfolder.results import RunFolderUnreadable
    from attnbench.runfolder.trainings import read_trainings

    try:
        read_trainings(folder)
    except RunFolderUnreadable as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    return _finish(folder, read_meta(folder) if (folder / "meta.json").is_file() else {}, min_recall)
