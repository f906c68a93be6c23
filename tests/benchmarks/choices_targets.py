"""Issue 25's speed targets, measured in one run, in turns: each variant's speedup over full (fused SDPA) and what
attention sinks cost a band, fwd, float32, B=1, H=8, D=64.

Targets: band with 4 sinks <= 1.10x the same band; Nyströmformer (m=64) >= 15x full, BigBird (block 64, 3 window +
2 global + 3 random blocks) >= 8x full and block top-k (block 64, top 8) >= 6x full at N=16384, its block selection
(scores and top-k, timed alone in the same turns) <= 30% of its time.
`topk(select_for=block)` (issue 48: one selection per query block) >= 6x full at N=16384 causal.
Run: `.venv/bin/python tests/benchmarks/choices_targets.py [--seq-lens 4096,16384] [--min-run-time 5] [--causal]`; prints a
Markdown table: median ms per call, and paired ratios (median over rounds) with their order-statistic intervals.
`--topk-limits` (issue 58): what bounds top-k's speedup, causal, in turns: its whole call, its selection alone, and the
fused kernel alone on the tiles it attends to (gathered beforehand: (query chunk, key block) tiles, and the own
blocks), with each one's rate in scores per second beside full's; and the kernel's rate on 64-key tiles of r queries.
"""

from __future__ import annotations

import argparse

import torch
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread, paired_speedup

SETTINGS = {  # label -> (variant, hyperparameters)
    "full": ("full", {}),
    "band(window=256)": ("band", {"window": 256}),
    "band(window=256, sinks=4)": ("band", {"window": 256, "sinks": 4}),
    "nystromformer(landmarks=64)": ("nystromformer", {"landmarks": 64}),
    "bigbird": ("bigbird", {}),  # block 64, 3 window + 2 global + 3 random blocks: the paper's
    "topk": ("topk", {}),  # block 64, top 8 besides its own block
    "topk(select_for=block)": ("topk", {"select_for": "block"}),  # the choice shared by each query block of 64
}
SELECTION = "topk: its block selection alone"


def interval(baseline: list[float], variant: list[float]) -> str:
    ratio = paired_speedup(baseline, variant)  # the median over rounds of baseline / variant
    return f"{ratio.estimate:.2f} [{ratio.low:.2f}–{ratio.high:.2f}]"


def in_turns(n: int, min_run_time: float, causal: bool = False) -> dict[str, list[float]]:
    """Every setting's per-call seconds at N=n, round by round, in turns (and topk's selection alone)."""
    variants = {label: registry.create(name, **params) for label, (name, params) in SETTINGS.items()}
    if causal:  # Nyströmformer's landmarks mix future tokens: it has no causal form
        variants = {label: variant for label, variant in variants.items() if variant.supports.causal}
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
    calls = {label: (lambda variant=variant: variant(q, k, v, causal=causal)) for label, variant in variants.items()}
    calls[SELECTION] = lambda: variants["topk"].select(q, k, causal, None)
    with torch.no_grad():
        return time_in_turns(calls, torch.device("cpu"), min_rounds=9, min_run_time=min_run_time)


GOALS = {  # label -> (which ratio, bound, at least or at most): issues 25 and 39
    "band(window=256, sinks=4)": ("band(window=256)", 1.10, "at most"),
    "nystromformer(landmarks=64)": ("full", 15.0, "at least"),
    "bigbird": ("full", 8.0, "at least"),
    "topk": ("full", 6.0, "at least"),
    "topk(select_for=block)": ("full", 6.0, "at least"),
    SELECTION: ("topk", 0.30, "at most"),
}


def table_rows(n: int, samples: dict[str, list[float]]) -> list[str]:
    """Markdown rows: per setting its median, its speedup over full (full's time / its, > 1 faster), its time over
    the plain band's or over topk's (< 1 cheaper), each paired round by round with its interval, and its goal
    (met or not by the paired estimate)."""
    rows = []
    for label, seconds in samples.items():
        speedup = "" if label == SELECTION else interval(samples["full"], seconds)
        over = {"band": interval(seconds, samples["band(window=256)"]) if label.startswith("band") else "",
                "topk": interval(seconds, samples["topk"]) if label == SELECTION else ""}  # fmt: skip
        goal = ""
        if label in GOALS:
            against, bound, side = GOALS[label]
            ratio = paired_speedup(samples[against], seconds).estimate  # against / this
            value = ratio if against == "full" else 1 / ratio
            met = value >= bound if side == "at least" else value <= bound
            goal = f"{side} {bound:g}×: {'met' if met else 'not met'}"
        rows.append(f"| {n} | {label} | {Spread.of(seconds).median * 1e3:.1f} | {speedup} | {over['band']} | "
                    f"{over['topk']} | {goal} |")  # fmt: skip
    return rows


HEADER = [
    "| N | variant | ms per call | speedup vs full (full's time / its) [95%] | its time / band(window=256)'s [95%] "
    "| its time / topk's [95%] | goal |",
    "|---|---|---|---|---|---|---|",
]


def topk_limits(n: int, min_run_time: float) -> list[str]:
    """Markdown rows: full, topk, its selection, and the fused kernel alone on topk's tiles, causal at N=n: ms per call,
    full's time / its (paired, [95%]), and scores per second (masked and padded ones included)."""
    from attnbench.variants.topk import chunk_pairs

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
    variant = registry.create("topk")
    size, r = variant.block_size, variant.queries_per_chunk
    with torch.no_grad():
        tiles = len(chunk_pairs(variant.select(q, k, True, None), -(-n // size), r).group)
    tile_q, tile_kv = torch.randn(tiles, 1, r, 64), torch.randn(tiles, 1, size, 64)  # (t, 1, r|j, d)
    own = [x.reshape(8, n // size, size, 64) for x in (q, k, v)]  # ((b h), c, j, d): the own blocks
    calls = {
        "full": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "topk": lambda: variant(q, k, v, causal=True),
        "topk: its selection alone": lambda: variant.select(q, k, True, None),
        f"kernel alone: topk's {tiles} tiles of {r} x {size}": lambda: flash(tile_q, tile_kv, tile_kv),
        "kernel alone: the own blocks, causal": lambda: flash(*own, is_causal=True),
    }
    scores = {"full": 8 * n * (n + 1) / 2, list(calls)[3]: tiles * r * size, list(calls)[4]: 8 * n * size}
    for rows in (16, 32, 64, 256):  # the same scores in tiles of fewer or more queries
        count = tiles * r // rows
        tiled_q = torch.randn(count, 1, rows, 64)
        tiled_kv = torch.randn(count, 1, size, 64)
        label = f"kernel alone: {count} tiles of {rows} x {size}"
        calls[label] = lambda tiled_q=tiled_q, tiled_kv=tiled_kv: flash(tiled_q, tiled_kv, tiled_kv)
        scores[label] = count * rows * size
    with torch.no_grad():
        samples = time_in_turns(calls, torch.device("cpu"), min_rounds=7, min_run_time=min_run_time)
    rows = []
    for label, seconds in samples.items():
        median = Spread.of(seconds).median
        rate = f"{scores[label] / median / 1e6:.0f}" if label in scores else ""
        rows.append(f"| {n} | {label} | {median * 1e3:.1f} | {interval(samples['full'], seconds)} | {rate} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="4096,16384")
    parser.add_argument("--min-run-time", type=float, default=5.0)
    parser.add_argument("--causal", action="store_true", help="causal calls (issue 48's top-k goal is causal)")
    parser.add_argument("--topk-limits", action="store_true", help="what bounds top-k's speedup (issue 58), causal")
    args = parser.parse_args()
    if args.topk_limits:
        print("| N | call | ms per call | full's time / its [95%] | M scores/s |\n|---|---|---|---|---|")
        for n in (int(x) for x in args.seq_lens.split(",")):
            print("\n".join(topk_limits(n, args.min_run_time)), flush=True)
        return
    print("\n".join(HEADER))
    for n in (int(x) for x in args.seq_lens.split(",")):
        print("\n".join(table_rows(n, in_turns(n, args.min_run_time, args.causal))), flush=True)


if __name__ == "__main__":
    main()
