"""What several verbs' parsers share: the examples of --help, argparse's list and true/false/both types, the
accuracy-budget flags, and the check that an argument is a run folder."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnbench.exit_status import exit_status_text

EXAMPLES = (
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
)  # the epilog of `attnbench --help` and of `attnbench run --help`


def comma_separated(kind: type) -> Callable[[str], list[Any]]:
    """argparse's type for '512,1024': a list of `kind` (a bad item is a usage error naming the type)."""

    def parse(text: str) -> list[Any]:
        items = text.split(",")
        if not all(item.strip() for item in items):
            raise argparse.ArgumentTypeError(f"an empty item in {text!r} (two commas in a row, or one at an end?)")
        try:
            return [kind(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}, got {text!r}"
            ) from None

    return parse


def true_false_both(text: str) -> list[bool]:
    """true, false or both: the values of a boolean axis (`--causal`, `--compile`)."""
    choices = {"true": [True], "false": [False], "both": [False, True]}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"expected true, false or both, got {text!r}")
    return choices[text.lower()]


def add_budget_flags(command: argparse.ArgumentParser, default: str) -> None:
    """--max-error, --min-speedup and --min-recall: the verdict's accuracy budget, the speedup asked and the needle
    recall required (attnbench.plan.budget)."""
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
    command.add_argument(
        "--min-recall",
        type=float,
        metavar="R",
        help="recommend only variants that retrieve at least this share of the planted needles at that N (input "
        "`needles`; 0 < R <= 1, e.g. 0.9)",
    )


def run_folder(path: Path) -> Path | None:
    """`path` when it holds a run's results.csv; else None, after saying on stderr where runs live."""
    if not (path / "results.csv").is_file():
        print(
            f"attnbench: {path} is not a run folder (no results.csv); runs live in results/<run-id>/", file=sys.stderr
        )
        return None
    return path
