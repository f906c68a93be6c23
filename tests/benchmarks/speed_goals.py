"""Issue 58's goals in one command: the benchmarks that measure them, one after another.

Each times its variants in turns (a ratio is never taken across two runs); their tables print as they come.

1. decode: every KV method's fused step against `full`'s and its share of the bytes (goal /share <= 1.5 at N >= 4K),
   Quest and H2O against their read roofline (<= 2) — `decode_speed_goals.py`;
2. the RNN states' fused steps against their read roofline (<= 3) — `recurrent_step_speed.py`;
3. the forward calls at 16K: strided and BigBird >= 8x full, Performer >= 20x — `forward_speed_goals.py`; topk >= 6x
   and its kernel's rate — `choices_targets.py --topk-limits`;
4. the forward peaks of band, band+sinks and topk against exact attention's at 8K and 16K — `sparse_memory.py`.

Run: `.venv/bin/python tests/benchmarks/speed_goals.py [--threads 1] [--quick]` (about 10 minutes; `--quick`: N = 8192
where a goal allows, shorter timing, about 4). On a busy machine pass `--threads 1` (a step's second thread waits for
the scheduler).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=0, help="torch threads for every benchmark (0: each one's default)")
    parser.add_argument("--quick", action="store_true", help="fewer lengths and shorter timing")
    args = parser.parse_args()
    threads = ["--threads", str(args.threads)] if args.threads else []
    runs = [
        ["decode_speed_goals.py", "--seq-lens", "8192" if args.quick else "4096,8192,16384", "--min-run-time",
         "0.3" if args.quick else "0.5", *threads],
        ["recurrent_step_speed.py", "--seq-lens", "8192", "--threads", str(args.threads or 1)],
        ["forward_speed_goals.py", "--min-run-time", "3" if args.quick else "6", *threads],
        ["choices_targets.py", "--topk-limits", "--seq-lens", "16384", "--min-run-time", "1" if args.quick else "2"],
        ["sparse_memory.py", "--seq-lens", "8192" if args.quick else "8192,16384"],
    ]  # fmt: skip
    failed = []
    for script, *options in runs:
        print(f"\n## {script} {' '.join(options)}\n", flush=True)
        if subprocess.run([sys.executable, str(HERE / script), *options]).returncode:
            failed.append(script)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
