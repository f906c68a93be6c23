"""`attnbench generate` as a user runs it, on a tiny random Llama that uses SmolLM2's tokenizer (marked `model`: the
tokenizer comes from the real folder): a grid runs and reports, a killed grid resumes to exactly its planned rows,
and bad input is refused before any folder is written."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import run_cli

pytestmark = [pytest.mark.model, pytest.mark.slow]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
GRID = """tasks = ["passkey", "continuation"]
seq_lens = [160]
samples = 2
block = 1
keep = [0.5, 0.25]
continuation_tokens = 8
methods = ["h2o", {name = "band", sinks = 2, label = "streamingllm"}, "deltanet"]
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """A 2-layer Llama (GQA: 4 query, 2 key/value heads) with random weights and SmolLM2's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    vocabulary = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    config = LlamaConfig(vocab_size=vocabulary, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, folder / name)
    return folder


def grid(tmp_path: Path, text: str = GRID) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def test_a_grid_runs_and_reports(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("generate", str(grid(tmp_path)), "--model", str(tiny_model), "--out", str(out), "--jobs", "1")
    assert result.returncode == 0, result.stderr
    (folder,) = out.iterdir()
    rows = pd.read_csv(folder / "generations.csv")
    # units: passkey x 2 samples, continuation x 2 samples; settings: full, h2o x 2, streamingllm x 2, deltanet
    assert len(rows) == 4 * 6 and (rows.status == "ok").all()
    assert set(rows.method) == {"full", "h2o", "streamingllm", "deltanet"}
    exact = rows[rows.method == "full"]
    assert (exact.cache_share == 1.0).all() and exact[exact.task == "continuation"].ppl_ratio.eq(1.0).all()
    kept = rows[rows.share == 0.25]
    assert kept.cache_share.between(0.2, 0.35).all()  # a quarter of the prompt (and the cache's room)
    assert rows[rows.task == "continuation"].ppl_ratio.notna().all()
    report = (folder / "report.md").read_text()
    assert "Verdict" in report and "beyond the model" in report  # a random model answers nothing
    assert (folder / "plots" / "generation-continuation-vs-kept.png").is_file()
    assert "At N = 160" in result.stdout


def test_a_killed_grid_resumes_to_exactly_its_rows(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnbench.cli", "generate", str(grid(tmp_path)), "--model", str(tiny_model),
               "--out", str(out), "--jobs", "1"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, rows_file = time.monotonic() + 240, None
    while time.monotonic() < deadline:  # kill once the first unit's rows are on disk
        found = list(out.glob("*/generations.csv"))
        if found and len(found[0].read_text().splitlines()) > 1:
            rows_file = found[0]
            break
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert rows_file is not None, "no unit finished in time"
    before = pd.read_csv(rows_file)
    if len(before) == 24:  # the grid ended between two looks (its units take a moment): keep the first unit's rows,
        first = before.iloc[0]  # as a kill there would have left them
        before = before[(before.task == first.task) & (before["sample"] == first["sample"])
                        & (before.protocol == first.protocol)]  # fmt: skip
        before.to_csv(rows_file, index=False)
    assert 0 < len(before) < 24
    result = run_cli("generate", "--resume", str(rows_file.parent), "--jobs", "1")
    assert result.returncode == 0, result.stderr
    assert "done already" in result.stderr and "--model" not in result.stderr  # its model read back from meta.json
    after = pd.read_csv(rows_file)
    assert len(after) == 24 and after.key.is_unique
    kept = after.set_index("key").loc[before.key]
    assert (kept.prompt_tokens.values == before.prompt_tokens.values).all()  # the finished rows were kept, not rerun


def test_bad_input_is_refused_before_any_folder(tmp_path: Path, tiny_model: Path, capsys) -> None:
    from attnbench.cli import main

    out, toml = tmp_path / "out", str(grid(tmp_path))

    def refused(*argv: str) -> str:
        assert main(["generate", *argv, "--out", str(out)]) == 2
        return capsys.readouterr().err

    with pytest.raises(SystemExit) as stopped:  # argparse's refusal (`model_folder`): exit 2
        main(["generate", toml, "--model", str(tmp_path / "nowhere"), "--out", str(out)])
    assert stopped.value.code == 2 and "nowhere does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert "no config.json" in refused(toml, "--model", str(tmp_path / "empty"))
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_model / "config.json", bare / "config.json")
    assert "holds no weights" in refused(toml, "--model", str(bare))
    shutil.copy(tiny_model / "model.safetensors", bare / "model.safetensors")
    assert "no tokenizer" in refused(toml, "--model", str(bare))
    assert "N=600: beyond the model's 512 positions" in refused(toml, "--model", str(tiny_model), "--seq-lens", "600")
    dense = grid(tmp_path, GRID.replace('"deltanet"', '{name = "full-math", prefill = "dense"}'))
    err = refused(str(dense), "--model", str(tiny_model))
    assert "has no decode form" in err and "tiny.toml" in err
    err = refused(toml, "--model", str(tiny_model), "--tasks", "paskey")
    assert "--tasks" in err and "Did you mean: passkey" in err
    assert not out.exists()


def test_the_grid_runs_as_ray_tasks(tmp_path: Path, tiny_model: Path) -> None:
    """--executor ray: each unit a Ray task on a local runtime started for the grid, its rows naming their node."""
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'attnbench[ray]')")
    small = GRID.replace('["passkey", "continuation"]', '["passkey"]').replace("block = 1", "block = 2")
    out = tmp_path / "out"
    result = run_cli("generate", str(grid(tmp_path, small)), "--model", str(tiny_model), "--out", str(out),
                     "--executor", "ray", timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (folder,) = out.iterdir()
    rows = pd.read_csv(folder / "generations.csv")
    assert len(rows) == 2 * 6 and (rows.status == "ok").all() and rows.node.notna().all()
    assert json.loads((folder / "meta.json").read_text())["executor"] == "ray"


def test_the_memory_guard_refuses_an_n_that_would_not_fit(tmp_path: Path, tiny_model: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The estimate (weights, the exact prompt's q/k/v, each method's cache) grows with N and the methods, and a grid
    whose largest N would exceed 80% of the memory available is refused before any work, naming N."""
    import attnbench.measure.machine
    from attnbench.generation.grid import read_grid
    from attnbench.generation.preflight import PreflightError, check, estimated_bytes, model_limits

    config = model_limits(tiny_model)
    assert estimated_bytes(config, 512, 6) > estimated_bytes(config, 256, 6) > estimated_bytes(config, 256, 2)
    tiny = read_grid(str(grid(tmp_path)))
    check(tiny, tiny_model)  # fits
    monkeypatch.setattr(attnbench.measure.machine, "available_memory_bytes", lambda device: 10 * 2**20)
    with pytest.raises(PreflightError, match="N=160 with 6 method settings would hold"):
        check(tiny, tiny_model)


def test_a_generation_claim_runs_its_grid_once_and_says_when_it_cannot(tmp_path: Path, tiny_model: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`reproduce` on a claim judged by generation: its grid runs into OUT/<claim>, a finished one is checked again
    without running; without the model the claim cannot run here, and says which command gets it."""
    import dataclasses

    import attnbench.generation.preflight
    from attnbench.reproduce.claims import CLAIMS
    from attnbench.reproduce.command import run_claim

    quest = next(c for c in CLAIMS if c.id == "quest-passkey")
    small = dataclasses.replace(quest, generation={**quest.generation, "seq_lens": [160], "samples": 2})
    monkeypatch.setattr(attnbench.generation.preflight, "DEFAULT_MODEL", tmp_path / "absent")
    missing = run_claim(small, tmp_path / "out", quick=False, progress=False)
    assert missing.outcome.verdict == "cannot run here" and "make model" in missing.outcome.detail
    monkeypatch.setattr(attnbench.generation.preflight, "DEFAULT_MODEL", tiny_model)
    first = run_claim(small, tmp_path / "out", quick=False, progress=False)
    rows = pd.read_csv(first.folder / "generations.csv")
    assert len(rows) == 2 * (1 + 3 * 2) and (rows.status == "ok").all()  # full, quest, h2o, streamingllm at 2 shares
    assert first.outcome.verdict in ("does not hold", "holds in trend, not in size", "holds")
    stamp = (first.folder / "generations.csv").stat().st_mtime_ns
    again = run_claim(small, tmp_path / "out", quick=False, progress=False)
    assert again.outcome == first.outcome and (first.folder / "generations.csv").stat().st_mtime_ns == stamp
