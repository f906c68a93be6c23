"""`attnbench reproduce`, its arguments: the body is attnbench.reproduce.command."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `reproduce` verb: the claims to check, --list, --quick, where their run folders go."""
    reproduce = subparsers.add_parser(
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
        "--quick", action="store_true", help="smaller N, fewer seeds or rounds (about 2 min on 2 cores for the "
        "catalogue without the models; SmolLM2's three generation claims add about 3 min; quest-passkey-10k, about "
        "15 min on Gemma-3-270M even so, runs only when named)",
    )
    reproduce.add_argument(
        "--out", type=Path, default=Path("results") / "reproduce", help="folder for the claims' run folders "
        "(default: results/reproduce)",
    )  # fmt: skip
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    """Check the chosen claims (attnbench.reproduce.command.command_reproduce)."""
    from attnbench.reproduce.command import command_reproduce

    return command_reproduce(
        args.claims, args.out, quick=args.quick, progress=not args.no_progress, list_only=args.list
    )
