"""The terminal the verbs print to: its width, and attnbench's own warnings as one plain line each."""

from __future__ import annotations

import os
import sys
from typing import Any


MIN_WIDTH = 20  # narrower than this, nothing can be laid out: taken as this


def terminal_width() -> int:
    """Columns to lay text out in: $COLUMNS when it is a whole number (as `shutil.get_terminal_size` reads it), else
    the terminal's, stdout's or stderr's when stdout is piped (`| tee log`), else 120; never below MIN_WIDTH."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return max(MIN_WIDTH, int(given))
    for stream in (sys.stdout, sys.stderr):
        try:
            return max(MIN_WIDTH, os.get_terminal_size(stream.fileno()).columns)
        except (OSError, ValueError, AttributeError):
            continue
    return 120


def plain_warnings() -> None:
    """attnbench's own warnings (a captured file's) as one line each, once per message; others as Python shows them."""
    import warnings

    from attnbench.inputs.captured import CapturedFileWarning

    shown, printed = warnings.showwarning, set()

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        if issubclass(category, CapturedFileWarning):
            if str(message) not in printed:
                printed.add(str(message))
                print(f"attnbench: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    if getattr(shown, "__name__", "") != "show":
        warnings.showwarning = show


def grid_table(descriptions: dict[str, tuple[str, str]], what: str) -> str:
    """`--list` of a grid verb (`recall`, `generate`): each shipped grid, its measured run time, and `what` it does."""
    from attnbench.report.text import aligned_table

    rows = [[name, time_, text] for name, (text, time_) in descriptions.items()]
    return aligned_table(["grid", "run time measured on 2 cores", what], rows, width=terminal_width(), breakable=(2,))


def resume_problem(resume: Any, grid: str | None, grid_file: str, what: str) -> str | None:
    """Why `--resume DIR` cannot continue (a grid given too, or DIR without its grid file), None when it can."""
    if grid is not None:
        return f"--resume continues DIR's own grid (DIR/{grid_file}): give no grid with it"
    if not (resume / grid_file).is_file():
        return f"{resume} is not {what} folder (no {grid_file})"
    return None
