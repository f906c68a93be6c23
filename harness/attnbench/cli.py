"""The `attnbench` command: the top-level parser, the dispatch to each verb (attnbench.commands, one module a
verb), the exit status of what a verb raises, and the entry point that cannot hang."""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

from attnbench import __version__
from attnbench.commands import (
    calibrate,
    capture,
    check,
    compare,
    generate,
    heads,
    listing,
    model,
    presets,
    recall,
    report,
    reproduce,
    run,
)
from attnbench.commands.arguments import EXAMPLES
from attnbench.commands.terminal import plain_warnings
from attnbench.exit_status import Exit

# each verb's module (`add_parser`, `main`), in the order --help lists them
VERBS: dict[str, ModuleType] = {
    "list": listing,
    "presets": presets,
    "run": run,
    "report": report,
    "compare": compare,
    "check": check,
    "capture": capture,
    "calibrate": calibrate,
    "heads": heads,
    "model": model,
    "reproduce": reproduce,
    "recall": recall,
    "generate": generate,
}


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the top-level options and each verb's sub-parser."""
    parser = argparse.ArgumentParser(
        prog="attnbench",
        description="Time, peak memory and error of efficient attention variants versus exact softmax attention.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"attnbench {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for verb in VERBS.values():
        verb.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), run the verb, and return its exit status; what a verb raises
    past its own handling (Ctrl-C, a closed pipe, an unreadable run folder, a full disk) becomes a one-line message."""
    from attnbench.runfolder.folder import RunFolderUnreadable

    argv = sys.argv[1:] if argv is None else list(argv)
    plain_warnings()
    args = build_parser().parse_args(argv)
    args.command_line = ["attnbench", *argv]  # recorded in meta.json: the run's reproduce line
    try:
        return VERBS[args.command].main(args)
    except KeyboardInterrupt:  # outside a run's measurement (which handles it itself): stop quietly
        print("\nattnbench: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (so the interpreter's final flush stays quiet)
        return Exit.OK
    except RunFolderUnreadable as error:  # a hand-edited or damaged run folder
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except OSError as error:  # a read-only or full disk, a name too long: what failed and where, never a traceback
        where = f" {error.filename}" if error.filename else ""
        print(f"attnbench: cannot read or write{where}: {error.strerror or error}", file=sys.stderr)
        for note in getattr(error, "__notes__", []):  # what was kept, and how to go on (added where it is known)
            print(f"attnbench: {note}", file=sys.stderr)
        return Exit.USAGE


def entry() -> None:
    """The `attnbench` command: `main`, then an exit that cannot hang.

    An interpreter's ordinary exit first waits for every non-daemon thread, then runs each native library's
    destructors: OpenBLAS (numpy's) shuts its thread pool down there, and about 1 run in 70 hung forever at that
    point after writing its report, with torch's OpenMP workers alive beside it. By the time `main` returns,
    everything attnbench writes is closed and synced (results and samples fsynced per group, the rest replaced
    atomically), so the process flushes its output, runs Python's exit hooks (a plugin's own clean-up still
    runs) and ends with `os._exit`: no thread is waited for, no destructor runs.
    """
    import atexit
    import traceback

    try:
        code = main()
    except SystemExit as stop:  # argparse: --help (0), a usage error (2)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:  # Ctrl-C before main's own handling (while modules import)
        print("\nattnbench: interrupted", file=sys.stderr)
        code = Exit.INTERRUPTED
    except BaseException:  # a bug: its traceback, and Python's own exit status for it
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:  # None: started with that stream closed (`attnbench list >&-`)
                    stream.flush()
            except (OSError, ValueError):  # a closed pipe or stream: nothing left to say
                pass
        os._exit(code)


if __name__ == "__main__":
    entry()
