"""`attnbench presets`: the sweep presets shipped with attnbench, each with its measured run time and what it sweeps."""

from __future__ import annotations

import argparse

from attnbench.commands.terminal import terminal_width
from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `presets` verb (it takes no arguments)."""
    subparsers.add_parser(
        "presets", help="the sweep presets shipped with attnbench", description="List the presets `run` accepts."
    )


def main(args: argparse.Namespace) -> int:
    """The presets as a table cut to the terminal's width, then how to run or copy one."""
    from attnbench.plan.config import preset_descriptions
    from attnbench.report.text import aligned_table

    rows = [[name, time, text] for name, (text, time) in preset_descriptions().items()]
    headers = ["preset", "run time measured on 2 cores", "what it sweeps"]
    print(aligned_table(headers, rows, width=terminal_width(), breakable=(2,)))
    print("\nrun one with `attnbench run NAME`; copy one from configs/ to start your own TOML file")
    return Exit.OK
