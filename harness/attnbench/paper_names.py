"""The methods the papers name, as settings of the registry's variants that compute them (`attnbench generate
--methods quest,streamingllm`): declared once, below every layer that names them (generation grids, `run`'s hint
for a paper's name given as a variant). Their papers' own parameter names are `generation.grid.PAPER_PARAMETERS`."""

from __future__ import annotations

from typing import Any

KVPRESS_SNAPKV = {"window": 64, "kernel": 5, "pool": "avg"}  # kvpress's SnapKVPress defaults (snapkv_press.py)
QUEST = {"name": "topk", "score": "minmax", "block_size": 16, "dense_layers": 2}
ALIASES: dict[str, dict[str, Any]] = {
    # Quest as its code selects (evaluation/quest_attention.py, its kernels): pages ranked per query head by the
    # min/max bound, the current page always read, no forced first page, the first two layers dense
    "quest": {**QUEST, "keep_first_block": False, "select_per": "query-head"},
    # the NSA-style departure (attnbench's Quest before 2026-11-28): the first page always read, a key/value head's
    # pages ranked by the mean of its query heads' bounds
    "quest-first-page": {**QUEST, "keep_first_block": True, "select_per": "kv-head"},
    "streamingllm": {"name": "band", "sinks": 4},
    # kvpress's wrapper presses around a scorer (evaluation/evaluate_registry.py), as the scorer's hyperparameters
    # (`variants.press.WRAPPERS`), around kvpress's own SnapKVPress() (window_size=64, kernel_size=5, average pooling),
    # as its leaderboard runs them: the rows name kvpress's presses (our `snapkv` keeps the SnapKV authors' settings)
    "pyramidkv": {"name": "snapkv", **KVPRESS_SNAPKV, "layers": "pyramid"},  # PyramidKVPress: SnapKV under the pyramid of budgets
    "chunkkv": {"name": "snapkv", **KVPRESS_SNAPKV, "chunk": 20},  # ChunkKVPress(press=SnapKVPress(), chunk_length=20)
    "criticalkv": {"name": "snapkv", **KVPRESS_SNAPKV, "critical": True},  # the leaderboard's CriticalKV: CriticalKVPress(SnapKVPress())
    "critical-adakv": {"name": "snapkv", **KVPRESS_SNAPKV, "critical": True, "heads": "adaptive"},  # CriticalAdaKVPress(SnapKVPress())
    "adakv-snapkv": {"name": "snapkv", **KVPRESS_SNAPKV, "heads": "adaptive"},  # AdaKVPress(SnapKVPress())
    # the leaderboard's ExpectedAttention: AdaKVPress(ExpectedAttentionPress(epsilon=1e-2))
    "adakv-expected-attention": {"name": "expected-attention", "heads": "adaptive", "epsilon": 0.01},
    "adakv-compactor": {"name": "compactor", "heads": "adaptive"},  # the leaderboard's AdaKVPress(CompactorPress())
}


# kvpress's presses that rest on weights trained per model and downloaded from the Hugging Face Hub when they run:
# attnbench never downloads weights at run time, so they are refused by name with where their weights would come from
NEEDS_DOWNLOAD: dict[str, str] = {
    "qfilter": "kvpress's QFilterPress (Godey et al. 2025) projects keys on filters trained per model, downloaded from "
               "the Hub (nthngdy/<model>_qfilt)",
    "kvzap": "kvpress's KVzapPress (Jégou and Jeblick 2026) scores positions with a small model trained per model, "
             "downloaded from the Hub (nvidia/KVzap-<type>-<model>); kvzip, which it approximates, needs none",
    "fastkvzip": "kvpress's FastKVzipPress scores positions with gates trained per model, downloaded from the Hub "
                 "(Jang-Hyun/Fast-KVzip); kvzip, which it approximates, needs none",
}


def download_refusal(name: str) -> str | None:
    """Why a press that needs downloaded weights is not offered (its name as kvpress writes it, with _ or -), or None."""
    key = name.lower().replace("_", "").replace("-", "").removesuffix("press")
    for press, why in NEEDS_DOWNLOAD.items():
        if key == press:
            return f"{name}: {why}; attnbench never downloads weights at run time, so it is not offered"
    return None
