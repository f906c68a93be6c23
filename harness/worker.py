"""One comparison group in its own process (`attnbench run --isolate`).

stdin: the serialized group (its cells' keys and the settings). The result channel is a file named on the
command line, never stdout (a plugin may print): a JSON line per step started ({"step", "cell"}), so the
parent knows which cell was in flight if this process dies, then one line with the rows and samples.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from attnbench.config import Settings
from attnbench.machine import retain_freed_memory
from attnbench.measure import measure_group
from attnbench.plan import Cell, Group
from attnbench.registry import registry


def main() -> int:
    channel = Path(sys.argv[1]).open("a")

    def say(record: dict) -> None:
        channel.write(json.dumps(record) + "\n")
        channel.flush()

    request = json.loads(sys.stdin.read())
    group = Group(tuple(Cell.from_key(key) for key in request["cells"]), request.get("timed", True))
    retain_freed_memory()
    result = measure_group(
        group, Settings(**request["settings"]), registry, progress=lambda step, cell: say({"step": step, "cell": cell})
    )
    say({"rows": [asdict(row) for row in result.rows], "samples": result.samples})
    return 0


if __name__ == "__main__":
    sys.exit(main())
