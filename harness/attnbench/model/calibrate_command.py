"""The `attnbench calibrate` verb: its arguments, checked before the model loads, and the table it prints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench.exit_status import Exit

DEFAULT_LENGTHS = [512, 2048, 8192]


def add_calibrate_parser(commands: argparse._SubParsersAction) -> None:
    from attnbench.model.texts import TUTORIAL

    calibrate = commands.add_parser(
        "calibrate",
        help="measure a local causal decoder's attention statistics per length (what `realistic` is held to)",
        description="Run a local causal decoder (a Hugging Face folder; nothing is downloaded) over windows of a "
        "text at each length, record every head's attention after the rotary embedding, and write per length the "
        "mean and spread of entropy, local mass, first-token mass and top-key masses: the calibration table "
        "`realistic` (causal) is tested against. Takes minutes per window at 8192 tokens on 2 cores.",
    )
    calibrate.add_argument("model_dir", type=Path, help="a local causal decoder folder (e.g. made by `make model`)")
    calibrate.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    calibrate.add_argument(
        "--seq-lens", type=int, nargs="+", default=DEFAULT_LENGTHS, metavar="N",
        help=f"lengths to measure (default {' '.join(map(str, DEFAULT_LENGTHS))})",
    )  # fmt: skip
    calibrate.add_argument("--windows", type=int, default=3, help="consecutive text windows per length (default 3)")
    calibrate.add_argument(
        "--text-file", type=Path, default=TUTORIAL,
        help=f"UTF-8 prose to run (default: the shipped Python Tutorial prose, {TUTORIAL})",
    )  # fmt: skip


def _unwritable(out: Path) -> list[str]:
    """Why `out` cannot be written (before minutes of work), by writing a scratch file beside it."""
    import tempfile

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent):
            pass
    except OSError as error:
        return [f"--out {out}: its folder cannot be written ({error.strerror or error})"]
    return []


def calibrate_command(args: argparse.Namespace) -> int:
    """`attnbench calibrate`: every argument checked before the model loads; the table written, then printed."""
    from attnbench.model.calibrate import calibrate, write_calibration
    from attnbench.model.capture import CaptureError, model_config

    problems = [f"--seq-lens: {n} must be >= 2" for n in args.seq_lens if n < 2]
    if args.windows < 1:
        problems.append(f"--windows must be >= 1, got {args.windows}")
    if args.out.suffix.lower() != ".json":
        problems.append(f"--out {args.out}: give a .json file")
    problems += _unwritable(args.out)
    try:
        text = args.text_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        problems.append(f"--text-file {args.text_file}: cannot be read as UTF-8 text ({error})")
        text = ""
    try:
        config = model_config(args.model_dir, "attnbench calibrate")
        limit = getattr(config, "max_position_embeddings", None)
        problems += [f"--seq-lens: {n} is beyond the model's {limit} positions" for n in args.seq_lens if limit and n > limit]
        if not (args.model_dir / "tokenizer.json").is_file() and not (args.model_dir / "tokenizer.model").is_file():
            problems.append(f"{args.model_dir} has no tokenizer (tokenizer.json or tokenizer.model)")
    except CaptureError as error:
        problems.append(str(error))
    if problems:
        print("attnbench: " + "; ".join(problems), file=sys.stderr)
        return Exit.USAGE
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(args.model_dir), local_files_only=True)(text, return_tensors="pt").input_ids
    short = [n for n in args.seq_lens if ids.shape[-1] < n]
    if short:
        print(f"attnbench: the text gives {ids.shape[-1]} tokens, fewer than N={short[0]}", file=sys.stderr)
        return Exit.USAGE
    fewer = [n for n in args.seq_lens if ids.shape[-1] // n < args.windows]
    if fewer:
        print(f"attnbench: the text gives {ids.shape[-1]} tokens: "
              + ", ".join(f"N={n} gets {ids.shape[-1] // n} window(s), not {args.windows}" for n in fewer)
              + " (a single window has no spread across windows)", file=sys.stderr)  # fmt: skip
    try:
        table = calibrate(args.model_dir, ids, args.seq_lens, args.windows, args.text_file.name)
    except CaptureError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    write_calibration(args.out, table)
    from attnbench.inputs.statistics import STATISTICS
    from attnbench.report.text import aligned_table

    rows = [
        [n, name, f"{s['mean']:.3f}", f"{s['spread_heads']:.3f}",
         "–" if s["spread_windows"] is None else f"{s['spread_windows']:.3f}",
         " / ".join(f"{v:.2f}" for v in s["by_depth"].values())]
        for n, entry in table["lengths"].items()
        for name, s in entry["statistics"].items() if name in STATISTICS
    ]  # fmt: skip
    print(aligned_table(["N", "statistic", "mean", "spread (heads)", "spread (windows)", "early / mid / late"], rows))
    print(f"attnbench: wrote {args.out}", file=sys.stderr)
    return Exit.OK
