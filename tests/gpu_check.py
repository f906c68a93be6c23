"""`make gpu-check`: on one CUDA GPU, in at most 8 minutes, that every path of attnbench runs there and reports.

Each step is a row of the pass/fail table printed at the end, in this order:
  check NAME DTYPE   the conformance checks `attnbench check` runs (attnbench.conformance), on CUDA, in bfloat16 and
                     float32, for every registered variant (full-xformers, xformers' CUDA kernel, among them)
  sweep              `attnbench run gpu-check` (configs/gpu-check.toml): forward, forward+backward and decode cells in
                     bfloat16, with the run's report; every cell must run ok
  model              `attnbench model --device cuda` on SmolLM2-135M at N=2048 when the model folder exists (`make
                     model`), else skipped with a line
  generate GRID (MODEL, N, bfloat16)   a long grid's smallest cell in the model on the GPU: `attnbench generate
                     GRID --device cuda`, passkey, one sample, full and snapkv at 1/8 of the cache: gemma-long on
                     Gemma-3-270M at N=32768 (`make model MODEL=gemma-3-270m`), else generation-long on SmolLM2-135M
                     at its 8192 positions, else skipped with a line
  check NAME(backend=flex) DTYPE   the same checks through each other backend a variant declares (band and strided
                     through FlexAttention, compiled by Triton: the slowest rows, so near the end)
  generate GRID (MODEL, N, float32)   the same cell in float32, last, if time allows: skipped (not failed)
                     with less than GENERATE_S (150 s) of the budget left
A step that has not started when the budget (--budget-s, 480 s) is spent fails as not run (the sweep, the model and
the generations are stopped at it; a generation gets GENERATE_S at most). Everything lands in one
folder, results/<time>-gpu-check/ (the table as gpu-check.md, every check's table in checks.md, the sweep's run
folder, the model's, the generations', each command's output), kept and printed at the end.

Without CUDA it refuses before any work, in one line, and writes nothing.

exit status: 0 every step passed or was skipped; 1 a step failed (or did not fit the budget); 2 CUDA is not available
here, or configs/gpu-check.toml does not validate (nothing run, nothing written)
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from attnbench.exit_status import Exit
from attnbench.model.known import known_model

CONFIG = "gpu-check"  # the preset configs/gpu-check.toml
DTYPES = ("bfloat16", "float32")
BUDGET_S = 480.0
MODEL_LEN = 2048
MODEL_VARIANTS = "band(window=256,sinks=4),topk"
GENERATE_LEN = 32768  # the long grids' N; a model with fewer positions runs at its own
GENERATE_MODELS = {"Gemma-3-270M": "gemma-long", "SmolLM2-135M": "generation-long"}  # (attnbench.model.known) each
# model's long grid; the first model whose folder exists runs
GENERATE_METHODS, GENERATE_KEEP = "snapkv", "0.125"  # besides full, always run
GENERATE_S = 150.0  # the most a generation may take (a hang leaves the budget to the steps after it); the float32
# one starts only with this much of the budget left
FAILED_CELLS = ("error", "crashed", "timeout", "oom", "unsupported")  # a sweep cell that did not run as planned


@dataclass(frozen=True)
class Step:
    """One row of the table: what ran, pass | fail | skip, its seconds, and why (or what it found)."""

    name: str
    status: str
    seconds: float
    detail: str = ""


# ---- before any work --------------------------------------------------------------------------------


def cuda_refusal() -> str | None:
    """The one line that refuses a machine without CUDA, or None when torch sees a GPU."""
    import torch

    if torch.cuda.is_available():
        return None
    why = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but it sees no GPU"
    return (f"gpu-check: CUDA is not available to torch {torch.__version__} ({why}); run it on a machine with a GPU "
            "and a CUDA build of torch (make clean; make gpu-check TORCH_SPEC=\"torch==2.13.0 --index-url "
            "https://download.pytorch.org/whl/cu126\"); nothing was run or written")  # fmt: skip


# ---- the steps ----------------------------------------------------------------------------------------


def variant_settings(registry: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every registered variant at its defaults, then at each other `backend` it declares (FlexAttention)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in registry.names():
        out.append((name, {}))
        try:
            backend = registry.load(name).hyperparameters.get("backend")
        except Exception:  # a broken plugin: its own row says why
            continue
        if backend is not None and backend.choices:
            out += [(name, {"backend": choice}) for choice in backend.choices if choice != backend.default]
    return out


def check_name(name: str, params: dict[str, Any], dtype: str) -> str:
    """`check band(backend=flex) bfloat16`: a conformance row's name."""
    from attnbench.plan.cells import spec_label

    return f"check {spec_label(name, tuple(sorted(params.items())))} {dtype}"


def refused_on_cuda(variant: Any, dtype: str) -> str | None:
    """Why the variant takes no call on CUDA in `dtype` (a forward call, causal or not, or decode), or None."""
    options = dict(device="cuda", dtype=dtype, padded=False, n_q=8, n_k=8)
    tries = ((False, False), (True, False), (True, True))
    reasons = [variant.unsupported_reason(**options, causal=causal, decode=decode) for causal, decode in tries]
    return None if None in reasons else reasons[0]


def check_step(name: str, results: list[Any], seconds: float) -> Step:
    """A variant's check results (attnbench.conformance.CheckResult) as one row: fail when one failed."""
    failed = [r for r in results if r.status == "fail"]
    if failed:
        return Step(name, "fail", seconds, "; ".join(f"{r.check}: {r.detail}" for r in failed))
    skipped = sum(r.status == "skip" for r in results)
    status = "skip" if results and skipped == len(results) else "pass"
    return Step(name, status, seconds, f"{len(results) - skipped} passed, {skipped} skipped")


def conformance(name: str, params: dict[str, Any], dtype: str, registry: Any, log: list[str]) -> Step:
    """The conformance checks of one variant setting on CUDA in `dtype`; its table appended to `log`."""
    import torch
    from attnbench.conformance import CHECKS, CheckContext, run_check
    from attnbench.report.text import markdown_table

    row = check_name(name, params, dtype)
    started = time.perf_counter()
    try:
        variant_class = registry.load(name)
        make = lambda: variant_class(seed=0, **params)  # noqa: E731
        variant = make()
    except Exception as error:
        return Step(row, "fail", time.perf_counter() - started, f"cannot build it: {type(error).__name__}: {error}")
    if "cuda" not in variant.supports.devices:
        return Step(row, "skip", 0.0, f"runs on {', '.join(variant.supports.devices)} only")
    if dtype not in variant.supports.dtypes:
        return Step(row, "skip", 0.0, f"declares no {dtype} ({', '.join(variant.supports.dtypes)})")
    if reason := refused_on_cuda(variant, dtype):  # declared, yet refused here: a missing kernel or package
        return Step(row, "fail", time.perf_counter() - started, reason)
    context = CheckContext(make, torch.device("cuda"), getattr(torch, dtype))
    results = [run_check(check, context) for check in CHECKS]
    torch.cuda.synchronize()
    log += [f"## {row}", "", markdown_table(["check", "result", "detail"], [[r.check, r.status, r.detail] for r in
                                                                          results]), ""]  # fmt: skip
    return check_step(row, results, time.perf_counter() - started)


def run_logged(command: list[str], log: Path, timeout: float) -> tuple[int | None, float]:
    """(exit status, seconds) of a command, its output in `log`; None when it ran past `timeout`."""
    started = time.perf_counter()
    with log.open("w") as out:
        try:
            code: int | None = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    return code, time.perf_counter() - started


def sweep_step(code: int | None, runs: Path, seconds: float, log: Path) -> Step:
    """`attnbench run gpu-check`'s row: its exit status, every cell's status in results.csv, its report."""
    name = "sweep (fwd, fwd+bwd, decode; report)"
    folders = sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    if code is None:
        return Step(name, "fail", seconds, f"did not finish within the budget ({log})")
    if not folders or not (folders[-1] / "results.csv").is_file():
        return Step(name, "fail", seconds, f"exit {code}, no results.csv ({log})")
    with (folders[-1] / "results.csv").open() as rows:
        statuses = [row["status"] for row in csv.DictReader(rows)]
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    said = ", ".join(f"{count} {status}" for status, count in counts.items())
    failed = sum(counts.get(status, 0) for status in FAILED_CELLS)
    report = folders[-1] / "report.md"
    ok = code == 0 and failed == 0 and report.is_file()
    missing = "" if report.is_file() else ", no report.md"
    return Step(name, "pass" if ok else "fail", seconds, f"exit {code}: {said}{missing} -> {folders[-1]}")


def model_step(model_dir: Path, folder: Path, timeout: float) -> Step:
    """`attnbench model` at N=MODEL_LEN on the shipped prose, or a skip when the model folder is missing."""
    from importlib import resources

    name = f"model (SmolLM2-135M, N={MODEL_LEN})"
    if not (model_dir / "config.json").is_file():
        return Step(name, "skip", 0.0, f"no model folder at {model_dir}: `make model` makes it")
    text = resources.files("attnbench.model.texts") / "python_tutorial.txt"
    command = [sys.executable, "-m", "attnbench.cli", "model", str(model_dir), "--variants", MODEL_VARIANTS,
               "--text-file", str(text), "--seq-len", str(MODEL_LEN), "--device", "cuda",
               "--out", str(folder / "model")]  # fmt: skip
    code, seconds = run_logged(command, folder / "model.log", timeout)
    detail = "did not finish within the budget" if code is None else f"exit {code}"
    return Step(name, "pass" if code == 0 else "fail", seconds, f"{detail}, on the GPU ({folder / 'model.log'})")


@dataclass(frozen=True)
class Generation:
    """What the generate steps run: the first model of GENERATE_MODELS whose folder exists, its long grid, at N =
    GENERATE_LEN or its positions, whichever is fewer (`found`: else the line saying which folders are missing)."""

    name: str
    folder: Path
    seq_len: int
    grid: str

    @classmethod
    def found(cls, folders: dict[str, Path]) -> "Generation | str":
        import json

        for name in GENERATE_MODELS:
            config = folders[name] / "config.json"
            if config.is_file():
                limit = json.loads(config.read_text()).get("max_position_embeddings") or GENERATE_LEN
                return cls(name, folders[name], min(GENERATE_LEN, limit), GENERATE_MODELS[name])
        missing = " or ".join(str(folders[name]) for name in GENERATE_MODELS)
        makes = ", ".join(f"`{known_model(name).make}` makes {name}" for name in GENERATE_MODELS)
        return f"no model folder at {missing}: {makes}"


def generate_name(generation: Generation | str, dtype: str) -> str:
    """`generate gemma-long (Gemma-3-270M, N=32768, bfloat16)`: a generate step's row (`generate bfloat16` without a
    model)."""
    if isinstance(generation, str):
        return f"generate {dtype}"
    return f"generate {generation.grid} ({generation.name}, N={generation.seq_len}, {dtype})"


def generate_step(generation: Generation | str, dtype: str, folder: Path, left: float,
                  optional: bool = False) -> Step:  # fmt: skip
    """`attnbench generate GRID --device cuda`: the smallest cell of the found model's long grid in `dtype` (at most
    GENERATE_S), or a skip saying which folders are missing; `optional` (if time allows): skipped with less than
    GENERATE_S left."""
    name = generate_name(generation, dtype)
    if isinstance(generation, str):
        return Step(name, "skip", 0.0, generation)
    if optional and left < GENERATE_S:
        return Step(name, "skip", 0.0, f"not run: {left:.0f} s of the budget left, under the {GENERATE_S:g} s it may "
                    "take")  # fmt: skip
    out, log = folder / f"generate-{dtype}", folder / f"generate-{dtype}.log"
    command = [sys.executable, "-m", "attnbench.cli", "generate", generation.grid, "--model", str(generation.folder),
               "--tasks", "passkey", "--seq-lens", str(generation.seq_len), "--samples", "1",
               "--methods", GENERATE_METHODS, "--keep", GENERATE_KEEP, "--device", "cuda", "--dtype", dtype,
               "--jobs", "1", "--out", str(out)]  # fmt: skip
    code, seconds = run_logged(command, log, min(left, GENERATE_S))
    return generation_row(name, code, out, seconds, log)


def generation_row(name: str, code: int | None, out: Path, seconds: float, log: Path) -> Step:
    """A generate step's row: its exit status and each row of generations.csv (method, share, status, score); it
    passes when the command exited 0 and every row ran ok."""
    if code is None:
        return Step(name, "fail", seconds, f"did not finish within its {GENERATE_S:g} s or the budget ({log})")
    folders = sorted(p for p in out.iterdir() if p.is_dir()) if out.is_dir() else []
    found = folders[-1] / "generations.csv" if folders else None
    if found is None or not found.is_file():
        return Step(name, "fail", seconds, f"exit {code}, no generations.csv ({log})")
    with found.open() as rows:
        read = list(csv.DictReader(rows))
    said = ", ".join(f"{r['method']}{' at ' + r['share'] if r['share'] else ''}: "
                     + (f"score {float(r['score']):g}" if r["status"] == "ok" and r["score"] else r["status"])
                     for r in read)  # fmt: skip
    ok = code == 0 and bool(read) and all(r["status"] == "ok" for r in read)
    return Step(name, "pass" if ok else "fail", seconds, f"exit {code}: {said or 'no rows'} -> {folders[-1]}")


def within_budget(steps: Iterable[tuple[str, Callable[[float], Step]]], budget_s: float,
                  clock: Callable[[], float] = time.monotonic,
                  optional: frozenset[str] = frozenset()) -> Iterator[Step]:  # fmt: skip
    """Each step run with the seconds left (name, run(seconds_left)); one not started in time fails as not run, or
    is skipped when its name is `optional` (run if time allows)."""
    deadline = clock() + budget_s
    for name, run in steps:
        left = deadline - clock()
        if left > 0:
            yield run(left)
        else:
            yield Step(name, "skip" if name in optional else "fail", 0.0, f"not run: past the {budget_s:g} s budget")


def table(steps: list[Step]) -> str:
    """The pass/fail table (markdown), then one line of counts."""
    from attnbench.report.text import markdown_table

    rows = [[s.name, s.status, f"{s.seconds:.1f}", s.detail] for s in steps]
    counts = {status: sum(s.status == status for s in steps) for status in ("pass", "fail", "skip")}
    total = sum(s.seconds for s in steps)
    return markdown_table(["step", "result", "s", "detail"], rows) + (
        f"\n\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; {total:.0f} s in the steps"
    )


def exit_status(steps: list[Step]) -> int:
    return Exit.REGRESSION if any(s.status == "fail" for s in steps) else Exit.OK


# ---- the command ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tests/gpu_check.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[-1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    default_model = Path(os.environ.get("ATTNBENCH_MODEL_DIR") or Path.home() / ".cache/attnbench/SmolLM2-135M")
    parser.add_argument("--out", type=Path, default=Path("results"), help="where its folder goes (default: results)")
    parser.add_argument("--model-dir", type=Path, default=default_model, help=f"default: {default_model}")
    gemma = known_model("Gemma-3-270M").folder
    parser.add_argument("--gemma-dir", type=Path, default=gemma, help=f"the generate steps' first choice (default: "
                        f"{gemma}); without it they run on --model-dir")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"seconds for all steps ({BUDGET_S:g})")
    parser.add_argument("--preflight", action="store_true", help="only say whether CUDA is usable here (exit 0 or 2)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if refusal := cuda_refusal():
        print(refusal, file=sys.stderr)
        return Exit.USAGE
    import torch

    from attnbench.plan.config import ConfigError, load_config
    from attnbench.registry import registry
    from attnbench.runfolder.folder import new_run_dir

    device = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    if args.preflight:
        print(f"gpu-check: CUDA is available: {device}")
        return Exit.OK
    try:
        load_config(CONFIG)  # what `attnbench run gpu-check` will run, validated before any work
    except ConfigError as error:
        print(f"gpu-check: {error}", file=sys.stderr)
        return Exit.USAGE
    folder = new_run_dir(args.out, "gpu-check")
    print(f"gpu-check: {device}; budget {args.budget_s:g} s; writing {folder}/", flush=True)
    checks: list[str] = [f"# conformance on CUDA ({device})", ""]

    def check(name: str, params: dict[str, Any], dtype: str) -> tuple[str, Callable[[float], Step]]:
        return check_name(name, params, dtype), lambda left: conformance(name, params, dtype, registry, checks)

    settings = variant_settings(registry)  # each variant at its defaults; the other backends (flex) compile, so last
    default, other = [s for s in settings if not s[1]], [s for s in settings if s[1]]

    def sweep(left: float) -> Step:
        torch.cuda.empty_cache()  # the checks' cached blocks go back before the sweep's process starts
        command = [sys.executable, "-m", "attnbench.cli", "run", CONFIG, "--out", str(folder / "sweep")]
        code, seconds = run_logged(command + ["--no-progress"], folder / "sweep.log", left)
        return sweep_step(code, folder / "sweep", seconds, folder / "sweep.log")

    generation = Generation.found({"Gemma-3-270M": args.gemma_dir, "SmolLM2-135M": args.model_dir})

    def generate(dtype: str, optional: bool = False) -> tuple[str, Callable[[float], Step]]:
        def run(left: float) -> Step:
            torch.cuda.empty_cache()  # the checks' cached blocks go back before the generation's process starts
            return generate_step(generation, dtype, folder, left, optional)

        return generate_name(generation, dtype), run

    steps = [check(name, params, dtype) for name, params in default for dtype in DTYPES]
    steps += [("sweep", sweep), ("model", lambda left: model_step(args.model_dir, folder, left)), generate("bfloat16")]
    steps += [check(name, params, dtype) for dtype in DTYPES for name, params in other]
    late = generate("float32", optional=True)  # if time allows
    steps += [late]
    done = []
    for step in within_budget(steps, args.budget_s, optional=frozenset({late[0]})):
        done.append(step)
        print(f"gpu-check: {step.status:4} {step.name} ({step.seconds:.1f} s) {step.detail}", flush=True)
    (folder / "checks.md").write_text("\n".join(checks) + "\n")
    said = table(done)
    (folder / "gpu-check.md").write_text(f"# gpu-check on {device}\n\n{said}\n")
    print(f"\n{said}\ngpu-check: kept in {folder}/ (gpu-check.md, checks.md, sweep/, the logs)")
    return exit_status(done)


if __name__ == "__main__":
    sys.exit(main())
