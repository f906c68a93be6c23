"""Gemma-3-270M, where `make model MODEL=gemma-3-270m` has converted it (skipped elsewhere): its config read as a
hybrid (3 global layers of 18, a 512-key window elsewhere), its heads captured from the global layers alone by name,
and its recording forward pass past the window what transformers' own gives."""

from __future__ import annotations

import json
import os

import pytest
import torch
from attnbench.model.known import known_model
from helpers import run_cli

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def gemma_dir():
    folder = known_model("gemma").folder
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"no Gemma-3-270M at {folder} (`make model MODEL=gemma-3-270m`)")
    return folder


def test_its_config_is_a_hybrid(gemma_dir) -> None:
    from attnbench.model.layer_kinds import layer_windows, unrouted_reason

    config = json.loads((gemma_dir / "config.json").read_text())
    assert [i for i, w in enumerate(layer_windows(config)) if w is None] == [5, 11, 17]
    assert set(layer_windows(config)) == {512, None} and unrouted_reason(config) is None


def test_heads_by_name_keep_the_global_layers(tmp_path, gemma_dir, monkeypatch) -> None:
    monkeypatch.setenv("ATTNBENCH_HEADS", str(tmp_path / "heads"))
    done = run_cli("heads", "gemma", "--positions", "32", env=os.environ.copy())
    assert done.returncode == 0, done.stderr
    manifest = json.loads((tmp_path / "heads" / "Gemma-3-270M" / "heads.json").read_text())
    assert manifest["layers"] == [5, 11, 17] and manifest["attention"].startswith("global layers only: 3 of 18")
    assert manifest["positions"] == 96 and manifest["head_dim"] == 256 and "limited_by" not in manifest


def test_the_recording_pass_past_the_window_is_the_models_own(gemma_dir) -> None:
    from attnbench.model.capture import load_base_model, record_attention

    model, _ = load_base_model(gemma_dir)
    ids = torch.randint(1000, 20000, (1, 700), generator=torch.Generator().manual_seed(0))  # past the 512-key window
    with torch.no_grad():
        reference = model(input_ids=ids).last_hidden_state
    seen = {}
    hook = model.register_forward_hook(lambda module, args, out: seen.update(out=out.last_hidden_state))
    try:
        record = record_attention(model, ids, keep=[5, 11, 17])
    finally:
        hook.remove()
    assert len(record.q) == 3 and record.calls == 18
    torch.testing.assert_close(seen["out"], reference, atol=1e-3, rtol=1e-3)
