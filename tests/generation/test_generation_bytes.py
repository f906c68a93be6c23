"""One axis of bytes for a generation grid: each row's family from its variant, hyperparameters and `quantize` (the
registry's classes saying what a press is, no list of names), bytes held and read per token of context, the verdict's
cheapest setting within the exact model's accuracy (the ranking's interval rule, ties and "none"), and the headline
figure: accuracy against bytes held per token, a line per method coloured by family, written first among the report's
plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from attnbench.report.generation import interval_of, summarize, verdict_lines, write_generation_report
from attnbench.report.generation_bytes import (
    EVICTION, EVICTION_QUANTIZED, EXACT, EXACT_LINE, FAMILIES, HEADWISE, OTHER, PAGES, QUANTIZED, RECURRENT,
    bytes_frame, bytes_lines, family_of, per_token_text, with_bytes,
)  # fmt: skip
from attnbench.report.generation_plots import plot_accuracy_vs_bytes
from attnbench.report.generation_verdict import below_exact, cheapest_text, cheapest_within, pooled
from attnbench.runfolder.generations import COLUMNS
from attnbench.stats import Interval
from attnbench.variants.press import ScoredPress

EXACT_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M's keys and values, every layer, float32: 46,080 bytes a token
SAMPLES = 10


class NormPress(ScoredPress):
    """A press no list names (Knorm's rule): the registry's class alone says it evicts."""

    name = "test-norm-press"

    def score(self, q, k, v):  # noqa: ANN001, ANN201
        return -k.norm(dim=-1)


@pytest.mark.parametrize(
    ("variant", "hparams", "quantize", "decode", "family"),
    [
        ("full", {}, "", "own", EXACT),
        ("full", {}, "kivi-4", "own", QUANTIZED),
        ("kivi", {}, "", "own", QUANTIZED),
        ("kivi", {}, "kivi-2", "own", QUANTIZED),
        ("band", {"window": 255, "sinks": 4}, "", "own", EVICTION),  # StreamingLLM
        ("h2o", {"budget": 256}, "", "own", EVICTION),
        ("snapkv", {"budget": 256}, "", "own", EVICTION),
        ("test-norm-press", {"budget": 256}, "", "own", EVICTION),
        ("snapkv", {"budget": 256, "heads": "adaptive"}, "", "own", HEADWISE),  # AdaKV
        ("test-norm-press", {"heads": "adaptive"}, "", "own", HEADWISE),
        ("duo-attention", {}, "", "own", HEADWISE),
        ("snapkv", {"budget": 256}, "kivi-4", "own", EVICTION_QUANTIZED),
        ("h2o", {"budget": 256}, "kivi-2", "own", EVICTION_QUANTIZED),
        ("snapkv", {"heads": "adaptive"}, "kivi-2", "own", EVICTION_QUANTIZED),
        ("topk", {"top_k": 3}, "", "own", PAGES),  # Quest: reads less, holds all
        ("gla", {}, "", "own", RECURRENT),
        ("retnet", {}, "", "own", RECURRENT),
        ("deltanet", {}, "", "own", RECURRENT),
        ("gated-deltanet", {}, "", "own", RECURRENT),
        ("linear", {}, "", "own", RECURRENT),
        ("lsh", {}, "", "own", OTHER),
        ("think", {"key_channels": 0.5}, "", "own", OTHER),  # prunes key channels, keeps every token
        ("band", {"window": 255}, "", "exact", OTHER),  # its sparse prefill, then the whole cache decoded exactly
        ("topk", {}, "kivi-4", "own", OTHER),  # a mix the rule does not name
        ("not-installed-here", {}, "", "own", OTHER),
    ],
)
def test_the_family_rule(toy_registry, variant: str, hparams: dict, quantize: str, decode: str, family: str) -> None:
    assert family_of(variant, hparams, quantize, decode, toy_registry(NormPress)) == family


def row(method: str, variant: str, share: float | None, n: int, sample: int, hit: bool, per_token: float | None,
        hparams: dict | None = None, **extra) -> dict:  # fmt: skip
    """One ok needle row at N = n: its states hold `per_token` bytes a token of its n-token prompt (a step reads it
    too; Quest reads less)."""
    held = None if per_token is None else round(per_token * n)
    read = held if variant != "topk" else round(EXACT_PER_TOKEN * n * share)
    return dict(key=f"{method}{share}{n}{sample}", task="passkey", seq_len=n, protocol="question-agnostic",
                sample=sample, method=method, variant=variant, hparams=json.dumps(hparams or {}), prefill="dense",
                dense_layers=0, decode="own", share=share, status="ok", reason="", score=float(hit), prompt_tokens=n,
                cache_bytes=held, read_bytes=read, cache_share=None if held is None else per_token / EXACT_PER_TOKEN,
                read_share=1.0, **extra)  # fmt: skip


GRID = [  # (method, variant, hparams, quantize, share, hits of SAMPLES, bytes held per token; None: a fixed state)
    ("full", "full", {}, "", None, 10, EXACT_PER_TOKEN),
    ("snapkv", "snapkv", {}, "", 0.125, 9, EXACT_PER_TOKEN / 8),
    ("h2o", "h2o", {}, "", 0.125, 0, EXACT_PER_TOKEN / 8),  # as cheap, clearly below the exact model
    ("snapkv", "snapkv", {}, "", 0.5, 10, EXACT_PER_TOKEN / 2),
    ("adakv", "snapkv", {"heads": "adaptive"}, "", 0.125, 8, EXACT_PER_TOKEN / 8 * 1.02),
    ("full kivi-4", "full", {}, "kivi-4", None, 10, EXACT_PER_TOKEN / 4),
    ("snapkv kivi-2", "snapkv", {}, "kivi-2", 0.5, 10, EXACT_PER_TOKEN / 16),  # the cheapest within
    ("quest", "topk", {}, "", 0.125, 9, EXACT_PER_TOKEN),
    ("deltanet", "deltanet", {}, "", None, 0, None),
]  # fmt: skip
STATE = 30 * 9 * 64 * 64 * 4  # deltanet's fixed state, every layer: the same bytes at every N


def grid_rows() -> pd.DataFrame:
    out = []
    for n in (1024, 2048):
        for method, variant, hparams, quantize, share, hits, per_token in GRID:
            for sample in range(SAMPLES):
                out.append(row(method, variant, share, n, sample, sample < hits, STATE / n if per_token is None
                               else per_token, hparams, quantize=quantize))  # fmt: skip
    frame = pd.DataFrame(out)
    return frame.reindex(columns=COLUMNS + [c for c in frame if c not in COLUMNS])


def test_bytes_per_token_are_the_states_bytes_over_the_prompts_tokens() -> None:
    rows = with_bytes(grid_rows())
    exact = rows[rows.method == "full"]
    assert (exact.held_per_token == EXACT_PER_TOKEN).all() and (exact.read_per_token == EXACT_PER_TOKEN).all()
    quest = rows[rows.method == "quest"]
    assert (quest.held_per_token == EXACT_PER_TOKEN).all()  # holds every key
    assert math.isclose(quest.read_per_token.iloc[0], EXACT_PER_TOKEN / 8)  # reads its budget
    state = rows[rows.method == "deltanet"].drop_duplicates("seq_len").set_index("seq_len").held_per_token
    assert state[1024] == STATE / 1024 and state[2048] == STATE / 2048  # fixed bytes over the context: halves at 2N
    assert set(rows.family) == {EXACT, EVICTION, HEADWISE, QUANTIZED, EVICTION_QUANTIZED, PAGES, RECURRENT}
    assert rows[rows.method == "full kivi-4"].family.eq(QUANTIZED).all()


def test_rows_without_bytes_or_a_prompt_length_have_none() -> None:
    rows = grid_rows().drop(columns=["cache_bytes", "read_bytes"])
    assert with_bytes(rows).held_per_token.isna().all()
    rows = grid_rows().assign(prompt_tokens=[0, math.nan] * (len(grid_rows()) // 2))
    assert with_bytes(rows).held_per_token.isna().all()


def test_per_token_text() -> None:
    assert [per_token_text(b) for b in (46080, 5760, 768, 3 * 1024 * 1024, math.nan)] == \
        ["45 KiB", "5.62 KiB", "768 B", "3 MiB", "–"]  # fmt: skip


def test_the_bytes_table_puts_the_exact_model_first_at_each_n() -> None:
    frame = bytes_frame(grid_rows())
    for _, at in frame.groupby("seq_len"):
        assert at.iloc[0].method == "full" and at.iloc[0].held_per_token == EXACT_PER_TOKEN


def pooled_at(n: int = 2048, rows: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = grid_rows() if rows is None else rows
    overall = pooled(rows, summarize(rows))
    return overall[overall.seq_len == n]


def exact_of(here: pd.DataFrame) -> Interval:
    return interval_of(here[here.exact_method].iloc[0])


def test_the_cheapest_within_the_exact_models_accuracy() -> None:
    here = pooled_at()
    best = cheapest_within(here, exact_of(here), EXACT_PER_TOKEN)
    assert list(best.method) == ["snapkv kivi-2"] and best.iloc[0].family == EVICTION_QUANTIZED
    text = cheapest_text(here, exact_of(here))
    assert "snapkv kivi-2 at 1/2 (eviction + quantized) 100% [72–100], holding 2.81 KiB per token (6.2% of the " \
           "exact model's 45 KiB)" in text  # fmt: skip
    deltanet = here[here.method == "deltanet"].iloc[0]  # cheaper still, but clearly below the exact model
    assert deltanet.held_per_token < best.iloc[0].held_per_token
    assert below_exact(interval_of(deltanet), exact_of(here))


def test_ties_at_the_fewest_bytes_are_all_named() -> None:
    here = pooled_at()
    here = here[~here.method.isin(["snapkv kivi-2", "full kivi-4", "adakv"])]  # snapkv and h2o at 1/8 tie on bytes
    here = here.assign(accuracy=here.accuracy.where(here.method != "h2o", 0.8),
                       low=here.low.where(here.method != "h2o", 0.5), high=here.high.where(here.method != "h2o", 0.95))
    best = cheapest_within(here, exact_of(here), EXACT_PER_TOKEN)
    assert list(best.method) == ["h2o", "snapkv"]
    assert "h2o at 1/8 (eviction) 80% [50–95] and snapkv at 1/8 (eviction) 90% [59–99], tied, holding 5.62 KiB" in \
        cheapest_text(here, exact_of(here))  # fmt: skip


def test_none_qualifies() -> None:
    here = pooled_at()
    cheaper = ~here.exact_method & (here.held_per_token < EXACT_PER_TOKEN)
    failing = here.assign(accuracy=here.accuracy.where(~cheaper, 0.0), low=here.low.where(~cheaper, 0.0),
                          high=here.high.where(~cheaper, 0.28))  # fmt: skip
    assert cheapest_within(failing, exact_of(here), EXACT_PER_TOKEN).empty
    assert cheapest_text(failing, exact_of(here)).endswith(
        ": none; every setting holding fewer bytes per token than the exact model's 45 KiB lies clearly below it.")
    only_quest = here[here.exact_method | (here.method == "quest")]  # holds every key: no saving
    assert cheapest_text(only_quest, exact_of(here)).endswith(
        ": none; no setting holds fewer bytes per token than the exact model's 45 KiB.")
    assert cheapest_text(here, None) == ""  # no exact row: nothing to be within


def test_the_verdict_names_the_cheapest_at_each_n_and_keeps_its_other_lines() -> None:
    rows = grid_rows()
    lines = verdict_lines(rows, summarize(rows))
    cheapest = [line for line in lines if line.startswith("- fewest bytes held per token")]
    assert len(cheapest) == 2 and all("snapkv kivi-2 at 1/2" in line for line in cheapest)
    assert any("budget of 1/8" in line and "Against the exact model" in line for line in lines)
    old = verdict_lines(rows.drop(columns=["cache_bytes"]), summarize(rows))  # a run from before the columns
    assert not [line for line in old if "fewest bytes" in line] and len(old) == len(lines) - 2


def test_the_headline_figure_has_a_line_per_method_grouped_by_family_and_comes_first(tmp_path: Path) -> None:
    rows = grid_rows()
    lines = bytes_lines(pooled(rows, summarize(rows)))
    methods = {m for m, *_ in GRID if m != "full"}
    assert set(lines.line) == methods | {EXACT_LINE} and set(lines.family) <= set(FAMILIES)
    for (_, _), at in lines.groupby(["seq_len", "line"]):
        assert at.method.nunique() == 1  # no line joins two methods (snapkv and h2o at 1/8 would zigzag)
        assert at.held_per_token.is_monotonic_increasing  # a method's settings in order of bytes
    for _, at in lines[~lines.exact_method].groupby("seq_len"):
        ranks = [list(FAMILIES).index(f) for f in at.family]
        assert ranks == sorted(ranks)  # grouped by family, the legend's order
    report = write_generation_report(tmp_path, rows, {"command": ["attnbench", "generate"], "grid": "t"}).read_text()
    assert (tmp_path / "plots" / "generation-accuracy-vs-bytes.png").is_file()
    images = [line for line in report.splitlines() if line.startswith("![")]
    assert "generation-accuracy-vs-bytes.png" in images[0] and "generation-accuracy-vs-kept.png" in images[1]
    assert "holds / token" in report and "| eviction + quantized | snapkv kivi-2 | 1/2 | 2,048 | 2.81 KiB" in report


def test_the_report_renders_rows_without_a_quantize_column(tmp_path: Path) -> None:
    rows = grid_rows()  # as a run from before the column: none quantized, no `quantize`
    rows = rows[~rows.method.isin(["full kivi-4", "snapkv kivi-2"])].drop(columns=["quantize"])
    report = write_generation_report(tmp_path, rows, {"command": ["attnbench", "generate"], "grid": "t"}).read_text()
    assert (tmp_path / "plots" / "generation-accuracy-vs-bytes.png").is_file()
    assert "snapkv at 1/8 (eviction) 90% [59–99]" in report  # the cheapest within the exact model's, at 1/8


def test_a_quantized_full_is_not_the_exact_model() -> None:
    rows = grid_rows()
    overall = pooled(rows, summarize(rows))
    assert set(overall[overall.exact_method].method) == {"full"}


def test_two_protocols_draw_a_line_per_method_and_protocol(tmp_path: Path) -> None:
    rows = grid_rows()
    aware = rows.assign(protocol="question-aware", key=rows.key + "aware")
    both = pd.concat([rows, aware], ignore_index=True)
    lines = bytes_lines(pooled(both, summarize(both)))
    assert {"snapkv (question-aware)", "snapkv (question-agnostic)", "exact model (question-aware)"} <= set(lines.line)
    [(path, _)] = plot_accuracy_vs_bytes(lines, ["passkey"], tmp_path)
    assert path == tmp_path / "generation-accuracy-vs-bytes.png" and path.is_file()
