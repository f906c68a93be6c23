"""Does a synthetic input rank the variants as real attention does? Error vs uniform on real heads beside it.

Real heads are a captured file (post-rotary q/k/v of a causal decoder, `attnbench capture`), several layers side
by side; the synthetic input is drawn at the same shape. Each approximate variant runs causal on both, its error
vs uniform is computed against exact float64 attention, and the two orders are compared by Spearman's rank
correlation, with every error at or above the verdict's "no better than averaging V" (0.95) counted as one tie:
the verdict does not order those variants, and their order moves with a random feature's seed. In sample: the
heads are any captured file's; `attnbench.model.heldout` judges `realistic` on heads it was not fitted to. E.g.

    attnbench capture MODEL_DIR --text-file harness/attnbench/model/texts/python_tutorial.txt --seq-len 8192 --out real.pt
    python -m attnbench.model.ranking real.pt --seq-lens 2048 8192

b - batch, h - heads, n - sequence, d - head dim
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from attnbench.plan.cells import VariantSpec
from attnbench.plan.budget import UNIFORM_EQUIVALENT

RANKED = (  # the approximate built-ins of the quick preset that run causal, at its settings
    "band(window=256),band(window=256,sinks=4),strided(pattern='strided'),strided(pattern='fixed'),lsh,"
    "lsh(shared_qk=true),linear,performer,nystromformer,bigbird,topk"
)
LAYERS = [2, 8, 14, 20, 26]  # early to late layers of a 30-layer model


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    import pandas as pd

    return float(pd.Series(a, dtype=float).rank().corr(pd.Series(b, dtype=float).rank()))


def rank_agreement(real: list[float], synthetic: list[float], tied_from: float = UNIFORM_EQUIVALENT) -> float:
    """Spearman's rank correlation of two inputs' errors with every variant ordered except those no better than
    averaging V on both (each error >= `tied_from`: one tie on each side, an order the verdict does not make and a
    random feature's seed moves). A variant the real heads put below `tied_from` keeps its place on both sides, so
    a synthetic input that calls it no better than averaging is counted wrong."""
    both = [r >= tied_from and s >= tied_from for r, s in zip(real, synthetic)]
    real = [tied_from if tied else r for r, tied in zip(real, both)]
    synthetic = [tied_from if tied else s for s, tied in zip(synthetic, both)]
    return spearman(real, synthetic)


def errors_vs_uniform(inputs: Any, specs: list[VariantSpec], causal: bool = True) -> dict[str, float]:
    """Each variant setting's error vs uniform on `inputs` (q, k, v (b, h, n, d)), NaN where it cannot run."""
    from attnbench.measure.metrics import error_metrics
    from attnbench.measure.reference import exact_reference
    from attnbench.registry import registry

    reference = exact_reference(inputs.q, inputs.k, inputs.v, causal=causal, key_padding_mask=None)
    errors = {}
    for spec in specs:
        variant = registry.create(spec.name, seed=0, **dict(spec.params))
        try:
            with torch.no_grad():
                output = variant(inputs.q, inputs.k, inputs.v, causal=causal)
            errors[spec.label()] = error_metrics(output, reference).vs_uniform
        except Exception as error:  # noqa: BLE001 - one variant's failure is its NaN
            print(f"{spec.label()}: {type(error).__name__}: {error}", file=sys.stderr)
            errors[spec.label()] = float("nan")
    return errors


def rank_tables(path: str, seq_lens: list[int], layers: list[int], specs: list[VariantSpec], input_name: str,
                seed: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """Per N: each setting's error vs uniform on the real heads and on `input_name`, and their Spearman."""
    from attnbench.inputs.catalogue import make_inputs

    from attnbench.inputs.captured import read_tensors

    shape = read_tensors(Path(path))["q"].shape  # (layers, batch, heads, n, d)
    tables = []
    for n in seq_lens:
        real = make_inputs("captured", {"path": path, "layer": layers}, batch=1, heads=shape[-3] * len(layers),
                           seq_len=n, head_dim=shape[-1], dtype=torch.float32, device=torch.device("cpu"),
                           seed=seed)  # fmt: skip
        heads = real.q.shape[1]
        synthetic = make_inputs(input_name, {}, batch=1, heads=heads, seq_len=n, head_dim=real.q.shape[-1],
                                dtype=torch.float32, device=torch.device("cpu"), seed=seed, causal=True)  # fmt: skip
        on_real, on_synthetic = errors_vs_uniform(real, specs), errors_vs_uniform(synthetic, specs)
        labels = [label for label in on_real if on_real[label] == on_real[label]]
        pairs = [on_real[x] for x in labels], [on_synthetic[x] for x in labels]
        tables.append({
            "n": n, "heads": heads, "real": on_real, input_name: on_synthetic,
            "spearman": rank_agreement(*pairs), "spearman_untied": spearman(*pairs),
        })  # fmt: skip
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captured", help="a captured file of a causal decoder (post-rotary), e.g. 8192 positions")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--layers", type=int, nargs="+", default=LAYERS)
    parser.add_argument("--variants", default=RANKED)
    parser.add_argument("--input", default="realistic", help="the synthetic input to rank against (default realistic)")
    args = parser.parse_args(argv)
    specs = list(dict.fromkeys(VariantSpec.parse(args.variants)))
    for table in rank_tables(args.captured, args.seq_lens, args.layers, specs, args.input):
        print(f"\nN={table['n']}, {table['heads']} heads (layers {', '.join(map(str, args.layers))}), causal: "
              f"Spearman {table['spearman']:.2f} (tied only where both errors are >= {UNIFORM_EQUIVALENT}; "
              f"{table['spearman_untied']:.2f} untied)")  # fmt: skip
        order = sorted(table["real"], key=lambda label: table["real"][label])
        print(f"| variant | error vs uniform, real heads | on `{args.input}` |\n|---|---:|---:|")
        for label in order:
            print(f"| {label} | {table['real'][label]:.3f} | {table[args.input][label]:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
