"""One cell in its own process (`attnbench run --isolate`): config and cell key on stdin, the row as JSON
on the last line of stdout. The parent turns a crash or a hang of this process into that cell's row."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from attnbench.config import parse_config
from attnbench.machine import retain_freed_memory
from attnbench.sweep import Sweep


def main() -> int:
    request = json.loads(sys.stdin.read())
    config = parse_config(request["config"], source="isolated cell")
    cell = next(c for c in config.cells() if c.key() == request["cell"])
    retain_freed_memory()
    row = Sweep(config, run_dir=None, progress=False).run_cell(cell)
    print(json.dumps(asdict(row)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
