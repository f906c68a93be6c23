"""Issue 27's targets, measured: each built-in's time over its roofline, eager and compiled, and LSH's total time
over its own attention core.

1. `--run RUN_DIR`: the table of a run of the `roofline` preset (or any run): per variant, N and mode, time over
   roofline eager and compiled (1 is the limit; target <= 1.5 at N=16384 fwd), what compiling did (eager / compiled
   time, paired per round, with its interval) and the compile seconds. The figures are the report's own
   (`RunView`: the run's peaks, raised to the fastest rate a cell reached).
2. `--lsh`: LSH's whole call against its attention core alone (the dense attention inside the sorted chunks, on
   chunks gathered beforehand), timed in turns; target total / core <= 1.5. Also the share of each stage.
3. `--profile N`: each built-in's top operators by self CPU time at N (eager, fwd): what a limit analysis names.

Run: `.venv/bin/attnbench run roofline --out results` then
`.venv/bin/python tests/benchmarks/roofline_targets.py --run results/<run-id>`, and
`.venv/bin/python tests/benchmarks/roofline_targets.py --lsh [--seq-lens 4096,16384] [--min-run-time 3]`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from attnbench.measure.machine import warm_allocator
from attnbench.measure.timing import time_in_turns
from attnbench.plan.cells import label_variant
from attnbench.registry import registry
from attnbench.report.view import RunView
from attnbench.stats import Spread, paired_speedup
from attnbench.variants.blocks import partial_attention
from attnbench.variants.lsh import gather_chunks, gather_windows

TARGET = 1.5


def roofline_table(run_dir: Path) -> None:
    frame = RunView.read(run_dir).frame
    ok = frame[(frame.status == "ok") & frame.of_roofline.notna()]
    eager = ok[~ok.compiled.astype(bool)].set_index(["label", "seq_len", "mode"])
    compiled = ok[ok.compiled.astype(bool)].assign(label=lambda f: f.label.map(label_variant))
    compiled = compiled.set_index(["label", "seq_len", "mode"])
    print("| variant | N | mode | eager: time / roofline | compiled: time / roofline | eager / compiled [95%] |"
          " compile s | best within 1.5× |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for key, row in eager.iterrows():
        label, n, mode = key
        over = 1 / row.of_roofline
        twin = compiled.loc[key] if key in compiled.index else None
        over_compiled = 1 / twin.of_roofline if twin is not None else float("nan")
        compiled_text = f"{over_compiled:.2f}" if over_compiled == over_compiled else "–"
        ratio = (
            f"{twin.compiled_speedup:.2f} [{twin.compiled_speedup_low:.2f}–{twin.compiled_speedup_high:.2f}]"
            if twin is not None and twin.compiled_speedup == twin.compiled_speedup
            else "–"
        )
        best = min(over, over_compiled) if over_compiled == over_compiled else over
        seconds = f"{twin.compile_s:.1f}" if twin is not None else "–"
        print(f"| {label} | {n} | {mode} | {over:.2f} | {compiled_text} | {ratio} | {seconds} | "
              f"{'yes' if best <= TARGET else 'no'} ({best:.2f}) |")  # fmt: skip
    band_against_flex(RunView.read(run_dir))
    refused = frame[frame.status != "ok"]
    for row in refused.itertuples():
        print(f"\n{row.label} N={row.seq_len} {row.mode}: {row.status}: {row.reason}")


def band_against_flex(view: RunView) -> None:
    """Our blocked band (eager, and compiled) against FlexAttention's sliding window (compiled by design), paired
    per round: > 1 is ours faster. Target: >= 1 (or band picks the faster path itself)."""
    frame = view.frame[view.frame.status == "ok"]
    flex = frame[(frame.variant == "band") & frame.hparams.str.contains('"backend": "flex"') & ~frame.compiled]
    for row in flex.itertuples():
        same = frame[(frame.group_key == row.group_key) & (frame.variant == "band")]
        for ours in same[~same.hparams.str.contains("backend") & ~same.hparams.str.contains("sinks")].itertuples():
            ratio = paired_speedup(view.samples[row.cell_key], view.samples[ours.cell_key])  # flex / ours per round
            print(f"\n{ours.label} vs {row.label} at N={row.seq_len} {row.mode}: ours {ratio.estimate:.2f}× as fast "
                  f"[{ratio.low:.2f}–{ratio.high:.2f}]")  # fmt: skip


def lsh_core(seq_lens: list[int], min_run_time: float) -> None:
    """LSH (defaults, shared_qk false and true) whole, against its stages timed alone, in turns."""
    stages = "hash+sort | gather | bias | core | rest: total − these (scatter, merge; timed alone they overlap)"
    print(f"| N | setting | total ms | core ms | total / core [95%] | {stages} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in seq_lens:
        generator = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 8, n, 64, generator=generator) for _ in range(3))
        for shared in (False, True):
            lsh = registry.create("lsh", seed=0, shared_qk=shared)
            chunk, back, forward = lsh.bucket_size, lsh.look_backward, lsh.look_forward
            keys = torch.nn.functional.normalize(q, dim=-1) if shared else k
            with torch.no_grad():
                rounds = lsh._sort(q, k, False)
                if rounds.rounds > 1:
                    rounds.chunk_ids = lsh._chunk_ids(rounds)
                patterns = [lsh._pattern(rounds, r, n, q.dtype, False, None) for r in range(rounds.rounds)]

                def gathered(r: int) -> tuple[torch.Tensor, ...]:
                    return (
                        gather_chunks(q, rounds.query_layout[:, :, r], chunk),
                        gather_windows(keys, rounds.key_layout[:, :, r], chunk, back, forward),
                        gather_windows(v, rounds.key_layout[:, :, r], chunk, back, forward),
                    )

                chunks = [gathered(r) for r in range(rounds.rounds)]

            def sort() -> None:
                rounds_now = lsh._sort(q, k, False)
                if rounds_now.rounds > 1:
                    lsh._chunk_ids(rounds_now)

            calls = {
                "total": lambda: lsh(q, k, v),
                "hash+sort": sort,
                "gather": lambda: [gathered(r) for r in range(rounds.rounds)],
                "bias": lambda: [lsh._pattern(rounds, r, n, q.dtype, False, None) for r in range(rounds.rounds)],
                "core": lambda: [partial_attention(*chunks[r], patterns[r]) for r in range(rounds.rounds)],
            }
            with torch.no_grad(), warm_allocator():  # as the harness times: freed memory kept for reuse
                samples = time_in_turns(calls, torch.device("cpu"), min_rounds=9, min_run_time=min_run_time)
            total, core = samples["total"], samples["core"]
            ratio = paired_speedup(core, total)  # total / core, round by round
            shares = {
                name: Spread.of(samples[name]).median / Spread.of(total).median
                for name in ("hash+sort", "gather", "bias", "core")
            }
            rest = 1 - sum(shares.values())
            milliseconds = f"{Spread.of(total).median * 1e3:.1f} | {Spread.of(core).median * 1e3:.1f}"
            print(f"| {n} | shared_qk={shared} | {milliseconds}"
                  f" | {1 / ratio.estimate:.2f} [{1 / ratio.high:.2f}–{1 / ratio.low:.2f}] | "
                  + " | ".join(f"{100 * shares[name]:.0f}%" for name in ("hash+sort", "gather", "bias", "core"))
                  + f" | {100 * rest:.0f}% |")  # fmt: skip


def profile(seq_len: int, top: int) -> None:
    """Where each built-in's eager forward spends its time at `seq_len`: its `top` operators by self CPU time, as
    shares of the call (torch.profiler, one warm call): the ops a limit analysis names."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, seq_len, 64, generator=generator) for _ in range(3))
    for name in registry.names():
        variant = registry.create(name, seed=0)
        if not type(variant).__module__.startswith("attnbench."):  # the built-ins: plugins profile themselves
            continue
        if variant.unsupported_reason(device="cpu", dtype="float32", causal=False, padded=False,
                                      n_q=seq_len, n_k=seq_len) is not None:  # fmt: skip
            continue
        with torch.no_grad():
            variant(q, k, v)
            with profiler(activities=[ProfilerActivity.CPU]) as recorded:
                variant(q, k, v)
        events = sorted(recorded.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in events)
        shares = ", ".join(f"{e.key} {100 * e.self_cpu_time_total / total:.0f}%" for e in events[:top])
        print(f"- {name} (N={seq_len}, {total / 1e3:.1f} ms profiled): {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run folder (of the roofline preset): print its roofline table")
    parser.add_argument("--lsh", action="store_true", help="time LSH against its attention core, in turns")
    parser.add_argument("--profile", type=int, metavar="N", help="each built-in's top operators at N (eager, fwd)")
    parser.add_argument("--seq-lens", default="4096,16384")
    parser.add_argument("--min-run-time", type=float, default=3.0)
    args = parser.parse_args()
    if args.run is None and not args.lsh and args.profile is None:
        parser.error("give --run RUN_DIR, --lsh or --profile N")
    if args.run is not None:
        roofline_table(args.run)
    if args.lsh:
        lsh_core([int(x) for x in args.seq_lens.split(",")], args.min_run_time)
    if args.profile is not None:
        profile(args.profile, top=5)


if __name__ == "__main__":
    main()
