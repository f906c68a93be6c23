"""`attnbench calibrate`, wired to the command: its parser and body are attnbench.model.calibrate_command."""

from __future__ import annotations

import argparse

from attnbench.model.calibrate_command import add_calibrate_parser


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `calibrate` verb (attnbench.model.calibrate_command.add_calibrate_parser)."""
    add_calibrate_parser(subparsers)


def main(args: argparse.Namespace) -> int:
    """Measure a local decoder's attention statistics (attnbench.model.calibrate_command.calibrate_command)."""
    from attnbench.model.calibrate_command import calibrate_command

    return calibrate_command(args)
