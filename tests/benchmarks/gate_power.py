"""How often `attnbench compare --fail-above` raises a false alarm, and how often it catches a real slowdown.

A plugin variant `slowable` is `full` (SDPA) plus genuine extra work: SDPA again over a fraction of the query rows,
set by ATTNBENCH_SLOWDOWN (0.2: about 20% more time). Pairs of runs of one small config are compared:
- A/A: both runs without slowdown; a pair is a false alarm when `compare --fail-above 10` exits 1.
- A/B: B with the slowdown; a pair catches it when the gate exits 1.
- `--loaded`: a busy loop on one core during every run, runs at `--threads 1`.
- `--coverage`: reruns with `--processes 3`; how often each run's speedup interval for `slowable` covers the
  median of the other runs' speedups.

    python tests/benchmarks/gate_power.py --pairs 10 --slowdown 0.2
    python tests/benchmarks/gate_power.py --pairs 10 --slowdown 0.5 --loaded
    python tests/benchmarks/gate_power.py --coverage 5
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PLUGIN = """
    import os
    import torch
    from attnbench.interface import AttentionVariant

    class Slowable(AttentionVariant):
        '''full, plus SDPA again over ATTNBENCH_SLOWDOWN of the query rows: a genuine, known extra cost.'''
        name = "slowable"
        family = "test"
        exact = False  # (an exact variant would have to declare its support pattern)

        def forward(self, q, k, v, *, causal, key_padding_mask):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            extra = float(os.environ.get("ATTNBENCH_SLOWDOWN", "0"))
            rows = int(round(extra * q.shape[-2]))
            if rows:
                torch.nn.functional.scaled_dot_product_attention(q[..., :rows, :], k, v)
            return out
"""
CONFIG = (
    'variants = ["full", "slowable"]\nseq_lens = [512, 1024]\nheads = 2\nhead_dim = 32\nerror = false\n'
)


def plugin_folder(root: Path) -> Path:
    info = root / "slowable_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: slowable-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnbench.variants]\nslowable = slowable_mod:Slowable\n")
    (root / "slowable_mod.py").write_text(textwrap.dedent(PLUGIN))
    return root


def run(config: Path, out: Path, env: dict, *extra: str) -> Path:
    before = set(out.glob("*")) if out.exists() else set()
    subprocess.run([sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(out), "--no-progress",
                    "--no-report", *extra], env=env, check=True, capture_output=True)  # fmt: skip
    (made,) = set(out.glob("*")) - before
    return made


def gate(a: Path, b: Path, env: dict) -> int:
    return subprocess.run([sys.executable, "-m", "attnbench.cli", "compare", str(a), str(b), "--fail-above", "10"],
                          env=env, capture_output=True).returncode  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=0)
    parser.add_argument("--slowdown", type=float, default=0.2)
    parser.add_argument("--loaded", action="store_true")
    parser.add_argument("--coverage", type=int, default=0, metavar="RERUNS")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_folder(root / "plugin")),
                                                             os.environ.get("PYTHONPATH", "")])}  # fmt: skip
        config = root / "gate.toml"
        config.write_text(CONFIG)
        extra = ("--threads", "1") if args.loaded else ()
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.loaded else None
        try:
            if args.pairs:
                codes: dict[str, list[int]] = {"A/A": [], "A/B": []}
                for index in range(args.pairs):
                    for kind, slowdown in (("A/A", "0"), ("A/B", str(args.slowdown))):
                        a = run(config, root / "out", {**env, "ATTNBENCH_SLOWDOWN": "0"}, *extra)
                        b = run(config, root / "out", {**env, "ATTNBENCH_SLOWDOWN": slowdown}, *extra)
                        codes[kind].append(gate(a, b, env))
                    print(f"pair {index + 1}: A/A exit {codes['A/A'][-1]}, A/B exit {codes['A/B'][-1]}", flush=True)
                false_alarms = sum(code == 1 for code in codes["A/A"])
                caught = sum(code == 1 for code in codes["A/B"])
                undecided = sum(code == 4 for code in codes["A/A"] + codes["A/B"])
                print(f"A/A false alarms: {false_alarms}/{args.pairs} = {100 * false_alarms / args.pairs:.0f}%")
                print(f"{100 * args.slowdown:.0f}% slowdown caught: {caught}/{args.pairs} = "
                      f"{100 * caught / args.pairs:.0f}%; exit 4 (inconclusive) in {undecided} comparisons")  # fmt: skip
            if args.coverage:
                import pandas as pd

                runs = [run(config, root / "cov", {**env, "ATTNBENCH_SLOWDOWN": "0.2"}, "--processes", "3", *extra)
                        for _ in range(args.coverage)]  # fmt: skip
                rows = [pd.read_csv(r / "results.csv").query("variant == 'slowable'").set_index("seq_len") for r in runs]
                hits = total = 0
                for i, own in enumerate(rows):
                    for n in own.index:
                        others = [r.loc[n, "speedup"] for j, r in enumerate(rows) if j != i]
                        median = sorted(others)[len(others) // 2]
                        hits += own.loc[n, "speedup_low"] <= median <= own.loc[n, "speedup_high"]
                        total += 1
                        print(f"run {i + 1} N={n}: {own.loc[n, 'speedup']:.3f} "
                              f"[{own.loc[n, 'speedup_low']:.3f}–{own.loc[n, 'speedup_high']:.3f}], others' median "
                              f"{median:.3f}", flush=True)  # fmt: skip
                print(f"intervals covering the other runs' median: {hits}/{total} = {100 * hits / total:.0f}%")
        finally:
            if spinner is not None:
                spinner.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
