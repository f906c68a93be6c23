"""One axis of bytes for every KV-cache method of a generation grid: what a row's states hold after the prompt and what
its first step reads, every layer, per token of context — `cache_bytes` and `read_bytes` ÷ `prompt_tokens` — so
eviction, head-wise budgets, quantization and a recurrent state's fixed bytes (divided by the context the same way:
its figure falls as the context grows) sit on one scale beside the exact model's.

Each row's **family**, the one rule (`family_of`), from the row (variant, hyperparameters, `quantize`, `decode`) and
what the registry's classes declare, so a new press or plugin is placed without a list of names to keep up:
- exact: `full`, every key and value in full precision (the class's `family = "exact"`);
- eviction: drops positions: every class declaring `budget_knob` (each `ScoredPress`: SnapKV, Knorm, TOVA, ...) and
  the other KV-cache classes (`family = "kv-cache"`: H2O) and StreamingLLM's window (`family = "band"`);
- head-wise: eviction under per-head budgets (`heads = "adaptive"`, AdaKV's wrapper; DuoAttention);
- quantized: every position kept at fewer bits (`full` with `quantize`, or KIVI);
- eviction + quantized: an eviction (or head-wise) method whose kept positions are quantized;
- page selection: holds every key, reads a chosen share a step (`family = "block-sparse"`: Quest; BigBird, the
  other, has no causal form to generate with);
- recurrent: a fixed state whatever the context (`family` "linear" or "gated-linear": linear attention, GLA, RetNet,
  DeltaNet, Gated DeltaNet);
- other: the rest (a sparse prefill decoded exactly, low-rank, hashing, ThinK's pruned key channels, a mix the rule
  does not name, a variant not installed where the report runs).
The rule lives here, not in `attnbench.generation`: report/ importing generation/ would close a cycle of rooms
(generation -> model -> report). The headline figure's data (`bytes_lines`: a line per method, coloured by family)
and the bytes table are here too; `generation_plots` draws it, `generation_verdict` names the cheapest setting
within the exact model's accuracy.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from attnbench.registry import Registry
from attnbench.registry import registry as default_registry
from attnbench.report.generation_summary import is_exact, labelled, quantize_of
from attnbench.report.text import share_text

EXACT, EVICTION, HEADWISE, QUANTIZED = "exact", "eviction", "head-wise", "quantized"
EVICTION_QUANTIZED, PAGES, RECURRENT, OTHER = "eviction + quantized", "page selection", "recurrent", "other"
FAMILIES = {  # family -> what it saves, in the order the report lists them
    EXACT: "the exact model, every key and value of every layer in full precision",
    EVICTION: "drops positions of the prompt's cache (a window, H2O, every scored press)",
    HEADWISE: "drops positions under a budget per head (AdaKV's adaptive heads, DuoAttention)",
    QUANTIZED: "keeps every position at fewer bits (KIVI)",
    EVICTION_QUANTIZED: "drops positions and quantizes the ones it keeps",
    PAGES: "holds every key and reads a share of them a step (Quest)",
    RECURRENT: "a fixed state whatever the context (linear, gated and delta-rule RNNs)",
    OTHER: "any other method (a sparse prefill decoded exactly, low-rank, hashing, pruned key channels)",
}  # fmt: skip
NAMED = {"kivi": QUANTIZED, "duo-attention": HEADWISE, "think": OTHER}  # KV-cache classes that do not evict
CLASS_FAMILIES = {"exact": EXACT, "kv-cache": EVICTION, "band": EVICTION, "block-sparse": PAGES, "linear": RECURRENT,
                  "gated-linear": RECURRENT}  # the registry class's `family` -> its cache's family  # fmt: skip
ADAPTIVE = ("heads", "adaptive")  # the press wrapper (`variants.press.WRAPPERS`) that makes budgets head-wise
WITH_QUANTIZE = {EXACT: QUANTIZED, QUANTIZED: QUANTIZED, EVICTION: EVICTION_QUANTIZED, HEADWISE: EVICTION_QUANTIZED}


def family_of(variant: str, hparams: dict[str, Any], quantize: str = "", decode: str = "own",
              registry: Registry = default_registry) -> str:  # fmt: skip
    """The family (FAMILIES) of a method: `quantize` its quantized storage ("" none); `decode` "exact" for a method
    decoding exactly after its own prefill (it holds the whole cache: other). Quantized storage over a family it does
    not combine with (page selection, a recurrent state) is other."""
    if decode == "exact":
        return OTHER
    base = _cache_family(variant, hparams, registry)
    return WITH_QUANTIZE.get(base, OTHER) if quantize else base


def _cache_family(variant: str, hparams: dict[str, Any], registry: Registry) -> str:
    """The family of the method's cache at full precision."""
    if variant in NAMED:
        return NAMED[variant]
    if hparams.get(ADAPTIVE[0]) == ADAPTIVE[1]:
        return HEADWISE
    try:
        cls = registry.load(variant)
    except Exception:  # unknown or broken: the registry reports it; the row is placed as other
        return OTHER
    return EVICTION if getattr(cls, "budget_knob", False) else CLASS_FAMILIES.get(cls.family, OTHER)


KIB = 1024
EXACT_LINE = "exact model"  # the headline figure's name of the exact model's point
BYTES_COLUMNS = ["seq_len", "family", "method", "share", "held_per_token", "read_per_token", "exact_method"]
LINE_COLUMNS = ["seq_len", "protocol", "family", "line", "method", "share", "held_per_token", "accuracy", "low",
                "high", "exact_method"]  # fmt: skip


def hparams_of(text: object) -> dict:
    """A row's `hparams` JSON as a dict ({} where empty or unreadable)."""
    try:
        value = json.loads(text) if isinstance(text, str) and text else {}
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def row_families(rows: pd.DataFrame, registry: Registry = default_registry) -> pd.Series:
    """Per row, its family (`family_of`) from its variant, hyperparameters, `quantize` (absent in runs from
    before the column: none) and `decode`; the exact model's rows are `exact`."""
    decode = rows.decode.fillna("own").astype(str) if "decode" in rows else pd.Series("own", index=rows.index)
    keys = list(zip(rows.variant.astype(str), rows.hparams.fillna("").astype(str), quantize_of(rows), decode))
    found = {key: family_of(key[0], hparams_of(key[1]), key[2], key[3], registry) for key in set(keys)}
    return pd.Series([found[key] for key in keys], index=rows.index, dtype=object)


def per_token(nbytes: pd.Series, tokens: pd.Series) -> pd.Series:
    """Bytes ÷ the prompt's tokens, per row (NaN where either is missing: a run from before the columns)."""
    tokens = pd.to_numeric(tokens, errors="coerce")
    return pd.to_numeric(nbytes, errors="coerce") / tokens.where(tokens > 0)


def with_bytes(rows: pd.DataFrame, registry: Registry = default_registry) -> pd.DataFrame:
    """The rows with `family`, `held_per_token` (cache_bytes ÷ prompt_tokens: every layer, after the prompt) and
    `read_per_token` (read_bytes ÷ prompt_tokens: what its first step reads)."""
    missing = {c: math.nan for c in ("cache_bytes", "read_bytes", "prompt_tokens") if c not in rows}
    rows = rows.assign(**missing) if missing else rows
    return rows.assign(family=row_families(rows, registry),
                       held_per_token=per_token(rows.cache_bytes, rows.prompt_tokens),
                       read_per_token=per_token(rows.read_bytes, rows.prompt_tokens))  # fmt: skip


def family_rank(family: str) -> int:
    """A family's place in FAMILIES' order (the report lists them so)."""
    return list(FAMILIES).index(family) if family in FAMILIES else len(FAMILIES)


def bytes_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (N, method, share) over every ok row (BYTES_COLUMNS): its family and its mean bytes held and read
    per token; by N, the exact model first, then by family and bytes held."""
    ok = with_bytes(labelled(rows[rows.status == "ok"]))
    ok = ok.assign(share_key=ok.share.fillna(-1.0), exact_row=is_exact(ok))
    out = [dict(seq_len=int(n), family=at.family.iloc[0], method=method, share=None if share < 0 else float(share),
                held_per_token=at.held_per_token.mean(), read_per_token=at.read_per_token.mean(),
                exact_method=bool(at.exact_row.all()))
           for (n, method, share), at in ok.groupby(["seq_len", "method", "share_key"], sort=False)]  # fmt: skip
    frame = pd.DataFrame(out, columns=BYTES_COLUMNS)
    order = [(r.seq_len, not r.exact_method, family_rank(r.family), r.held_per_token) for r in frame.itertuples()]
    return frame.iloc[sorted(range(len(frame)), key=lambda i: order[i])].reset_index(drop=True)


def per_token_text(nbytes: float) -> str:
    """'45 KiB', '5.63 KiB', '768 B' (three digits); '–' where unknown."""
    if nbytes != nbytes:
        return "–"
    if nbytes < KIB:
        return f"{nbytes:.3g} B"
    return f"{nbytes / KIB:.3g} KiB" if nbytes < KIB * KIB else f"{nbytes / KIB / KIB:.3g} MiB"


def bytes_table(frame: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The `bytes_frame` as a table: family, method, budget, N, bytes held and read per token."""
    headers = ["family", "method", "kept", "N", "holds / token", "a step reads / token"]
    table = [[r.family, r.method, share_text(r.share), f"{r.seq_len:,}" if r.seq_len else "own",
              per_token_text(r.held_per_token), per_token_text(r.read_per_token)]
             for r in frame.itertuples()]  # fmt: skip
    return headers, table


def bytes_caption() -> str:
    """What the bytes table counts and what each family is."""
    families = "; ".join(f"{name}: {words}" for name, words in FAMILIES.items())
    return (
        "Bytes per token of context: what a method's states hold after the prompt, every layer (`cache_bytes`), and "
        "what its first step reads of them (`read_bytes`), each divided by the prompt's tokens (`prompt_tokens`; the "
        "question's among them where it is inside the prompt); mean over samples, the exact model's row first at each "
        "N. A recurrent state's bytes are fixed and divided by the context the same way, so its figure falls as N "
        f"grows. Families: {families}."
    )


def bytes_lines(overall: pd.DataFrame) -> pd.DataFrame:
    """The headline figure's data (LINE_COLUMNS): per N, a line per method (and protocol, named with it where the rows
    have several) through its settings ordered by bytes held per token, grouped by family (the figure's colour), and
    the exact model's point; from the verdict's pooled frame (`generation_verdict.pooled`), the settings with bytes
    only. A line never joins two methods: those of one family at one cost would zigzag between their accuracies."""
    known = overall[overall.held_per_token.notna()] if len(overall) else overall
    if known.empty:
        return pd.DataFrame(columns=LINE_COLUMNS)
    several = known.protocol.nunique() > 1
    names = [EXACT_LINE if exact else method for method, exact in zip(known.method, known.exact_method)]
    lines = known.assign(line=[f"{name} ({protocol})" if several else name
                               for name, protocol in zip(names, known.protocol)])  # fmt: skip
    order = [(r.seq_len, not r.exact_method, family_rank(r.family), r.method, r.protocol, r.held_per_token)
             for r in lines.itertuples()]  # fmt: skip
    lines = lines.iloc[sorted(range(len(lines)), key=lambda i: order[i])]
    return lines[LINE_COLUMNS].reset_index(drop=True)
