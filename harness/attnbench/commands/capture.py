"""`attnbench capture`: record per-layer, per-head Q/K/V of a local Hugging Face model, the file the `captured`
input reads (nothing is downloaded)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnbench.commands.arguments import comma_separated
from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `capture` verb: a model folder, the file to write, and the tokens to run (text, ids or random)."""
    capture = subparsers.add_parser(
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
    source.add_argument("--token-ids", type=comma_separated(int), help="comma-separated token ids")
    source.add_argument("--random-tokens", type=int, metavar="N", help="N random token ids (seeded)")
    capture.add_argument("--seq-len", type=int, help="keep the first N tokens (default: all of them)")
    capture.add_argument("--seed", type=int, default=0, help="seed of --random-tokens (default 0)")
    capture.add_argument(
        "--pre-rotary",
        action="store_true",
        help="record the q/k/v projections, before any rotary embedding (position-free attention for a rotary "
        "model); by default q/k are recorded where attention sees them, after it",
    )


def main(args: argparse.Namespace) -> int:
    """The arguments checked, the model run once, the file written; then what it holds and how to use it."""
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
