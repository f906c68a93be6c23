"""The exit statuses of the `attnbench` command, declared once: the codes every command returns and the table
`attnbench --help` prints are both read from here."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    REGRESSION = 1
    USAGE = 2
    NOTHING_RAN = 3
    INCONCLUSIVE = 4
    UNFINISHED = 5
    INTERRUPTED = 130


MEANING: dict[Exit, tuple[str, ...]] = {  # what each status means, per command: the lines --help prints
    Exit.OK: (
        "success",
    ),
    Exit.REGRESSION: (
        "compare --fail-above: a regression; check: a check failed; reproduce: a claim does not hold here;",
        "recall: a training failed or a sanity check does not hold (the report says which);",
        "generate: a generation failed (its row says why; the rest of the grid went on)",
    ),
    Exit.USAGE: (
        "usage: a bad argument or config (every problem listed before any work), a file or folder that cannot",
        "be read or written (read-only, full disk, name too long: the path and why), not a run folder, a run",
        "folder another process writes, a Ray cluster that does not answer; check: the variant cannot be",
        "checked on this machine; model, generate: a model, text, task or variant it cannot use (with the reason)",
    ),
    Exit.NOTHING_RAN: (
        "run, report: no cell ran ok (every cell failed, was unsupported or skipped; report: or"
        " none finished;",
        "run --dry-run: no cell would run);",
        "model: no variant ran ok; recall: no training ran ok; generate: no generation ran ok",
    ),
    Exit.INCONCLUSIVE: (
        "compare --fail-above: no regression found, but some cells were inconclusive (their"
        " intervals too wide",
        "to tell same from changed); the message says how many; or no cell was in both runs to compare",
    ),
    Exit.UNFINISHED: (
        "report: the run is unfinished (interrupted or killed before every planned cell was recorded): its verdict,",
        "summary.md and report.md say which cells are missing, and the --resume command that measures them",
    ),
    Exit.INTERRUPTED: (
        "run: interrupted (Ctrl-C); finished cells are kept, the message gives the --resume command;",
        "reproduce: interrupted; the claims' run folders are kept, run it again to continue;",
        "model: interrupted, model.csv keeps the variants finished;",
        "recall: interrupted, trainings.csv keeps the trainings finished (--resume DIR continues);",
        "generate: interrupted, generations.csv keeps the units finished (--resume DIR continues)",
    ),
}


def exit_status_text() -> str:
    """The table for --help: each status, then its meaning, continued lines indented under it."""
    lines = ["exit status:"]
    for code, meaning in MEANING.items():
        first, *rest = meaning
        lines.append(f"  {int(code):<5}{first}")
        lines += [f"       {line}" for line in rest]
    return "\n".join(lines) + "\n"
