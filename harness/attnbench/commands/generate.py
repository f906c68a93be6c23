"""`attnbench generate`: the real decoder generating with each method inside every self-attention layer, scored on
what it answers (passkey, RULER-style needles, a user's JSONL tasks) and on continuation quality, against the share
of the cache each method keeps.

The grid is checked whole, and the model against it, before any folder is written; each unit's rows are appended
to results/<id>/generations.csv as it ends, so `--resume DIR` (after a kill) runs only what has no row yet; the
report is rewritten at the end (`--report DIR` rewrites it alone).
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.commands.terminal import grid_table, resume_problem, terminal_width
from attnbench.exit_status import Exit

if TYPE_CHECKING:
    from attnbench.generation.grid import GenerationGrid
    from attnbench.generation.placement import Placement
    from attnbench.generation.run import GridEstimate



def add_parser(subparsers: argparse._SubParsersAction) -> None:
    from attnbench.generation.grid import ALIASES, DEFAULT_GRID, PROTOCOLS, grid_descriptions
    from attnbench.generation.kept import BUDGET_RULES
    from attnbench.generation.tasks import TASKS
    from attnbench.generation.preflight import DEFAULT_MODEL
    from attnbench.model.known import known_names, model_argument
    from attnbench.generation.placement import DEVICES, DTYPES

    generate = subparsers.add_parser(
        "generate",
        help="the real model generating with each method: needle answers and continuation quality against cache kept",
        description="Generate greedily with a local causal LM (SmolLM2-135M after `make model`) with each method "
        "inside every self-attention layer (a hybrid model's global ones: its sliding-window layers keep their "
        "windows, --hybrid-layers): a KV-cache method compresses the exact prompt (kvpress's protocol), "
        "then the question and the answer go through its decode steps. Scores: RULER's string match on passkey and "
        "needle tasks (and a user's JSONL rows), and the perplexity of a real text's next tokens against the exact "
        "model's; x-axis: the share of the cache kept. Exit 0 when every generation ran, 1 when some failed, 2 for a "
        "bad grid, flag or model, 3 when none ran ok, 130 when interrupted (the finished units are kept).",
        epilog="grids: " + "; ".join(f"{name} ({time})" for name, (_, time) in grid_descriptions().items()),
    )
    generate.add_argument("grid", nargs="?", default=None, help=f"a shipped grid or a TOML file (default: {DEFAULT_GRID})")
    generate.add_argument("--model", type=model_argument, default=None, metavar="NAME|DIR",
                          help=f"a known model by name ({known_names()}: `make model MODEL=...` fetches them) or a "
                          f"model folder (default: the grid's `model`, else $ATTNBENCH_MODEL_DIR or {DEFAULT_MODEL}, "
                          "where `make model` writes SmolLM2-135M)")  # fmt: skip
    generate.add_argument("--tasks", help="comma-separated tasks replacing the grid's: RULER's "
                          f"{', '.join(t for t in TASKS if t not in ('passkey', 'continuation'))}; passkey; "
                          "continuation; or jsonl:PATH (rows of context, question, answers, optionally answer_prefix, "
                          "metric = string_match_all | string_match_part, max_new_tokens; joined verbatim)")  # fmt: skip
    generate.add_argument("--seq-lens", help="comma-separated context lengths N, e.g. 2048,8192")
    generate.add_argument("--samples", type=int, help="samples per task and N (needles at depths spread over 0-100%%)")
    generate.add_argument("--keep", help="comma-separated shares of the prompt's cache a KV method keeps, e.g. 0.5,0.125")
    generate.add_argument("--methods", help="comma-separated method settings replacing the grid's, e.g. "
                          "'h2o,snapkv(window=64),band(sinks=4)', or the papers' names with their own parameters, "
                          f"e.g. 'quest(token_budget=512),streamingllm(start_size=4)' ({', '.join(ALIASES)}: "
                          "`attnbench list`); full, the exact model, is always run")  # fmt: skip
    generate.add_argument("--protocols", help=f"comma-separated: {', '.join(PROTOCOLS)}")
    generate.add_argument("--hybrid-layers", choices=("global", "all"),
                          help="a hybrid model's layers each method goes into (Gemma 3: 5 sliding-window layers for "
                          "each global one): global (the default, as kvpress does: a sliding layer keeps its window, "
                          "the model's own cache) or all (a method replaces the windows too, said in its label: "
                          "[every layer]); replaces every method table's `hybrid_layers` (the exact model keeps its "
                          "windows); refused for a model without sliding layers")  # fmt: skip
    generate.add_argument("--budget-rule", choices=BUDGET_RULES,
                          help="kvpress (the default): the context is compressed once when it ends, the question and "
                          "the answer appended for every method; fixed-total: every method stays at its share "
                          "throughout (a window and H2O evict as they step, SnapKV leaves room for what follows)")  # fmt: skip
    generate.add_argument("--executor", choices=("local", "ray"), default="local",
                          help="local: the units one after another here; ray: each unit a Ray task")  # fmt: skip
    generate.add_argument("--jobs", type=int, default=2, help="units at once on this machine, each in its own process "
                          "(default 2: the per-token work is mostly Python, so two processes of one thread each go "
                          "faster than one of two)")  # fmt: skip
    generate.add_argument("--address", help="with --executor ray: a cluster's address (default: a local runtime)")
    generate.add_argument("--device", choices=DEVICES, help="where the model and every method's states run (default "
                          "cpu; cuda: refused where torch sees no GPU, a Ray task then asks for one)")  # fmt: skip
    generate.add_argument("--dtype", choices=DTYPES, help="what the model computes in (default float32; bfloat16 "
                          "runs on the CPU too, its caches half the bytes); --resume keeps DIR's")  # fmt: skip
    generate.add_argument("--out", type=Path, default=Path("results"), help="where the grid's folder goes (results/)")
    generate.add_argument("--resume", type=Path, metavar="DIR", help="continue the grid in DIR: run what has no row")
    generate.add_argument("--report", type=Path, metavar="DIR", help="only rewrite DIR's report (no generation)")
    generate.add_argument("--beside", type=Path, action="append", metavar="OTHER", help="with --report: a section "
                          "beside another model's generation run in OTHER, whether the methods rank alike in both "
                          "(repeatable)")  # fmt: skip
    generate.add_argument("--dry-run", action="store_true", help="list the units still to run and their estimated "
                          "time on this machine (the model's forward pass timed once), then stop")  # fmt: skip
    generate.add_argument("--list", action="store_true", help="list the shipped grids")


def grid_flags(args: argparse.Namespace) -> dict[str, object]:
    """The flags that change a grid, with their values (None: not given)."""
    return {"--tasks": args.tasks, "--seq-lens": args.seq_lens, "--samples": args.samples, "--keep": args.keep,
            "--methods": args.methods, "--protocols": args.protocols, "--budget-rule": args.budget_rule,
            "--hybrid-layers": args.hybrid_layers}  # fmt: skip


def _items(text: str | None, kind: type, flag: str) -> list | None:
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ValueError(f"{flag}: an empty item in {text!r}")
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated {kind.__name__}s, got {text!r}") from None


def _methods(text: str | None) -> list | None:
    if text is None:
        return None
    from attnbench.plan.cells import VariantSpec

    return [{"name": spec.name, **dict(spec.params)} for spec in VariantSpec.parse(text)]


def main(args: argparse.Namespace) -> int:
    from attnbench.generation.grid import DEFAULT_GRID, clamp_notes, grid_descriptions, read_grid
    from attnbench.generation.preflight import PreflightError, check, grid_model_dir
    from attnbench.generation.run import GRID_FILE
    from attnbench.plan.config import ConfigError

    if args.list:
        print(grid_table(grid_descriptions(), "what it runs"))
        return Exit.OK
    if args.address and args.executor != "ray":
        print("attnbench: --address names a Ray cluster: use it with --executor ray", file=sys.stderr)
        return Exit.USAGE
    if args.jobs < 1:
        print(f"attnbench: --jobs: must be >= 1, got {args.jobs}", file=sys.stderr)
        return Exit.USAGE
    if args.beside and args.report is None:
        print("attnbench: --beside OTHER adds a section to a grid's report: give it with --report DIR", file=sys.stderr)
        return Exit.USAGE
    if args.report is not None:
        if args.resume is not None:
            print("attnbench: --report rewrites a finished grid's report, --resume continues a grid: give one of them",
                  file=sys.stderr)  # fmt: skip
            return Exit.USAGE
        changed = [flag for flag, value in grid_flags(args).items() if value is not None]
        changed += [flag for flag, value in (("--device", args.device), ("--dtype", args.dtype)) if value is not None]
        if changed:
            print(f"attnbench: --report rewrites DIR's report from its rows: {', '.join(changed)} cannot change them",
                  file=sys.stderr)  # fmt: skip
            return Exit.USAGE
        return _report_only(args.report, args.beside or [])
    folder, source = None, args.grid or DEFAULT_GRID
    if args.resume is not None:
        if (problem := resume_problem(args.resume, args.grid, GRID_FILE, "a generation grid")) is not None:
            print(f"attnbench: {problem}", file=sys.stderr)
            return Exit.USAGE
        changed = [flag for flag, value in grid_flags(args).items() if value is not None]
        if changed:
            print(f"attnbench: --resume continues DIR's own grid (DIR/grid.toml): {', '.join(changed)} would change it; "
                  "start a new grid for another setting", file=sys.stderr)  # fmt: skip
            return Exit.USAGE
        folder, source = args.resume, str(args.resume / GRID_FILE)
    try:
        overrides = dict(
            tasks=_items(args.tasks, str, "--tasks"), seq_lens=_items(args.seq_lens, int, "--seq-lens"),
            samples=args.samples, keep=_items(args.keep, float, "--keep"), methods=_methods(args.methods),
            protocols=_items(args.protocols, str, "--protocols"), budget_rule=args.budget_rule,
            hybrid_layers=args.hybrid_layers,
        )  # fmt: skip
        grid = read_grid(source, **overrides)
    except ValueError as error:  # ConfigError lists every problem
        print(str(error) if isinstance(error, ConfigError) else f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    for note in clamp_notes(grid):
        print(f"attnbench: note: {note}", file=sys.stderr)
    placement = _placement(args, grid, folder)
    if isinstance(placement, str):
        print(f"attnbench: {placement}", file=sys.stderr)
        return Exit.USAGE
    try:
        was = _model_of(folder)
        if args.model is not None and was is not None and args.model.resolve() != was.resolve():
            raise PreflightError(f"--model {args.model}: the rows in {folder} were generated by {was}; --resume "
                                 "continues them with it (start a new grid for another model)")  # fmt: skip
        model_dir = (args.model or was or grid_model_dir(grid)).resolve()  # absolute: a resume from elsewhere finds it
        at_once = args.jobs if args.executor == "local" else 1 if args.address else os.cpu_count() or 1  # units
        tokenizer = check(grid, model_dir, placement.device, at_once)
    except PreflightError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    if args.dry_run:
        return _dry_run(args, grid, folder, model_dir, tokenizer, placement)
    return _generate(args, grid, folder, model_dir, placement)


def _placement(args: argparse.Namespace, grid: GenerationGrid, folder: Path | None) -> Placement | str:
    """--device and --dtype (a resumed grid's own where not given), or what stops them, every problem in one line:
    CUDA asked for where torch sees no GPU (the units run here: not with --executor ray --address, whose nodes have
    their own), a method that cannot run there, another dtype than a resumed grid's rows."""
    from attnbench.generation.placement import Placement, placement_problems
    from attnbench.runfolder.meta import read_meta

    recorded = read_meta(folder) if folder is not None and (folder / "meta.json").is_file() else {}
    was = recorded.get("dtype", "float32" if recorded else None)  # a grid from before --dtype ran in float32
    if args.dtype is not None and was is not None and args.dtype != was:
        return (f"--dtype {args.dtype}: the rows in {folder} were generated in {was}; --resume continues them in "
                f"{was} (start a new grid for another dtype)")  # fmt: skip
    try:
        placement = Placement(args.device or recorded.get("device", "cpu"), args.dtype or was or "float32")
    except ValueError as error:  # a hand-edited meta.json
        return f"{folder}/meta.json: {error}"
    here = not (args.executor == "ray" and args.address)
    problems = placement_problems(grid, placement, here=here)
    return "; ".join(problems) if problems else placement


def _dry_run(args: argparse.Namespace, grid: GenerationGrid, folder: Path | None, model_dir: Path,
             tokenizer: Any, placement: Placement) -> int:
    """`generate --dry-run`: the units still to run, the method settings, and the time they will take here."""
    from attnbench.generation.run import grid_estimate, model_layout, units_to_run
    from attnbench.runfolder.generations import generated_keys

    done = generated_keys(folder) if folder is not None else set()
    todo = units_to_run(grid, done)
    layout = model_layout(model_dir)
    print(f"model: {model_dir}" + (f" ({layout})" if layout else ""))
    for unit in todo:
        print(unit.name())
    settings = [s.label() for s in grid.settings(grid.seq_lens[0])]
    print(f"methods ({len(settings)} each): {', '.join(settings)}")
    print(f"total: {len(todo)} units" + (f" ({len(grid.units()) - len(todo)} done already)" if done else ""))
    if todo:
        print("attnbench: timing the model's forward pass for the estimate…", file=sys.stderr, flush=True)
        estimate = grid_estimate(grid, todo, model_dir, tokenizer, executor=args.executor, workers=args.jobs,
                                 placement=placement)  # fmt: skip
        print(textwrap.fill(estimate_text(estimate, grid.raw.get("measured_run_time"), args.executor), terminal_width(),
                            subsequent_indent="  "))  # fmt: skip
    return Exit.OK


def estimate_text(estimate: GridEstimate, recorded: str | None, executor: str) -> str:
    """The estimate as said: its range and why it is one, what it rests on and leaves out, and the grid's recorded run
    time where it has one."""
    from attnbench.measure.estimate import seconds_text

    low, high = seconds_text(estimate.low_s), seconds_text(estimate.high_s)
    plural = lambda count: "s" if count > 1 else ""  # noqa: E731
    where = ("one unit at a time here (a Ray cluster runs them side by side)" if executor == "ray"
             else f"{estimate.workers} worker{plural(estimate.workers)} here (--jobs)")  # fmt: skip
    span = f"{low} with {where}" if low == high else (
        f"{low} to {high} with {where}: the low end if every answer ends at its first token, the high end if each "
        "runs to its budget"
    )  # fmt: skip
    return (
        f"estimated time: {span}. It rests on the grid's forward passes in FLOPs (prefills, questions, answers, "
        f"continuations) at the model's speed timed here now, {estimate.flops_per_s / 1e9:.3g} GFLOP/s on a worker's "
        f"{estimate.threads} thread{plural(estimate.threads)}, and on its loading, {estimate.load_s:.1f} s a worker; "
        "not counted: the methods' state builds, the step timing, starting the workers; a busy machine is slower"
        + (f". Recorded for this grid: {recorded}" if recorded else "")
    )


def _model_of(folder: Path | None) -> Path | None:
    """A resumed grid's model: the one its meta.json names."""
    if folder is None or not (folder / "meta.json").is_file():
        return None
    from attnbench.runfolder.meta import read_meta

    model = read_meta(folder).get("model_dir")
    return Path(model) if model else None


def _generate(args: argparse.Namespace, grid, folder: Path | None, model_dir: Path, placement: Placement) -> int:
    import signal

    from attnbench.generation.run import run_grid
    from attnbench.run.ray_executor import RayUnavailable
    from attnbench.runfolder.folder import RunFolderBusy, new_run_dir

    def stop(*_: object) -> None:  # SIGTERM as Ctrl-C: the finished units' rows kept
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    folder = folder or new_run_dir(args.out, grid.name)
    try:
        meta = run_grid(grid, folder, model_dir, executor=args.executor, workers=args.jobs, address=args.address,
                        command=args.command_line, placement=placement)  # fmt: skip
    except (RunFolderBusy, RayUnavailable) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except KeyboardInterrupt:
        print(f"attnbench: interrupted: the finished units are kept in {folder}/; continue with: "
              f"attnbench generate --resume {folder}", file=sys.stderr)  # fmt: skip
        return Exit.INTERRUPTED
    return _finish(folder, meta)


def _finish(folder: Path, meta: dict, beside: tuple = ()) -> int:
    from attnbench.generation.run import missing_units
    from attnbench.report.generation import terminal_summary, write_generation_report
    from attnbench.runfolder.generations import read_generations

    from attnbench.generation.budgets import knobs

    rows = read_generations(folder)
    missing = missing_units(folder)
    reads = bool(rows.variant.isin([name for name, knob in knobs().items() if knob.reads_only]).any())
    report = write_generation_report(folder, rows, meta, missing or 0, reads, beside)
    print(terminal_summary(rows, terminal_width()))
    if missing:
        print(f"attnbench: {missing} unit(s) of the grid have not run yet: attnbench generate --resume {folder}",
              file=sys.stderr)  # fmt: skip
    print(f"attnbench: {len(rows)} generation(s) in {folder}/ (generations.csv, report.md, plots/); report: {report}",
          file=sys.stderr)  # fmt: skip
    if not (rows.status == "ok").any():
        return Exit.NOTHING_RAN
    return Exit.REGRESSION if (rows.status != "ok").any() else Exit.OK


def _report_only(folder: Path, beside: list[Path]) -> int:
    from attnbench.runfolder.meta import read_meta
    from attnbench.runfolder.results import RunFolderUnreadable
    from attnbench.runfolder.generations import read_generations

    from attnbench.runfolder.folder import RunFolderBusy, take_lock

    from attnbench.report.cross_model import load_side

    try:
        read_generations(folder)
        others = tuple(load_side(other) for other in beside)  # every --beside folder read before any work
        lock = take_lock(folder)  # no report rewritten under a grid that is still being written
    except (RunFolderUnreadable, RunFolderBusy) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    try:
        return _finish(folder, read_meta(folder) if (folder / "meta.json").is_file() else {}, others)
    finally:
        lock.close()
