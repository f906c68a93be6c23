"""`attnbench model` on the real decoder, SmolLM2-135M, and the shipped text (marked `model`: skipped where the
model's folder is absent; `make model` writes it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from attnbench.cli import main
from attnbench.model.study import NATIVE_TOLERANCE, ModelStudy, load_model
from attnbench.model.texts import TUTORIAL
from attnbench.plan.cells import VariantSpec

pytest.importorskip("transformers")
pytestmark = pytest.mark.model
N = 512


@pytest.fixture(scope="module")
def study(model_dir: Path) -> ModelStudy:
    """The exact model on the text's first N tokens."""
    from transformers import AutoTokenizer

    model, kind = load_model(model_dir)
    ids = AutoTokenizer.from_pretrained(str(model_dir)).encode(TUTORIAL.read_text(), return_tensors="pt")[:, :N]
    return ModelStudy(model, kind, ids, ids)


def test_full_has_the_perplexity_of_transformers_own_sdpa_forward(study: ModelStudy) -> None:
    """`full` swapped into every layer: transformers' complete forward with its own SDPA attention, its logits
    built whole and its own loss, gives the same perplexity (the study slices the logits and routes attention)."""
    study.model.set_attn_implementation("sdpa")
    try:
        with torch.no_grad():
            own = study.model(input_ids=study.ids, labels=study.ids, use_cache=False)
    finally:
        study.model.set_attn_implementation("attnbench")
    final = next(row for row in study.rows(VariantSpec("full")) if row.layer == "final")
    assert final.status == "ok" and final.seq_len == N
    assert abs(final.perplexity / math.exp(float(own.loss)) - 1) < NATIVE_TOLERANCE
    assert abs(final.perplexity_exact / math.exp(float(own.loss)) - 1) < NATIVE_TOLERANCE
    assert study.native.perplexity_difference < NATIVE_TOLERANCE and study.native.output_difference < NATIVE_TOLERANCE
    assert 5 < final.perplexity < 50  # a working model on English prose, not a broken one


@pytest.mark.slow  # a whole run through the command, two lengths, the report and its plots
def test_a_run_at_two_lengths_writes_rows_per_length_and_the_perplexity_plot(model_dir: Path, tmp_path: Path) -> None:
    argv = ["model", str(model_dir), "--variants", "full,band(window=16)", "--text-file", str(TUTORIAL),
            "--seq-len", "64", "128", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    run = next(tmp_path.iterdir())
    rows = pd.read_csv(run / "model.csv")
    finals = rows[rows.layer == "final"]
    assert sorted(zip(finals.label, finals.seq_len)) == [("band(window=16)", 64), ("band(window=16)", 128),
                                                         ("full", 64), ("full", 128)]  # fmt: skip
    assert set(rows.swap) == {"all"} and rows.speedup.isna().all()  # single-layer swaps and timing are off
    band = finals[finals.label == "band(window=16)"].set_index("seq_len")
    assert (band.perplexity_ratio > 1.01).all()  # a 16-token window costs perplexity at both lengths
    meta = json.loads((run / "meta.json").read_text())
    assert meta["seq_lens"] == [64, 128] and set(meta["native_check"]) == {"64", "128"}
    assert all(c["perplexity_difference"] < NATIVE_TOLERANCE for c in meta["native_check"].values())
    assert meta["head_check"]["loss_difference"] < NATIVE_TOLERANCE
    assert (run / "plots" / "perplexity-vs-n.png").stat().st_size > 0
    assert "perplexity-vs-n.png" in (run / "report.md").read_text()
