"""The arguments of `attnbench model`: what the study measures by default, and what is optional because it is slow."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnbench.model.known import known_names, model_argument

DEFAULT_SEQ_LEN = 512
DEFAULT_MIN_RUN_TIME = 1.0


def int_list(text: str) -> list[int]:
    """'2048' or '2048,4096': one or more integers (argparse's type: a bad value is a usage error)."""
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers (comma-separated), got {text!r}") from None


def add_model_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The `model` verb and its arguments, added to the command's sub-parsers."""
    model = commands.add_parser(
        "model",
        help="swap each variant into a local Hugging Face model: perplexity at each length, error by layer",
        description="Run text through a local model with exact attention and with each variant in every "
        "self-attention layer, at one or more lengths (the first N tokens, each length with its own exact "
        "model): the perplexity and its ratio to the exact model's, and the error of each layer's hidden state "
        "and of the logits. Single-layer swaps (--per-layer) and timing (--time) are off by default: each costs "
        "many more forward passes. A length whose estimated memory exceeds the limit is refused before any "
        "work. Writes model.csv, meta.json and a report. Nothing is downloaded and no remote code runs.",
    )
    model.add_argument("model_dir", type=model_argument, metavar="MODEL",
                       help="a local model folder (config.json, weights, tokenizer), or a known model's name "
                       f"({known_names()}: its folder as `make model` writes it)")  # fmt: skip
    model.add_argument(
        "--variants",
        required=True,
        help="comma-separated variant settings, e.g. 'band(window=64),lsh,performer(features=128)'",
    )
    text = model.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="text to tokenize (needs a tokenizer in the model folder)")
    text.add_argument("--text-file", type=Path, help="a UTF-8 text file to tokenize")
    text.add_argument("--token-ids", type=int_list, help="comma-separated token ids")
    text.add_argument("--random-tokens", type=int, metavar="N", help="N random token ids (seeded)")
    model.add_argument(
        "--seq-len",
        type=int_list,
        nargs="+",
        default=[[DEFAULT_SEQ_LEN]],
        metavar="N",
        help=f"one or more lengths (e.g. --seq-len 2048 4096 8192): the first N tokens of the input, each with "
        f"its own exact model; a length past the input is cut to it (default {DEFAULT_SEQ_LEN})",
    )
    model.add_argument(
        "--per-layer",
        action="store_true",
        help="also swap one layer at a time (a forward pass per layer and variant): which layers tolerate it",
    )
    model.add_argument(
        "--time",
        action="store_true",
        help="also time the forward pass with each variant in turns with the exact one (paired speedup)",
    )
    model.add_argument(
        "--min-run-time",
        type=float,
        default=DEFAULT_MIN_RUN_TIME,
        help=f"with --time: seconds of timing per pair, at least 5 rounds (default {DEFAULT_MIN_RUN_TIME:g})",
    )
    model.add_argument(
        "--memory-limit-gb",
        type=float,
        default=None,
        help="refuse lengths whose estimated peak memory exceeds this (default: 80%% of the memory available now)",
    )
    model.add_argument(
        "--device", default="cpu", choices=("cpu", "cuda"),
        help="where the model and its swapped attention run (default cpu; cuda: the current GPU, float32 both ways)",
    )
    model.add_argument("--seed", type=int, default=0, help="seed of --random-tokens and of the masked positions")
    model.add_argument("--out", type=Path, default=Path("results"), help="folder for run folders (default: results)")
    return model
