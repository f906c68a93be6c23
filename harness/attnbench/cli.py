"""The `attnbench` command: list variants, run a sweep."""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from attnbench import __version__
from attnbench.exit_status import Exit, exit_status_text
from attnbench.model.arguments import add_model_parser
from attnbench.model.calibrate_command import add_calibrate_parser
from attnbench.plan.cells import Plan
from attnbench.plan.config import ConfigError, SweepConfig, load_config, preset_names
from attnbench.registry import registry

EPILOG = (
    """examples:
  attnbench list
  attnbench presets                               # the presets and what each sweeps
  attnbench run quick                             # the CPU preset (`attnbench presets`: measured times)
  attnbench run default --variants full,full-math --seq-lens 512,1024
  attnbench run configs/default.toml --causal both --mode fwd,fwd+bwd --out results
  attnbench report results/<run-id>
  attnbench compare results/<run-a> results/<run-b> --fail-above 10
  attnbench model path/to/local-model --variants 'band(window=64),lsh' --text-file text.txt --seq-len 512 2048
  attnbench run default --executor ray              # each group a Ray task on a local Ray runtime
  attnbench run default --executor ray --address auto   # ... on the cluster this node belongs to

"""
    + exit_status_text()
)


def _csv(kind: type) -> Any:
    def parse(text: str) -> list[Any]:
        try:
            return [kind(item) for item in text.split(",") if item.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None

    return parse


def _both(text: str) -> list[bool]:
    """true, false or both: the values of a boolean axis (`--causal`, `--compile`)."""
    choices = {"true": [True], "false": [False], "both": [False, True]}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"expected true, false or both, got {text!r}")
    return choices[text.lower()]


def compile_words(compiled: list[bool]) -> str:
    """' × eager and compiled' (or ' compiled'): how the compile axis multiplies the settings ('' when eager)."""
    if True not in compiled:
        return ""
    return " × eager and compiled" if False in compiled else " compiled"


def _add_budget_flags(command: argparse.ArgumentParser, default: str) -> None:
    """--max-error and --min-speedup: the verdict's accuracy budget and the speedup asked (attnbench.plan.budget)."""
    from attnbench.plan.budget import DEFAULT_MAX_ERROR

    command.add_argument(
        "--max-error",
        type=float,
        metavar="X",
        help="the accuracy budget: the verdict recommends only a variant whose error vs uniform (on the input "
        f"judged) is at most X ({default}{DEFAULT_MAX_ERROR}: at least half of what attention adds over averaging V "
        "kept)",
    )
    command.add_argument(
        "--min-speedup",
        type=float,
        metavar="S",
        help="also answer: of the variants at least S× faster than the baseline (whole 95%% interval), which has "
        "the least error? (S > 1)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Time, peak memory and error of efficient attention variants versus exact softmax attention.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"attnbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser(
        "list",
        help="every variant: family, exactness, capabilities, package; broken plugins",
        description="List every registered variant (built-in and plugins) with its capabilities and package.",
    )
    commands.add_parser(
        "presets", help="the sweep presets shipped with attnbench", description="List the presets `run` accepts."
    )

    run = commands.add_parser(
        "run",
        help="run a sweep and print a summary table",
        description="Validate the whole plan, then measure every cell: time (in turns per group), memory, error.",
        epilog=f"presets: {', '.join(preset_names())}\n\n" + EPILOG,
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
    run.add_argument("--seq-lens", type=_csv(int), help="comma-separated sequence lengths, e.g. 1024,4096")
    run.add_argument("--device", type=_csv(str), help="cpu, cuda or cuda:N (comma-separated for several)")
    run.add_argument("--dtype", type=_csv(str), help="float32, float16, bfloat16 or float64")
    run.add_argument("--causal", type=_both, help="true, false or both")
    compiling = run.add_mutually_exclusive_group()
    compiling.add_argument(
        "--compile",
        action="store_const",
        const=[False, True],
        help="each variant setting eager and under torch.compile, timed in turns (the config's `compile = [false, "
        "true]`); compilation time is kept apart in compile_s",
    )
    compiling.add_argument(
        "--compile-only",
        dest="compile",
        action="store_const",
        const=[True],
        help="each variant setting under torch.compile alone (`compile = true`; the baseline is then `full compiled`)",
    )
    run.add_argument("--mode", type=_csv(str), help="fwd, fwd+bwd, or fwd,fwd+bwd for both")
    run.add_argument("--seeds", type=_csv(int), help="comma-separated seeds")
    run.add_argument("--threads", type=int, help="torch threads (default: the config's `threads`, 0 = torch's default)")
    run.add_argument(
        "--processes",
        type=int,
        metavar="K",
        help="measure each group in K fresh worker processes, one after another, each timing min_run_time / K: the "
        "spread between processes enters every speedup interval (default: the config's `processes`, 1)",
    )
    _add_budget_flags(run, "default: the config's `max_error`, else ")
    run.add_argument("--out", type=Path, default=Path("results"), help="folder for run folders (default: results)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-report", action="store_true", help="skip report.md / report.html / plots at the end")
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
        "why, estimated peak memory and time (lower bounds from this machine's measured peaks), the total",
    )
    run.add_argument(
        "--isolate",
        action="store_true",
        help="each comparison group in its own process: a crash, or a step without progress for cell_timeout_s, "
        "marks only the cell in flight",
    )

    report = commands.add_parser(
        "report",
        help="(re)build report.md, report.html and plots/ for a run folder",
        description="Rebuild a run folder's report from its results.csv and meta.json.",
    )
    report.add_argument("run_dir", type=Path, help="a run folder, results/<run-id>")
    _add_budget_flags(report, "default: the budget the run recorded, else ")

    compare = commands.add_parser(
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
    check = commands.add_parser(
        "check",
        help="run the conformance checks on a variant (for variant authors)",
        description="The registry-wide conformance checks on one variant, in float64 and float32.",
        epilog="exit status: 0 every check passed or was skipped; 1 a check failed; 2 unknown variant, bad "
        "hyperparameter, or the variant cannot be checked on this machine (e.g. CUDA-only without CUDA)",
    )
    check.add_argument("name", help="a registered variant name (see `attnbench list`)")
    check.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter, as a TOML value (e.g. --param window=64 --param backend='\"flex\"')",
    )

    capture = commands.add_parser(
        "capture",
        help="record per-layer, per-head Q/K/V of a local Hugging Face model",
        description="Record Q/K/V from a local model for the `captured` input (nothing is downloaded).",
    )
    capture.add_argument(
        "model_dir", type=Path, help="a local model folder (config.json + weights); nothing is downloaded"
    )
    capture.add_argument(
        "--out",
        type=Path,
        required=True,
        help="file to write: .pt, .safetensors or .npz (what the captured input reads)",
    )
    source = capture.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="text to tokenize (needs a tokenizer in the model folder)")
    source.add_argument(
        "--text-file", type=Path, help="a UTF-8 text file to tokenize (the shipped prose: see `attnbench calibrate --help`)"
    )
    source.add_argument("--token-ids", type=_csv(int), help="comma-separated token ids")
    source.add_argument("--random-tokens", type=int, metavar="N", help="N random token ids (seeded)")
    capture.add_argument("--seq-len", type=int, help="keep the first N tokens (default: all of them)")
    capture.add_argument("--seed", type=int, default=0, help="seed of --random-tokens (default 0)")
    capture.add_argument(
        "--pre-rotary",
        action="store_true",
        help="record the q/k/v projections, before any rotary embedding (position-free attention for a rotary "
        "model); by default q/k are recorded where attention sees them, after it",
    )

    add_calibrate_parser(commands)
    add_model_parser(commands)
    reproduce = commands.add_parser(
        "reproduce",
        help="published claims (Linformer, Nyströmformer, Performer, Reformer, ...) checked against runs made here",
        description="Run the cells each published claim needs (a run folder per claim, resumable: run it again to "
        "continue), and print the paper's figure beside ours with a verdict per claim: holds, holds in trend "
        "(not in size), does not hold, or cannot run here. Writes OUT/reproduce.md (reproduce-quick.md with "
        "--quick). Exit 0 when every claim that could run holds at least in trend, 1 when one does not.",
    )
    reproduce.add_argument("claims", nargs="*", help="claim ids (default: the whole catalogue; see --list)")
    reproduce.add_argument("--list", action="store_true", help="list the claims and whether each can run here")
    reproduce.add_argument(
        "--quick", action="store_true", help="smaller N, fewer seeds or rounds (about 40 s on 2 cores)"
    )
    reproduce.add_argument(
        "--out", type=Path, default=Path("results") / "reproduce", help="folder for the claims' run folders "
        "(default: results/reproduce)",
    )  # fmt: skip
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def command_reproduce(args: argparse.Namespace) -> int:
    from attnbench.reproduce.command import command_reproduce as reproduce

    return reproduce(args.claims, args.out, quick=args.quick, progress=not args.no_progress, list_only=args.list)


def command_check(args: argparse.Namespace) -> int:
    from attnbench.conformance import CHECKS, check_contexts, run_check
    from attnbench.interface import VariantError
    from attnbench.plan.cells import parse_params
    from attnbench.report.text import markdown_table

    try:
        try:
            params = parse_params(args.param)
        except ValueError as error:
            raise ValueError(f"--param {error}") from None
        variant_class = registry.load(args.name)
        problems = variant_class.validate_hyperparams(params)
        if problems:
            raise ValueError(f"--param: invalid hyperparameters for {args.name}: {'; '.join(problems)}")
        variant_class(seed=0, **params)  # a constructor that raises is reported here
    except (ValueError, VariantError) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except Exception as error:
        print(f"attnbench: could not build {args.name}: {type(error).__name__}: {error}", file=sys.stderr)
        return Exit.USAGE
    contexts = check_contexts(lambda: variant_class(seed=0, **params))
    if isinstance(contexts, str):
        print(f"attnbench: {args.name} cannot be checked on this machine: {contexts}", file=sys.stderr)
        return Exit.USAGE
    failed, total = [], 0
    for ctx in contexts:  # float64 and float32: a NaN or a leak may show in one precision only
        dtype = str(ctx.dtype).removeprefix("torch.")
        results = [run_check(name, ctx) for name in CHECKS]
        print(f"{args.name} on {ctx.device.type}, {dtype}:")
        print(markdown_table(["check", "result", "detail"], [[r.check, r.status, r.detail] for r in results]))
        failed += [f"{r.check} ({dtype})" for r in results if r.status == "fail"]
        total += len(results)
    print(
        f"{total - len(failed)} passed or skipped, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else "")
    )
    return Exit.REGRESSION if failed else Exit.OK


def command_capture(args: argparse.Namespace) -> int:
    from attnbench.model.capture import CaptureError, capture_qkv

    try:
        text = args.text
        if args.text_file is not None:
            try:
                text = args.text_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise CaptureError(f"--text-file {args.text_file}: cannot be read as UTF-8 text ({error})") from None
        if args.seq_len is not None and args.seq_len < 1:
            raise CaptureError(f"--seq-len must be >= 1, got {args.seq_len}")
        if args.random_tokens is not None and args.random_tokens < 1:
            raise CaptureError(f"--random-tokens must be >= 1, got {args.random_tokens}")
        tensors, meta = capture_qkv(
            args.model_dir,
            args.out,
            text=text,
            token_ids=args.token_ids,
            random_tokens=args.random_tokens,
            seed=args.seed,
            pre_rotary=args.pre_rotary,
            seq_len=args.seq_len,
            text_source=f"--text-file {args.text_file}" if args.text_file else None,
        )
    except CaptureError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    layers, batch, heads, seq, head_dim = tensors["q"].shape
    print(
        f"attnbench: wrote {args.out}: {layers} layers, {heads} query heads ({tensors['k'].shape[2]} key/value), "
        f"{seq} position{'s' if seq != 1 else ''}, head_dim {head_dim}, recorded at the {meta['recorded_at']}"
        f"{', causal' if meta['causal'] else ''}. "
        f'Use it with [[inputs]] name = "captured", path = "{args.out}"'
    )
    return Exit.OK


def _calibrate(args: argparse.Namespace) -> int:
    from attnbench.model.calibrate_command import calibrate_command

    return calibrate_command(args)


def command_model(args: argparse.Namespace) -> int:
    from attnbench.model.command import model_command

    return model_command(args, terminal_width())


def command_presets() -> int:
    from attnbench.plan.config import preset_descriptions
    from attnbench.report.text import aligned_table

    rows = [[name, time, text] for name, (text, time) in preset_descriptions().items()]
    headers = ["preset", "run time measured on 2 cores", "what it sweeps"]
    print(aligned_table(headers, rows, width=terminal_width(), cuttable=(2,)))
    print("\nrun one with `attnbench run NAME`; copy one from configs/ to start your own TOML file")
    return Exit.OK


def command_list() -> int:
    entries = registry.load_all()
    working = [e for e in entries if e.variant_class is not None]
    broken = [e for e in entries if e.error is not None]
    print(
        f"{'name':<16} {'family':<10} {'exact':<6} {'causal':<7} {'padding':<8} {'Nq!=Nk':<7} "
        f"{'backward':<9} {'devices':<10} package"
    )
    for entry in working:
        cls = entry.variant_class
        caps = cls.supports
        flags = [caps.causal, caps.key_padding_mask, caps.cross_attention, caps.backward]
        marks = ["yes" if f else "no" for f in flags]
        print(
            f"{entry.name:<16} {cls.family:<10} {'yes' if cls.exact else 'no':<6} {marks[0]:<7} {marks[1]:<8} "
            f"{marks[2]:<7} {marks[3]:<9} {','.join(caps.devices):<10} {entry.package}"
        )
        for key, spec in cls.hyperparameters.items():
            print(f"{'':<18}{key} = {spec.default!r}: {spec.doc}")
    if broken:
        print("\nbroken plugins (every other variant still works):")
        for entry in broken:
            print(f"  {entry.name} ({entry.package}): {entry.error}")
    return Exit.OK


def command_run(args: argparse.Namespace) -> int:
    from attnbench.report.analysis import compile_sentence
    from attnbench.report.summary import noise_line, write_summary
    from attnbench.run.executors import exit_now_if_abandoned
    from attnbench.run.ray_executor import RayUnavailable
    from attnbench.run.resume import stored_config, stored_isolation
    from attnbench.run.sweep import run_plan
    from attnbench.runfolder.folder import RunFolderBusy, new_run_dir
    from attnbench.runfolder.results import read_results

    overrides = {
        key: value
        for key, value in {
            "variants": args.variants,
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
    try:
        if args.resume is not None:
            config = stored_config(args.resume, overrides, cluster=args.executor == "ray")
        else:
            config = load_config(args.config or "quick", overrides, cluster=args.executor == "ray")
    except ConfigError as error:  # a flag's problems name the flag, the file's name the file
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    plan = config.plan()
    cells = plan.cells
    if args.executor == "ray" and config.settings.processes > 1:
        print("attnbench: processes > 1 runs on this machine's worker processes; with --executor ray use "
              "--isolate instead (each group a process on its node)", file=sys.stderr)  # fmt: skip
        return Exit.USAGE
    if args.dry_run:
        return _dry_run(config, plan)
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
    from attnbench.measure.noise import NOISY_COMPETITION, competing_now

    competing, cores = competing_now(), os.cpu_count() or 1  # other processes' CPU now, not a lagging load average
    if competing is not None and competing > NOISY_COMPETITION:
        print(
            f"attnbench: the machine is already busy (other processes use {competing:.1f} of {cores} cores): timings "
            "will be noisy (each cell says so); in-turn speedups hold best when torch's threads fit the idle cores "
            "(--threads)",
            file=sys.stderr,
        )
    already = len(read_results(run_dir)) if args.resume is not None and (run_dir / "results.csv").exists() else 0
    started = time.perf_counter()
    try:
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
        done = len(read_results(run_dir)) if (run_dir / "results.csv").exists() else 0
        executor = "" if args.executor == "local" else f" --executor {args.executor}"
        executor += f" --address {args.address}" if args.address else ""
        print(
            f"\nattnbench: interrupted; {done} of {len(cells)} cells are recorded in {run_dir}/. "
            f"Continue with:\n  attnbench run --resume {run_dir}{executor}",
            file=sys.stderr,
        )
        exit_now_if_abandoned(Exit.INTERRUPTED)  # a call still running on its thread: no waiting for it
        return Exit.INTERRUPTED
    from attnbench.report.verdict import verdict_terminal
    from attnbench.report.view import RunView

    view = RunView.read(run_dir)  # rows, samples and meta read once, the verdict computed once, for all that follows
    frame = view.frame
    print(verdict_terminal(view.blocks, terminal_width()))
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


def _dry_run(config: SweepConfig, plan: Plan) -> int:
    """`run --dry-run`: the plan with its estimates; nothing is measured but the machine's peaks."""
    from attnbench.measure.machine import peaks_for
    from attnbench.run.preview import preview, preview_text

    print("attnbench: measuring this machine's peaks for the estimates…", file=sys.stderr, flush=True)
    for device in config.axes["device"]:
        peaks_for(device, (*config.axes["dtype"], "float64"))
    groups = preview(config, plan, registry)
    print(preview_text(groups, terminal_width()))
    return Exit.OK if any(g.runs for g in groups) else Exit.NOTHING_RAN


def terminal_width() -> int:
    """Columns of the terminal: stdout's, or stderr's when stdout is piped (`| tee log`), else $COLUMNS or 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            continue
    return int(os.environ.get("COLUMNS", "120") or 120)


def _run_folder(path: Path) -> Path | None:
    if not (path / "results.csv").is_file():
        print(
            f"attnbench: {path} is not a run folder (no results.csv); runs live in results/<run-id>/", file=sys.stderr
        )
        return None
    return path


def command_report(args: argparse.Namespace) -> int:
    from attnbench.plan.budget import budget_problems
    from attnbench.report.run_report import write_report
    from attnbench.report.summary import write_summary
    from attnbench.report.view import RunView
    from attnbench.runfolder.results import read_results

    problems = budget_problems(args.max_error, args.min_speedup, lambda key: "--" + key.replace("_", "-"))
    if problems:  # before the folder is read
        print("\n".join(f"attnbench: {problem}" for problem in problems), file=sys.stderr)
        return Exit.USAGE
    if _run_folder(args.run_dir) is None:
        return Exit.USAGE
    frame = read_results(args.run_dir)
    if frame.empty:
        print(
            f"attnbench: {args.run_dir} has no finished cell (the run stopped before its first group ended): no report "
            f"written; continue it with: attnbench run --resume {args.run_dir}",
            file=sys.stderr,
        )
        return Exit.NOTHING_RAN
    try:
        view = RunView.read(args.run_dir, frame, args.max_error, args.min_speedup)
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
    return Exit.OK


def command_compare(args: argparse.Namespace) -> int:
    from attnbench.report.compare import DEFAULT_THRESHOLD, compare_runs, format_comparison
    from attnbench.runfolder.folder import being_written

    for run in (args.run_a, args.run_b):  # first: a run just started has no results.csv yet
        if (holder := being_written(run)) is not None:
            print(f"attnbench: {run} is still being written ({holder}): compare it once the run ends", file=sys.stderr)
            return Exit.USAGE
    if _run_folder(args.run_a) is None or _run_folder(args.run_b) is None:
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


def _plain_warnings() -> None:
    """attnbench's own warnings (a captured file's) as one line each, once per message; others as Python shows them."""
    import warnings

    from attnbench.inputs.captured import CapturedFileWarning

    shown, printed = warnings.showwarning, set()

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        if issubclass(category, CapturedFileWarning):
            if str(message) not in printed:
                printed.add(str(message))
                print(f"attnbench: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    if getattr(shown, "__name__", "") != "show":
        warnings.showwarning = show


def main(argv: list[str] | None = None) -> int:
    from attnbench.runfolder.folder import RunFolderUnreadable

    argv = sys.argv[1:] if argv is None else list(argv)
    _plain_warnings()
    args = build_parser().parse_args(argv)
    args.command_line = ["attnbench", *argv]  # recorded in meta.json: the run's reproduce line
    commands = {
        "list": lambda: command_list(),
        "presets": lambda: command_presets(),
        "run": lambda: command_run(args),
        "report": lambda: command_report(args),
        "compare": lambda: command_compare(args),
        "capture": lambda: command_capture(args),
        "calibrate": lambda: _calibrate(args),
        "model": lambda: command_model(args),
        "check": lambda: command_check(args),
        "reproduce": lambda: command_reproduce(args),
    }
    try:
        return commands[args.command]()
    except KeyboardInterrupt:  # outside a run's measurement (which handles it itself): stop quietly
        print("\nattnbench: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (so the interpreter's final flush stays quiet)
        return Exit.OK
    except RunFolderUnreadable as error:  # a hand-edited or damaged run folder
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except OSError as error:  # a read-only or full disk, a name too long: what failed and where, never a traceback
        where = f" {error.filename}" if error.filename else ""
        print(f"attnbench: cannot read or write{where}: {error.strerror or error}", file=sys.stderr)
        for note in getattr(error, "__notes__", []):  # what was kept, and how to go on (added where it is known)
            print(f"attnbench: {note}", file=sys.stderr)
        return Exit.USAGE


def entry() -> None:
    """The `attnbench` command: `main`, then an exit that cannot hang.

    An interpreter's ordinary exit first waits for every non-daemon thread, then runs each native library's
    destructors: OpenBLAS (numpy's) shuts its thread pool down there, and about 1 run in 70 hung forever at that
    point after writing its report, with torch's OpenMP workers alive beside it. By the time `main` returns,
    everything attnbench writes is closed and synced (results and samples fsynced per group, the rest replaced
    atomically), so the process flushes its output, runs Python's exit hooks (a plugin's own clean-up still
    runs) and ends with `os._exit`: no thread is waited for, no destructor runs.
    """
    import atexit
    import traceback

    try:
        code = main()
    except SystemExit as stop:  # argparse: --help (0), a usage error (2)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C before main's own handling (while modules import)
        print("\nattnbench: interrupted", file=sys.stderr)
        code = Exit.INTERRUPTED
    except BaseException:  # a bug: its traceback, and Python's own exit status for it
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:  # None: started with that stream closed (`attnbench list >&-`)
                    stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
                pass
        os._exit(code)


if __name__ == "__main__":
    entry()
