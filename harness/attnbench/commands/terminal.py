"""The terminal the verbs print to: its width, and attnbench's own warnings as one plain line each."""

from __future__ import annotations

import os
import sys


def terminal_width() -> int:
    """Columns of the terminal: stdout's, or stderr's when stdout is piped (`| tee log`), else $COLUMNS or 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            return os.get_terminal_size(stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            continue
    return int(os.environ.get("COLUMNS", "120") or 120)


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
