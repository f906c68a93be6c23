"""Issues 39 and 58's memory targets, measured: each sparse variant's peak per call (the CPU allocator's figure,
kernels' scratch included, and the live tensors' alone) beside full's (SDPA's fused kernel) and band's, fwd, float32,
B=1, H=8, D=64.

Targets: band(window=256), with 4 sinks or without, at most full's peak at N >= 8192, causal and not (issue 58: a
chunk of query blocks at a time, written into the one output); block top-k within 2x of band(window=256) (issue 39;
issue 58 asked for full's, out of its reach at its speed: see the note in `attnbench.variants.topk`).
Run: `.venv/bin/python tests/benchmarks/sparse_memory.py [--seq-lens 8192,16384]`; prints a Markdown table.
"""

from __future__ import annotations

import argparse

import torch
from attnbench.measure.memory import peak_memory
from attnbench.registry import registry

SETTINGS = {  # label -> (variant, hyperparameters)
    "full": ("full", {}),
    "band(window=256)": ("band", {"window": 256}),
    "band(window=256, sinks=4)": ("band", {"window": 256, "sinks": 4}),
    "bigbird": ("bigbird", {}),
    "topk": ("topk", {}),
}
BAND = "band(window=256)"
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", default="8192,16384")
    args = parser.parse_args()
    print("| N | causal | variant | peak MiB (allocator's; live tensors' where higher) | live tensors MiB | × full "
          "| × band |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n in map(int, args.seq_lens.split(",")):
        q, k, v = (torch.randn(1, 8, n, 64, generator=torch.Generator().manual_seed(s)) for s in range(3))
        for causal in (True, False):
            peaks = {}
            for label, (name, params) in SETTINGS.items():
                variant = registry.create(name, **params)
                if variant.unsupported_reason(device="cpu", dtype=torch.float32, causal=causal, padded=False, n_q=n,
                                              n_k=n, backward=False, decode=False):  # fmt: skip
                    continue
                with torch.no_grad():
                    variant(q, k, v, causal=causal)  # warm: state kept between calls is not per-call memory
                    peaks[label] = peak_memory(lambda: variant(q, k, v, causal=causal), torch.device("cpu"), (q, k, v))
            for label, (peak, _, tensors) in peaks.items():
                over_full, over_band = peak / peaks["full"][0], peak / peaks[BAND][0]
                print(f"| {n} | {causal} | {label} | {peak / MIB:.1f} | {tensors / MIB:.1f} | {over_full:.2f} | "
                      f"{over_band:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
