"""`attnbench calibrate`: the attention statistics of a local causal decoder, per length, as calibration data.

For each sequence length N and each of `windows` consecutive N-token windows of a text, the model runs once and
every self-attention call is recorded where attention sees it (post-rotary q/k, `capture.record_attention`);
each head's statistics (`attnbench.inputs.statistics`) are computed on its exact causal attention with the
model's own scaling. The result, written as JSON, holds per N and statistic the mean over every head of every
layer, the spread across heads (standard deviation of the per-head values, each averaged over windows), the
spread across windows, and the mean by depth (first, middle and last third of the layers), with its provenance
(model, text, windows, date). `attnbench.inputs.calibration` reads such a file; the one shipped was made with

    attnbench calibrate ~/.cache/attnbench/SmolLM2-135M --seq-lens 512 2048 8192 --windows 3

b - batch, h - heads, g - key/value heads, n - sequence, d - head dim
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from einops import repeat

from attnbench.inputs.statistics import LOCALITY_WINDOW, STATISTICS, TOP_KEYS, TOP_SHARE, head_statistics

DEPTHS = ("early", "middle", "late")  # thirds of the layers


def window_statistics(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """(layers, heads, statistics) of one window of token ids (1, n)."""
    from attnbench.model.capture import record_attention

    record = record_attention(model, ids)
    if not record.q:
        raise ValueError(f"{type(model).__name__}'s attention does not go through transformers' attention interface")
    per_layer = []
    for q, k, scaling, causal in zip(record.q, record.k, record.scaling, record.causal):
        k = repeat(k, "b g n d -> b (g r) n d", r=q.shape[1] // k.shape[1])
        stats = head_statistics(q, k, causal=causal, scale=scaling)
        per_layer.append(torch.stack([stats[name] for name in STATISTICS], dim=-1))  # (h, s)
    del record
    return torch.stack(per_layer)  # (l, h, s)


def summarize(values: torch.Tensor) -> dict[str, dict[str, Any]]:
    """values (windows, layers, heads, statistics) -> per statistic: mean, spread across heads, across windows,
    by depth, and the per-head means (layer-major)."""
    heads = values.mean(dim=0)  # (l, h, s): each head averaged over windows
    layers = heads.shape[0]
    thirds = [range(i * layers // 3, (i + 1) * layers // 3) for i in range(3)]
    summary = {}
    for index, name in enumerate(STATISTICS):
        per_head = heads[..., index]
        summary[name] = {
            "mean": round(per_head.mean().item(), 4),
            "spread_heads": round(per_head.flatten().std().item(), 4),
            "spread_windows": round(values[..., index].mean(dim=(1, 2)).std().item(), 4) if len(values) > 1 else None,
            "by_depth": {depth: round(per_head[list(rows)].mean().item(), 4) for depth, rows in zip(DEPTHS, thirds)},
            "per_head": [round(x, 4) for x in per_head.flatten().tolist()],
        }
    return summary


def calibrate(
    model_dir: Path, ids: torch.Tensor, seq_lens: list[int], windows: int, text_source: str, progress: bool = True
) -> dict[str, Any]:
    """The calibration table of a local causal decoder on token ids (1, total)."""
    from attnbench.model.capture import CaptureError, load_base_model

    model, config = load_base_model(model_dir, "attnbench calibrate")
    limit = getattr(config, "max_position_embeddings", None)
    table: dict[str, Any] = {}
    for n in seq_lens:
        if limit and n > limit:
            raise CaptureError(f"N={n} is beyond the model's {limit} positions")
        count = min(windows, ids.shape[-1] // n)
        if count < 1:
            raise CaptureError(f"the text gives {ids.shape[-1]} tokens, fewer than N={n}")
        values = []
        for w in range(count):
            started = time.perf_counter()
            values.append(window_statistics(model, ids[:, w * n : (w + 1) * n]))
            if progress:
                print(f"attnbench: N={n} window {w + 1}/{count}: {time.perf_counter() - started:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
        table[str(n)] = {"windows": count, "statistics": summarize(torch.stack(values))}
    return {
        "model": model_dir.name,
        "model_type": getattr(config, "model_type", None),
        "layers": int(getattr(config, "num_hidden_layers", 0)),
        "heads": int(getattr(config, "num_attention_heads", 0)),
        "kv_heads": int(getattr(config, "num_key_value_heads", 0) or getattr(config, "num_attention_heads", 0)),
        "text": text_source,
        "recorded_at": "attention function, post-rotary q/k, the model's scaling, causal",
        "definitions": {
            "entropy": "mean over query rows of H(p) / log(visible keys)",
            "local_mass": f"mass on keys with |i - j| <= {LOCALITY_WINDOW}",
            "sink_mass": "mass on the first token",
            "top1pct_mass": f"mass on the ceil({TOP_SHARE:.0%} of visible keys) largest weights",
            "top64_mass": f"mass on the {TOP_KEYS} largest weights",
            "spread_heads": "standard deviation across all heads of every layer (each head averaged over windows)",
            "spread_windows": "standard deviation across text windows of the mean over heads (null: one window)",
            "by_depth": "mean over the heads of the first, middle and last third of the layers",
        },
        "made": time.strftime("%Y-%m-%d"),
        "lengths": table,
    }


def write_calibration(path: Path, table: dict[str, Any]) -> None:
    from attnbench.atomic import write_text_atomic

    write_text_atomic(path, json.dumps(table, indent=1) + "\n")
