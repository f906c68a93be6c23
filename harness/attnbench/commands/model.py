"""`attnbench model`, wired to the command: its parser is attnbench.model.arguments, its body
attnbench.model.command."""

from __future__ import annotations

import argparse

from attnbench.commands.terminal import terminal_width
from attnbench.model.arguments import add_model_parser


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `model` verb (attnbench.model.arguments.add_model_parser)."""
    add_model_parser(subparsers)


def main(args: argparse.Namespace) -> int:
    """Swap each variant into a local model (attnbench.model.command.model_command), its table cut to the terminal."""
    from attnbench.model.command import model_command

    return model_command(args, terminal_width())
