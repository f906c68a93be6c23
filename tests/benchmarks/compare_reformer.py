"""Side by side: our `lsh` against reformer-pytorch's LSHAttention, same settings, one process.

    make compare-lsh            # installs reformer-pytorch into .venv (comparison only) and runs this
    python tests/benchmarks/compare_reformer.py --seq-len 8192 --n-hashes 4

Both run shared-QK (reformer-pytorch's only mode), bucket_size=64, n_buckets = N / bucket_size (the
paper's setting, which reformer-pytorch fixes), forward, float32, B=1, H=8, D=64, on the CPU. Our
default n_buckets (at most 64) is timed too. Errors are against exact attention with the same
shared-QK keys (reformer-pytorch's duplicates are not de-duplicated, ours are). The three are timed in
turns (`attnbench.measure.timing.time_in_turns`), so a slow stretch of the machine falls on all alike.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from attnbench.measure.machine import warm_allocator
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import Reference
from attnbench.measure.timing import time_in_turns
from attnbench.registry import registry
from attnbench.stats import Spread
from attnbench.variants.lsh import default_buckets
from einops import rearrange


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--n-hashes", type=int, default=4)
    parser.add_argument("--bucket-size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--min-run-time", type=float, default=3.0, help="seconds of calls per implementation")
    parser.add_argument("--temperature", type=float, default=0.125, help="queries are N(0, 1)/temperature")
    args = parser.parse_args()
    try:
        from reformer_pytorch.reformer_pytorch import LSHAttention as ReformerLSH
    except ImportError:
        print("reformer-pytorch is not installed: run `make compare-lsh` (it is a comparison-only dependency)")
        return 2
    with warm_allocator():  # timed warm, as in a run
        cpu = torch.device("cpu")
        n, h, d, bucket = args.seq_len, args.heads, args.head_dim, args.bucket_size
        generator = torch.Generator().manual_seed(0)
        q, v = (torch.randn(1, h, n, d, generator=generator) for _ in range(2))
        q = q / args.temperature  # logits |q| cos(q, k) / sqrt(d): about N(0, 1/temperature^2), not flat

        theirs = ReformerLSH(bucket_size=bucket, n_hashes=args.n_hashes, causal=False).eval()
        qk_flat, v_flat = (rearrange(t, "b h n d -> (b h) n d") for t in (q, v))
        ours_paper = registry.create(
            "lsh", shared_qk=True, bucket_size=bucket, n_hashes=args.n_hashes, n_buckets=n // bucket
        )
        ours_default = registry.create("lsh", shared_qk=True, bucket_size=bucket, n_hashes=args.n_hashes)

        def run_theirs() -> torch.Tensor:
            out = theirs(qk_flat, v_flat)
            return rearrange(out[0] if isinstance(out, tuple) else out, "(b h) n d -> b h n d", h=h)

        # exact shared-QK attention: keys are the normalized queries, a token never attends to itself
        keys = F.normalize(q, dim=-1)
        self_mask = ~torch.eye(n, dtype=torch.bool)
        with torch.no_grad():
            exact = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        q[:, :, s : s + 1024].double(), keys.double(), v.double(), attn_mask=self_mask[s : s + 1024]
                    )
                    for s in range(0, n, 1024)
                ],
                2,
            )
            reference = Reference(output=exact, uniform=v.double().mean(dim=2, keepdim=True).expand_as(exact))
            calls = {
                "reformer-pytorch LSHAttention": run_theirs,
                f"attnbench lsh (n_buckets={n // bucket})": lambda: ours_paper(q, q, v),
                f"attnbench lsh (default n_buckets={default_buckets(n, bucket)})": lambda: ours_default(q, q, v),
            }
            samples = time_in_turns(calls, cpu, min_run_time=args.min_run_time)
            timings = {label: Spread.of(seconds) for label, seconds in samples.items()}
            rows = [(label, timings[label], error_metrics(fn(), reference)) for label, fn in calls.items()]
        base = rows[0][1].median
        print(f"N={n}, H={h}, D={d}, bucket_size={bucket}, n_hashes={args.n_hashes}, threads={torch.get_num_threads()}")
        print("| implementation | time ms (median ± IQR) | speedup vs reformer-pytorch | err vs uniform | rel Frobenius |")
        print("|---|---|---|---|---|")
        for label, timing, error in rows:
            print(
                f"| {label} | {timing.median * 1e3:.1f} ± {timing.iqr * 1e3:.1f} | {base / timing.median:.2f}× "
                f"| {error.vs_uniform:.3f} | {error.rel_fro:.3f} |"
            )
        return 0


if __name__ == "__main__":
    sys.exit(main())
