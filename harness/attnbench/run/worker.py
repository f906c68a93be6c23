"""One comparison group in its own process (`attnbench run --isolate`), and how a group and its result travel
as plain data (to this process, and to a Ray task).

stdin: the serialized group (its cells' keys and the settings). The result channel is a file named on the
command line, never stdout (a plugin may print): a JSON line per step started ({"step", "cell"}), so the
parent knows which cell was in flight if this process dies, then one line with the rows and samples.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attnbench.measure.dispatch import measure_group
from attnbench.measure.group import GroupResult
from attnbench.measure.machine import known_peaks, remember_peaks
from attnbench.plan.cells import Cell, Group
from attnbench.plan.config import Settings
from attnbench.registry import registry
from attnbench.runfolder.rows import Row


def group_request(group: Group, settings: Settings) -> dict[str, Any]:
    """A group to measure, as JSON-able data: its cells' keys, whether it is timed, the settings, and the machine
    peaks known here (the guard's time estimates: a worker need not measure them again)."""
    return {
        "settings": asdict(settings),
        "cells": [c.key() for c in group.cells],
        "timed": group.timed,
        "peaks": known_peaks(),
    }


def read_group_request(request: dict[str, Any]) -> tuple[Group, Settings]:
    remember_peaks(request.get("peaks", {}))
    group = Group(tuple(Cell.from_key(key) for key in request["cells"]), request.get("timed", True))
    return group, Settings(**request["settings"])


def result_record(result: GroupResult) -> dict[str, Any]:
    """A group's result as JSON-able data: its rows and timing samples."""
    return {"rows": [asdict(row) for row in result.rows], "samples": result.samples}


def read_result_record(record: dict[str, Any]) -> GroupResult:
    return GroupResult([Row(**row) for row in record["rows"]], [tuple(s) for s in record["samples"]])


def main() -> int:
    channel = Path(sys.argv[1]).open("a")

    def say(record: dict) -> None:
        channel.write(json.dumps(record) + "\n")
        channel.flush()

    group, settings = read_group_request(json.loads(sys.stdin.read()))
    result = measure_group(group, settings, registry, progress=lambda step, cell: say({"step": step, "cell": cell}))
    say(result_record(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
