"""`attnbench run`: its arguments, then the run: the config and its overrides checked, the plan made (or only
shown with --dry-run), every cell measured, then the verdict, the summary and the report."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

from attnbench.commands.arguments import EXAMPLES, add_budget_flags, comma_separated, true_false_both
from attnbench.commands.terminal import terminal_width
from attnbench.exit_status import Exit
from attnbench.inputs.catalogue import DISTRIBUTIONS
from attnbench.plan.cells import Plan, compiled_label
from attnbench.plan.config import ConfigError, SweepConfig, flag_text, load_config, preset_names
from attnbench.registry import registry


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `run` verb: a preset or TOML file, the flags that override its axes and settings, where and how to run."""
    run = subparsers.add_parser(
        "run",
        help="run a sweep and print a summary table",
        description="Validate the whole plan, then measure every cell: time (in turns per group), memory, error.",
        epilog=f"presets: {', '.join(preset_names())}\n\n" + EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "config",
        nargs="?",
        default=None,  # quick; None tells that none was given (--resume takes none)
        help=f"a preset ({', '.join(preset_names())}) or a TOML file (default: quick)",
    )
    run.add_argument(
        "--variants",
        help="comma-separated variant settings, as reports label them: a name keeps the config's grid for it, "
        "NAME(key=value, ...) is that one setting, e.g. 'band(window=64),band(window=128),full'",
    )
    run.add_argument(
        "--inputs",
        help="comma-separated inputs in the same syntax, NAME or NAME(key=value, ...); they replace the config's "
        "[[inputs]] list, e.g. 'heads(text=code),realistic' or "
        "'captured(path=real.pt, layer=[4,16]),needles(pairs=16)' (inputs: " + ", ".join(DISTRIBUTIONS) + ")",
    )
    run.add_argument("--seq-lens", type=comma_separated(int), help="comma-separated sequence lengths, e.g. 1024,4096")
    run.add_argument("--device", type=comma_separated(str), help="cpu, cuda or cuda:N (comma-separated for several)")
    run.add_argument("--dtype", type=comma_separated(str), help="float32, float16, bfloat16 or float64")
    run.add_argument("--causal", type=true_false_both, help="true, false or both")
    compiling = run.add_mutually_exclusive_group()
    compiling.add_argument(
        "--compile",
        action="store_const",
        const=[False, True],
        help="each variant setting eager and under torch.compile, timed in turns (the config's `compile = [false, "
        "true]`); compilation time is kept apart in compile_s. In --mode decode: each step eager and fused (one call "
        "of attnbench's C kernels) instead",
    )
    compiling.add_argument(
        "--compile-only",
        dest="compile",
        action="store_const",
        const=[True],
        help="each variant setting under torch.compile alone (`compile = true`; the baseline is then `full compiled`)",
    )
    run.add_argument(
        "--mode",
        type=comma_separated(str),
        help="fwd, fwd+bwd (comma-separated for both), or decode: a prompt of N, then tokens generated one at a time "
        "against each variant's cache or state (causal; time per token, cache bytes, error per step)",
    )
    run.add_argument(
        "--decode-steps",
        type=int,
        metavar="T",
        help="mode decode: tokens generated after each prompt, checked and timed (default: the config's "
        "`decode_steps`, 16)",
    )
    run.add_argument(
        "--no-error",
        action="store_true",
        help="time and memory only: no float64 exact reference and no error (`error = false`; needle recall, which "
        "needs no reference, is still measured); every input is timed; what a cell too big for the reference's memory "
        "still measures",
    )
    run.add_argument("--seeds", type=comma_separated(int), help="comma-separated seeds")
    run.add_argument("--threads", type=int, help="torch threads (default: the config's `threads`; 0 = as many as the "
                     "cores other processes leave idle, fitted before each timed group and recorded)")
    run.add_argument(
        "--processes",
        type=int,
        metavar="K",
        help="measure each group in K fresh worker processes, one after another, each timing min_run_time / K: the "
        "spread between processes enters every speedup interval (default: the config's `processes`, 1)",
    )
    add_budget_flags(run, "default: the config's `max_error`, else ")
    run.add_argument("--out", type=Path, default=Path("results"), help="folder for run folders (default: results)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-report", action="store_true", help="skip report.md / report.html / plots at the end")
    run.add_argument(
        "--tune",
        action="store_true",
        help="after the sweep, search each family's key knob (band's window, topk's top_k, h2o's and snapkv's budget, "
        "lsh's bucket_size, performer's features, ...) at each N by bisection for the fastest setting within the "
        "error budget, on the inputs the verdict follows (real heads where the run has them), and time the picks in "
        "turns with the baseline: 'Use band(sinks=4, window=W): S× at error E' (tuning.csv, and the knob's curve in "
        "the report)",
    )
    run.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue a killed run: its stored config, only the cells missing from its results.csv",
    )
    run.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: groups one after another on this machine (default); ray: each group a Ray task, on a local "
        "Ray runtime or the cluster at --address (Ray: pip install -e '.[ray]' in the attnbench checkout)",
    )
    run.add_argument(
        "--address", help="with --executor ray: a running Ray cluster to join: auto (the one on this node) or HOST:PORT"
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan and stop: each group's cells, the cells the memory and time guard would skip and "
        "why, estimated peak memory and time (lower bounds from this machine's measured peaks), the total; with "
        "--tune, the groups its search adds and their time apart",
    )
    run.add_argument(
        "--isolate",
        action="store_true",
        help="each comparison group in its own process: a crash, or a step without progress for cell_timeout_s, "
        "marks only the cell in flight",
    )


def switches(args: argparse.Namespace) -> dict[str, str]:
    """The flags that set a config key without a value (`--no-error` sets `error`), as typed, for the problems they
    cause; `load_config` writes the others from their values (`--seq-lens 4096`)."""
    typed = {"error": "--no-error" if args.no_error else None, "tune": "--tune" if args.tune else None}
    if args.compile is not None:
        typed["compile"] = "--compile" if False in args.compile else "--compile-only"
    return {key: flag for key, flag in typed.items() if flag}


def compile_words(compiled: list[bool]) -> str:
    """' × eager and compiled' (or ' compiled'): how the compile axis multiplies the settings ('' when eager)."""
    if True not in compiled:
        return ""
    return " × eager and compiled" if False in compiled else " compiled"


def main(args: argparse.Namespace) -> int:
    """Check everything before any work, run the plan (or --resume a killed run), then print the verdict and write
    the summary and the report; a failure mid-run says what was kept and how to go on."""
    from attnbench.report.analysis import compile_sentence
    from attnbench.report.summary import noise_line, write_summary
    from attnbench.run.executors import if_stuck
    from attnbench.run.ray_executor import RayUnavailable
    from attnbench.run.resume import stored_config, stored_isolation
    from attnbench.run.sweep import run_plan
    from attnbench.runfolder.folder import RunFolderBusy, new_run_dir
    from attnbench.runfolder.results import read_results

    overrides = {
        key: value
        for key, value in {
            "variants": args.variants,
            "inputs": args.inputs,
            "seq_lens": args.seq_lens,
            "device": args.device,
            "dtype": args.dtype,
            "causal": args.causal,
            "compile": args.compile,
            "mode": args.mode,
            "seeds": args.seeds,
            "threads": args.threads,
            "processes": args.processes,
            "max_error": args.max_error,
            "min_speedup": args.min_speedup,
            "min_recall": args.min_recall,
            "decode_steps": args.decode_steps,
            "error": False if args.no_error else None,
            "tune": True if args.tune else None,
        }.items()
        if value is not None
    }
    if args.address is not None and args.executor != "ray":
        print("attnbench: --address names a Ray cluster: use it with --executor ray", file=sys.stderr)
        return Exit.USAGE
    if args.executor == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            print("attnbench: --executor ray needs Ray: pip install -e '.[ray]' in the attnbench checkout",
                  file=sys.stderr)  # fmt: skip
            return Exit.USAGE
        if args.address is not None:
            from attnbench.run.ray_executor import RayUnavailable, reachable_or_raise

            try:
                reachable_or_raise(args.address)  # before any run folder is made
            except RayUnavailable as error:
                print(f"attnbench: {error}", file=sys.stderr)
                return Exit.USAGE
    if args.resume is not None and args.config is not None:
        print(f"attnbench: --resume runs the stored config; drop {args.config}", file=sys.stderr)
        return Exit.USAGE
    if args.resume is not None and overrides:  # named as typed, not as the config's keys
        typed = {**{key: flag_text(key, value) for key, value in overrides.items()}, **switches(args)}
        print(f"attnbench: --resume runs the stored config; drop {', '.join(typed.values())}", file=sys.stderr)
        return Exit.USAGE
    try:
        if args.resume is not None:
            config = stored_config(args.resume, overrides, cluster=args.executor == "ray")
        else:
            config = load_config(args.config or "quick", overrides, cluster=args.executor == "ray",
                                 flags=switches(args))  # fmt: skip
    except ConfigError as error:  # a flag's problems name the flag, the file's name the file
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    if config.settings.tune and not config.settings.error:
        print("attnbench: --tune searches for the fastest setting within the error budget: it needs error (drop "
              "--no-error)", file=sys.stderr)  # fmt: skip
        return Exit.USAGE
    plan = config.plan()
    cells = plan.cells
    if args.executor == "ray" and config.settings.processes > 1:
        asked = f"--processes {args.processes}" if args.processes is not None else "processes > 1 (the config's)"
        print(f"attnbench: {asked} runs on this machine's worker processes; with --executor ray use --isolate "
              "instead (each group a process on its node)", file=sys.stderr)  # fmt: skip
        return Exit.USAGE
    for note in config.notes + plan.notes:  # inputs left out (real heads not captured, non-causal): said first
        print(f"attnbench: {note}", file=sys.stderr)
    if args.dry_run:
        return dry_run(config, plan)
    run_dir = args.resume if args.resume is not None else new_run_dir(args.out, config.name)
    duplicates = plan.duplicates
    print(
        f"attnbench: {len(cells)} cells in {len(plan.groups)} comparison groups from '{config.name}' "
        f"({len(config.variants)} variant settings{compile_words(config.axes['compiled'])} × N in "
        f"{sorted(set(config.seq_lens))})"
        + (f", {duplicates} duplicate cell(s) removed" if duplicates else "")
        + f"; results in {run_dir}/",
        file=sys.stderr,
    )
    from attnbench.plan.fit import unfit_input_lines

    if missing := baseline_warning(config):
        print(f"attnbench: {missing}", file=sys.stderr)
    for line in unfit_input_lines(cells, config.settings.decode_steps):
        print(f"attnbench: {line}", file=sys.stderr)
    from attnbench.measure.noise import NOISY_COMPETITION, competing_now

    competing, cores = competing_now(), os.cpu_count() or 1  # other processes' CPU now, not a lagging load average
    if competing is not None and competing > NOISY_COMPETITION:
        print(
            f"attnbench: the machine is already busy (other processes use {competing:.1f} of {cores} cores): timings "
            "will be noisy (each cell says so); without --threads each timed group takes the threads the idle cores "
            "hold, and a group whose times are the scheduler's is measured again or left unusable",
            file=sys.stderr,
        )
    already = len(read_results(run_dir)) if args.resume is not None and (run_dir / "results.csv").exists() else 0
    started = time.perf_counter()
    executor = "" if args.executor == "local" else f" --executor {args.executor}"
    executor += f" --address {args.address}" if args.address else ""

    def interrupted() -> None:  # said after Ctrl-C, and by the watcher should the call in flight not return
        done = len(read_results(run_dir)) if (run_dir / "results.csv").exists() else 0
        print(f"\nattnbench: interrupted; {done} of {len(cells)} cells are recorded in {run_dir}/. Continue with:\n"
              f"  attnbench run --resume {run_dir}{executor}", file=sys.stderr)  # fmt: skip

    try:
        with if_stuck(interrupted):
            run_plan(
                config,
                progress=not args.no_progress,
                run_dir=run_dir,
                resume=args.resume is not None,
                isolate=args.isolate or stored_isolation(args.resume),
                command=args.command_line,
                executor=args.executor,
                address=args.address,
                plan=plan,
            )
    except OSError as error:  # a full disk mid-run: finished groups are on disk whole (the main boundary says why)
        if (run_dir / "meta.json").is_file() or (run_dir / "config.toml").is_file():
            error.add_note(f"the cells finished so far are kept in {run_dir}/; make room (or make it writable), then "
                           f"continue with: attnbench run --resume {run_dir}")  # fmt: skip
        else:  # not even meta.json was written: nothing to resume
            error.add_note(f"nothing was recorded in {run_dir}/; make room (or make it writable), then run again")
        raise
    except RayUnavailable as error:  # raised before the run wrote anything: a new run's empty folder goes
        if args.resume is None and not any(run_dir.iterdir()):
            run_dir.rmdir()
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except RunFolderBusy as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        interrupted()
        return Exit.INTERRUPTED
    if config.settings.tune and (code := tune_run(config, cells, run_dir)) is not None:
        return code
    from attnbench.report.evidence import unfinished
    from attnbench.report.summary import terminal_answer
    from attnbench.report.view import RunView

    view = RunView.read(run_dir)  # rows, samples and meta read once, the verdict computed once, for all that follows
    frame = view.frame
    lacking = unfinished(run_dir, view.meta, frame)  # None: every planned cell is recorded
    print(terminal_answer(view, lacking, terminal_width()))  # what it rests on, the verdict, --tune's, the reach
    if compiled := compile_sentence(frame):  # the verdict's last word, on the same stream
        print(textwrap.fill(compiled, terminal_width(), subsequent_indent="  "))
    outputs = "results.csv, samples.csv, meta.json, config.toml, summary.md"
    report = None
    try:
        write_summary(run_dir, view)
        if not args.no_report:
            from attnbench.report.run_report import write_report

            print("attnbench: writing the report and its plots…", file=sys.stderr, flush=True)
            report = write_report(run_dir, view)
            outputs += ", report.md, plots/"
    except OSError as error:
        error.add_note(f"every cell is recorded in {run_dir}/results.csv; make room (or make it writable), then "
                       f"write the report with: attnbench report {run_dir}")  # fmt: skip
        raise
    print(f"attnbench: {noise_line(frame)}", file=sys.stderr)
    failed = frame[frame.status != "ok"].status.value_counts().sort_index()
    if len(failed):
        counts = ", ".join(f"{status} {count}" for status, count in failed.items())
        print(f"attnbench: {failed.sum()} cell(s) did not run ok ({counts}): reasons in summary.md", file=sys.stderr)
    print(
        f"attnbench: {len(frame) - already} cells in {time.perf_counter() - started:.0f} s"
        + (f" ({already} recorded before the resume)" if already else "")
        + f" -> {run_dir}/ ({outputs}); "
        "every table is in summary.md",
        file=sys.stderr,
    )
    nothing_ran = not (frame.status == "ok").any()
    if nothing_ran:
        print(f"attnbench: no cell ran ok ({', '.join(sorted(set(frame.status)))}): the reasons are in summary.md",
              file=sys.stderr)  # fmt: skip
    if report is not None:
        print(f"attnbench: report: {report}", file=sys.stderr)
    return Exit.NOTHING_RAN if nothing_ran else Exit.OK


def tune_run(config: SweepConfig, cells: list, run_dir: Path) -> int | None:
    """--tune after the sweep (attnbench.run.tune), in this process: tuning.csv written; Exit.INTERRUPTED (with how
    to go on) on Ctrl-C, None when it finished."""
    from attnbench.measure.dispatch import measure_group
    from attnbench.registry import registry
    from attnbench.run.executors import if_stuck, interruptible, terminate_as_interrupt
    from attnbench.run.tune import tune
    from attnbench.runfolder.tuning import write_tuning

    checks: dict = {}

    def interrupted() -> None:
        probed = " the knob values probed so far in tuning.csv." if (run_dir / "tuning.csv").is_file() else ""
        print(f"\nattnbench: interrupted while tuning; every cell of the sweep is recorded in {run_dir}/.{probed} The "
              f"sweep's report: attnbench report {run_dir}; tune again (from the start): attnbench run --resume "
              f"{run_dir}", file=sys.stderr)  # fmt: skip

    try:
        with if_stuck(interrupted), terminate_as_interrupt():  # SIGTERM stops a tuning as Ctrl-C does
            rows = tune(config, cells, config.settings.max_error,
                        lambda group: interruptible(lambda: measure_group(group, config.settings, registry,
                                                                          self_checks=checks)),
                        keep=lambda rows: write_tuning(run_dir, rows))  # fmt: skip
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the message
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        interrupted()
        return Exit.INTERRUPTED
    if not rows:
        print("attnbench: --tune: no variant of this run has a knob to tune (band, topk, h2o, snapkv, lsh, performer, "
              "nystromformer, linformer)", file=sys.stderr)  # fmt: skip
    return None


def baseline_warning(config: SweepConfig) -> str | None:
    """The warning for a run whose variants leave out the baseline (`--variants band,topk`): it runs, but with no
    speedup to report; or whose baseline is not exact softmax attention (`baseline = "retnet"`): its speedups are
    against that operator while every error stays against exact softmax. None when the baseline is an exact one."""
    labels = sorted({compiled_label(spec.label(), c) for spec in config.axes["variant"] for c in config.axes["compiled"]})
    baseline = config.settings.baseline
    if baseline not in labels:
        return (
            f"the baseline `{baseline}` is not among this run's variant settings ({', '.join(labels)}): no speedup "
            f"will be measured. Add it (--variants {baseline},…) or name one of them as `baseline` in a config"
        )
    spec = next(s for s in config.axes["variant"] for c in config.axes["compiled"] if compiled_label(s.label(), c) == baseline)
    variant = registry.create(spec.name, **dict(spec.params))
    refused = [
        f"causal={causal}" for causal in dict.fromkeys(config.axes["causal"])
        if variant.unsupported_reason(device=config.axes["device"][0], dtype=config.axes["dtype"][0], causal=causal,
                                      padded=False, n_q=min(config.axes["seq_len"]), n_k=min(config.axes["seq_len"]),
                                      backward=False, decode=config.axes["mode"][0] == "decode") is not None
    ]  # fmt: skip
    if refused:
        return (
            f"the baseline `{baseline}` cannot run this run's {' and '.join(refused)} cells: they get no speedup. "
            "Name a baseline that runs them (`full` runs every setting)"
        )
    if variant.family == "exact":
        return None
    kind = "a sparse pattern of softmax attention" if variant.exact else "not softmax attention"
    return (
        f"the baseline `{baseline}` is {kind}: every speedup is against it, while every error stays against exact "
        "softmax (float64); keep `full` in the run for the exact one's time"
    )


def dry_run(config: SweepConfig, plan: Plan) -> int:
    """`run --dry-run`: the plan with its estimates (with --tune, its search's groups too); nothing is measured but
    the machine's peaks."""
    from attnbench.measure.machine import peaks_for
    from attnbench.run.preview import preview, preview_text, tuning_preview

    if missing := baseline_warning(config):
        print(f"attnbench: {missing}", file=sys.stderr)
    print("attnbench: measuring this machine's peaks for the estimates…", file=sys.stderr, flush=True)
    for device in config.axes["device"]:
        peaks_for(device, (*config.axes["dtype"], "float64"))
    groups = preview(config, plan, registry)
    tuning = tuning_preview(config, plan, registry) if config.settings.tune else []
    print(preview_text(groups, terminal_width(), tuning))
    return Exit.OK if any(g.runs for g in groups) else Exit.NOTHING_RAN
