"""Real heads end to end: `attnbench heads` on the real decoder writes what the `heads` input reads (the model's
own q/k/v, as `capture` records them); a causal run with --tune on captured heads answers with a setting, the
smallest knob value within the budget, judged on the heads, and draws the knob's curve in the report."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from attnbench.inputs.captured import read_tensors
from helpers import only_run, run_cli, write_tiny


@pytest.mark.slow
def test_tune_answers_with_the_smallest_window_within_the_budget_on_the_heads(tmp_path, fake_heads):
    fake_heads(positions=300, head_dim=16, local=3.0)  # attention on the diagonal: a short window is nearly exact
    config = write_tiny(tmp_path / "tune.toml", seq_lens=[256], heads=4, head_dim=16, causal=True, min_run_time=0.02,
                        text='[[inputs]]\nname = "realistic"\n[[inputs]]\nname = "heads"\ntext = "code"\n'
                        '[[variants]]\nname = "band"\nwindow = 64\nsinks = 4\n')  # fmt: skip
    done = run_cli("run", str(config), "--tune", "--out", str(tmp_path / "out"), "--no-progress",
                   env=os.environ.copy())  # fmt: skip
    assert done.returncode == 0, done.stderr
    run = only_run(tmp_path / "out")
    tuning = pd.read_csv(run / "tuning.csv")
    band = tuning[tuning.setting == "band(sinks=4)"].set_index("value")
    assert set(band.evidence) == {"heads(text=code)"}  # judged on the real heads, not on realistic
    [pick] = band.index[band["pick"]]
    assert band.loc[pick, "err_vs_uniform"] <= 0.5
    below = [value for value in band.index if value < pick]
    assert all(band.loc[value, "err_vs_uniform"] > 0.5 for value in below)  # nothing smaller was within
    assert pick == 16  # on diagonal attention the ladder's smallest window is within
    assert band.loc[pick, "speedup"] == band.loc[pick, "speedup"]  # timed in turns with full
    summary = (run / "summary.md").read_text()
    assert "Tuned at N=256 (forward, causal, error on real heads (code))" in summary
    assert "Evidence" in summary and "on real heads (code)" in summary
    assert "plots/tuning.png" in (run / "report.md").read_text() and (run / "plots" / "tuning.png").is_file()


@pytest.mark.model
@pytest.mark.slow
def test_heads_of_the_real_decoder_are_its_own_attention_inputs(tmp_path, model_dir, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_HEADS", str(tmp_path / "heads"))
    done = run_cli("heads", str(model_dir), "--positions", "32", env=os.environ.copy())  # and 64 for decode steps
    assert done.returncode == 0, done.stderr
    folder = tmp_path / "heads" / model_dir.name
    manifest = json.loads((folder / "heads.json").read_text())
    assert manifest["positions"] == 96 and manifest["layers"] == [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]
    refused = run_cli("heads", str(model_dir), "--positions", "100000", env=os.environ.copy())
    assert refused.returncode == 2 and "beyond the model's 8192 positions" in refused.stderr
    assert (folder / "heads.json").is_file()  # a refused (or failed) capture leaves the one before
    assert set(manifest["texts"]) == {"prose", "code"}
    captured = tmp_path / "one.pt"  # the same text through `capture`: every layer, float32
    from attnbench.model.texts import ARGPARSE

    done = run_cli("capture", str(model_dir), "--text-file", str(ARGPARSE), "--seq-len", "96", "--out", str(captured))
    assert done.returncode == 0, done.stderr
    ours, theirs = read_tensors(folder / "code.pt"), read_tensors(captured)
    for role in "qkv":
        assert torch.allclose(ours[role].float(), theirs[role][manifest["layers"]], atol=2e-2, rtol=2e-3)
    from attnbench.inputs.catalogue import make_inputs

    inputs = make_inputs("heads", {"text": "code", "model": str(folder)}, batch=1, heads=4, seq_len=64, head_dim=64,
                         dtype=torch.float32, device=torch.device("cpu"), seed=0, causal=True)  # fmt: skip
    assert inputs.q.shape == (1, 4, 64, 64) and torch.isfinite(inputs.q).all()
