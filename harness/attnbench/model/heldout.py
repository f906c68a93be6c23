"""Is `realistic` right about heads it was not fitted to? Cross-validation on a real decoder's captured heads.

The heads `attnbench heads` captured (two texts, 10 layers across depth) are split four ways: fit on one text and
one half of the layers (every other captured layer), test on the other text and the other half. For each split and
length, `realistic`'s mix (`HeadMix`: the ranges its heads draw width, position, content temperature, sink and token
match from) is fitted to the fit split's statistics (mean and spread across heads of the five calibration
statistics, Nelder-Mead from the shipped mix, query rows sampled evenly), then judged on the held-out heads:
- each statistic's gap, in units of its tolerance (a third of the held-out heads' spread, at least 0.03:
  `attnbench.inputs.calibration`); within 1 is within tolerance;
- rank agreement of the approximate variants' errors vs uniform, synthetic against held-out real
  (`attnbench.model.ranking.rank_agreement`: every variant whose real error is below 0.95 is ordered).
The shipped mix (fitted to the prose, every layer) is judged on the same held-out heads beside them. Made with

    python -m attnbench.model.heldout --seq-lens 2048 8192      (about 25 minutes on 2 cores)

b - batch, h - heads, r - sampled query rows, j - key position, d - head dim, s - statistic
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from typing import Any

import torch
from einops import einsum
from torch import Tensor

from attnbench.inputs.heads import captured_heads
from attnbench.inputs.heads_cache import DEFAULT_HEADS_MODEL, read_manifest
from attnbench.inputs.statistics import STATISTICS, row_statistics
from attnbench.inputs.synthetic import HeadMix, decoder_mix, mixed_heads
from attnbench.plan.budget import UNIFORM_EQUIVALENT
from attnbench.plan.cells import VariantSpec

ROWS = 512  # query rows sampled evenly: the statistics and errors are means over rows
FIT_HEADS = 32  # synthetic heads per objective evaluation (one seed: the objective is deterministic)
TEST_HEADS = 45  # synthetic heads judged against the held-out real ones (as many as a half of the layers holds)
RANGES = ("width", "position", "temperature", "sink", "match")  # the mix's fitted (low, high) pairs
LOGARITHMIC = {"width", "position", "temperature", "match"}  # fitted in log space (positive)


def sampled_rows(n: int, count: int = ROWS) -> Tensor:
    """`count` query positions spread evenly over 0..n-1 (every row when n <= count)."""
    return torch.linspace(0, n - 1, min(n, count)).round().long().unique()


def head_table(q: Tensor, k: Tensor, rows: Tensor) -> Tensor:
    """(h, s): each head's statistics (STATISTICS) over the causal attention of the sampled `rows`; q (1, h, n, d)
    already at the model's scaling times sqrt(d)."""
    scores = einsum(q[:, :, rows], k, "b h r d, b h j d -> b h r j") * q.shape[-1] ** -0.5
    scores.masked_fill_(torch.arange(k.shape[-2])[None, :] > rows[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    stats = row_statistics(weights, (rows + 1)[None, None, :], rows, STATISTICS)
    return torch.stack([stats[name].mean(dim=(0, 2)) for name in STATISTICS], dim=-1)


def targets(table: Tensor) -> tuple[Tensor, Tensor]:
    """(means, spreads across heads) of a (h, s) table."""
    return table.mean(dim=0), table.std(dim=0)


def tolerances(spreads: Tensor) -> tuple[Tensor, Tensor]:
    """The calibration's tolerances: a mean within a third of the spread (at least 0.03), the spread within half of
    itself (at least 0.04) (`attnbench.inputs.calibration.Target`)."""
    return (spreads / 3).clamp(min=0.03), (spreads / 2).clamp(min=0.04)


def real_split(model: str, text: str, layer_slots: list[int], n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every query head of the captured layers at `layer_slots` (indices into the capture's layers), on `text`'s
    first n positions: q (1, h, n, d) at the model's scaling x sqrt(d), k and v of each head's group."""
    manifest = read_manifest(model)
    assert manifest is not None
    return captured_heads(model, text, [(slot, head) for slot in layer_slots for head in range(int(manifest["heads"]))], n)


def draw(mix: HeadMix, heads: int, n: int, d: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    return mixed_heads(torch.Generator().manual_seed(seed), (1, heads, n, d), mix)


def _vector(mix: HeadMix) -> list[float]:
    out = []
    for name in RANGES:
        for value in getattr(mix, name):
            out.append(math.log(max(value, 1e-3)) if name in LOGARITHMIC else value)
    return out


def _mix(start: HeadMix, x: list[float]) -> HeadMix:
    values = {}
    for index, name in enumerate(RANGES):
        pair = x[2 * index : 2 * index + 2]
        if name in LOGARITHMIC:
            pair = [math.exp(min(value, 8.0)) for value in pair]
        values[name] = (min(pair), max(pair))
    return replace(start, **values)


def nelder_mead(loss: Any, x0: list[float], step: float = 0.3, evaluations: int = 150) -> list[float]:
    """The minimum Nelder-Mead finds of `loss` from `x0` (a simplex of `step` along each axis) in `evaluations`."""
    simplex = [list(x0)] + [[v + (step if i == j else 0.0) for j, v in enumerate(x0)] for i in range(len(x0))]
    scored = sorted(((loss(x), x) for x in simplex), key=lambda pair: pair[0])
    used = len(scored)
    while used < evaluations:
        worst_loss, worst = scored[-1]
        centroid = [sum(x[i] for _, x in scored[:-1]) / (len(scored) - 1) for i in range(len(x0))]

        def toward(t: float) -> list[float]:
            return [c + t * (w - c) for c, w in zip(centroid, worst)]

        reflected = toward(-1.0)
        reflected_loss = loss(reflected)
        used += 1
        if reflected_loss < scored[0][0]:
            expanded = toward(-2.0)
            expanded_loss = loss(expanded)
            used += 1
            scored[-1] = (expanded_loss, expanded) if expanded_loss < reflected_loss else (reflected_loss, reflected)
        elif reflected_loss < scored[-2][0]:
            scored[-1] = (reflected_loss, reflected)
        else:
            contracted = toward(0.5)
            contracted_loss = loss(contracted)
            used += 1
            if contracted_loss < worst_loss:
                scored[-1] = (contracted_loss, contracted)
            else:  # shrink toward the best
                best = scored[0][1]
                scored = [scored[0]] + [(loss(p), p) for p in ([b + 0.5 * (v - b) for b, v in zip(best, x)]
                                                                for _, x in scored[1:])]  # fmt: skip
                used += len(scored) - 1
        scored.sort(key=lambda pair: pair[0])
    return scored[0][1]


def fit_mix(table: Tensor, n: int, d: int, evaluations: int = 150) -> tuple[HeadMix, float]:
    """`realistic`'s mix fitted to a (h, s) table of real heads at length n: the squared gaps of the means and
    spreads in units of their tolerances, summed; the fitted mix and its loss."""
    means, spreads = targets(table)
    mean_tolerance, spread_tolerance = tolerances(spreads)
    rows = sampled_rows(n, ROWS // 2)
    start = decoder_mix(n)

    def loss(x: list[float]) -> float:
        q, k, _ = draw(_mix(start, x), FIT_HEADS, n, d)
        found_means, found_spreads = targets(head_table(q, k, rows))
        gap = ((found_means - means) / mean_tolerance) ** 2 + ((found_spreads - spreads) / spread_tolerance) ** 2
        return float(gap.sum())

    best = nelder_mead(loss, _vector(start), evaluations=evaluations)
    return _mix(start, best), loss(best)


def row_errors(q: Tensor, k: Tensor, v: Tensor, specs: list[VariantSpec], rows: Tensor) -> dict[str, float]:
    """Each setting's error vs uniform (causal) at the sampled rows, against exact float64 attention there; NaN
    where the variant has no causal form."""
    from attnbench.registry import registry

    q64, k64, v64 = (t.double() for t in (q, k, v))
    scores = einsum(q64[:, :, rows], k64, "b h r d, b h j d -> b h r j") * q.shape[-1] ** -0.5
    scores.masked_fill_(torch.arange(k.shape[-2])[None, :] > rows[:, None], float("-inf"))
    exact = einsum(torch.softmax(scores, dim=-1), v64, "b h r j, b h j d -> b h r d")
    uniform = v64.cumsum(dim=-2)[:, :, rows] / (rows + 1).double()[:, None]
    base = torch.linalg.vector_norm(uniform - exact).item()
    errors = {}
    for spec in specs:
        try:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
            with torch.no_grad():
                output = variant(q, k, v, causal=True)[:, :, rows].double()
            errors[spec.label()] = torch.linalg.vector_norm(output - exact).item() / base
        except Exception:  # noqa: BLE001 - no causal form: left out of the ranking
            errors[spec.label()] = float("nan")
    return errors


def splits(layers: int) -> list[tuple[str, list[int], str, list[int]]]:
    """(fit text, fit layer slots, test text, test layer slots): each text's every-other half of the captured
    layers against the other text's other half."""
    halves = [list(range(0, layers, 2)), list(range(1, layers, 2))]
    return [(fit_text, halves[h], test_text, halves[1 - h])
            for fit_text, test_text in (("prose", "code"), ("code", "prose")) for h in (0, 1)]  # fmt: skip


def cross_validate(model: str, seq_lens: list[int], variants: str, evaluations: int, say: Any) -> list[dict[str, Any]]:
    """Per length and split: the fitted mix's and the shipped mix's statistics gaps and rank agreements on the
    held-out heads (see the module's docstring)."""
    from attnbench.model.ranking import rank_agreement

    manifest = read_manifest(model)
    if manifest is None:
        raise SystemExit(f"no captured heads of {model}: make model (or attnbench heads MODEL_DIR) first")
    specs = list(dict.fromkeys(VariantSpec.parse(variants)))
    d = int(manifest["head_dim"])
    results = []
    for n in seq_lens:
        rows = sampled_rows(n)
        held_out: dict[tuple[str, tuple[int, ...]], tuple[Tensor, dict[str, float]]] = {}
        for fit_text, fit_slots, test_text, test_slots in splits(len(manifest["layers"])):
            started = time.perf_counter()
            fit_q, fit_k, _ = real_split(model, fit_text, fit_slots, n)
            mix, loss = fit_mix(head_table(fit_q, fit_k, sampled_rows(n, ROWS // 2)), n, d, evaluations)
            key = (test_text, tuple(test_slots))
            if key not in held_out:
                q, k, v = real_split(model, test_text, test_slots, n)
                held_out[key] = (head_table(q, k, rows), row_errors(q, k, v, specs, rows))
            table, real_errors = held_out[key]
            means, spreads = targets(table)
            mean_tolerance, _ = tolerances(spreads)
            for name, judged in (("fitted", mix), ("shipped", decoder_mix(n))):
                q, k, v = draw(judged, TEST_HEADS, n, d, seed=1)
                found_means, _ = targets(head_table(q, k, rows))
                synthetic_errors = row_errors(q, k, v, specs, rows)
                labels = [x for x in real_errors if real_errors[x] == real_errors[x]]
                results.append({
                    "n": n, "mix": name, "fit": f"{fit_text}, layers {[manifest['layers'][s] for s in fit_slots]}",
                    "test": f"{test_text}, layers {[manifest['layers'][s] for s in test_slots]}",
                    "fit_loss": loss if name == "fitted" else None,
                    "gaps": {s: round(float((found_means[i] - means[i]) / mean_tolerance[i]), 2)
                             for i, s in enumerate(STATISTICS)},
                    "rank_agreement": rank_agreement([real_errors[x] for x in labels],
                                                     [synthetic_errors[x] for x in labels]),
                    "real": real_errors, "synthetic": synthetic_errors,
                    "mix_ranges": {r: [round(x, 3) for x in getattr(judged, r)] for r in RANGES},
                })  # fmt: skip
            say(f"N={n}: fit {fit_text} {fit_slots} -> {test_text} {test_slots}: rank agreement fitted "
                f"{results[-2]['rank_agreement']:.2f}, shipped {results[-1]['rank_agreement']:.2f} "
                f"({time.perf_counter() - started:.0f} s)")  # fmt: skip
    return results


def markdown(results: list[dict[str, Any]]) -> str:
    """The held-out figures as the README shows them: per N and split, rank agreement and the largest gap."""
    lines = ["| N | fit on | judged on | mix | rank agreement | statistics within tolerance | largest gap (× tolerance) |",
             "|---|---|---|---|---:|---:|---|"]  # fmt: skip
    for r in results:
        within = sum(abs(g) <= 1 for g in r["gaps"].values())
        name, gap = max(r["gaps"].items(), key=lambda item: abs(item[1]))
        lines.append(f"| {r['n']} | {r['fit'] if r['mix'] == 'fitted' else 'prose, every layer (shipped)'} | "
                     f"{r['test']} | {r['mix']} | {r['rank_agreement']:.2f} | {within} of {len(r['gaps'])} | "
                     f"{name} {gap:+.1f} |")  # fmt: skip
    for n in sorted({r["n"] for r in results}):
        for mix in ("fitted", "shipped"):
            values = [r["rank_agreement"] for r in results if r["n"] == n and r["mix"] == mix]
            lines.append(f"\nN={n}, {mix} mix: mean held-out rank agreement {sum(values) / len(values):.2f} "
                         f"(min {min(values):.2f}) over {len(values)} splits")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from attnbench.model.ranking import RANKED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_HEADS_MODEL, help="whose captured heads (default SmolLM2-135M)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--variants", default=RANKED)
    parser.add_argument("--evaluations", type=int, default=150, help="objective evaluations per fit (default 150)")
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = cross_validate(args.model, args.seq_lens, args.variants, args.evaluations,
                             lambda line: print(f"attnbench: {line}", file=sys.stderr, flush=True))  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1)
    print(markdown(results))
    print(f"\nrank agreement: Spearman, every variant whose real error is below {UNIFORM_EQUIVALENT} ordered; "
          "statistics: gap of the synthetic mean from the held-out mean, in tolerances")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
