"""The methods the papers name, as settings of the registry's variants that compute them (`attnbench generate
--methods quest,streamingllm`): declared once, below every layer that names them (generation grids, `run`'s hint
for a paper's name given as a variant). Their papers' own parameter names are `generation.grid.PAPER_PARAMETERS`."""

from __future__ import annotations

from typing import Any

QUEST = {"name": "topk", "score": "minmax", "block_size": 16, "dense_layers": 2}
ALIASES: dict[str, dict[str, Any]] = {
    # Quest as its code selects (evaluation/quest_attention.py, its kernels): pages ranked per query head by the
    # min/max bound, the current page always read, no forced first page, the first two layers dense
    "quest": {**QUEST, "keep_first_block": False, "select_per": "query-head"},
    # the NSA-style departure (attnbench's Quest before 2026-11-28): the first page always read, a key/value head's
    # pages ranked by the mean of its query heads' bounds
    "quest-first-page": {**QUEST, "keep_first_block": True, "select_per": "kv-head"},
    "streamingllm": {"name": "band", "sinks": 4},
}
