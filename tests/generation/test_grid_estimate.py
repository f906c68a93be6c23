"""`generate --dry-run`'s estimate: each sample's forward passes counted as the decoder makes them (the exact prompt
once, each row's question, answer and continuation), units shared out over the workers, and the estimate printed
through the CLI on a tiny model made here (`offline_model`, conftest.py: no downloaded model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.generation.grid import parse_grid
from attnbench.generation.run import ModelFlops, finish_time, sample_flops
from attnbench.generation.tasks import Sample
from helpers import run_cli

SMOLLM2 = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
           "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152}  # fmt: skip
GRID = """name = "tiny"
tasks = ["passkey", "continuation"]
seq_lens = [512]
samples = 2
block = 1
keep = [0.5]
continuation_tokens = 8
methods = ["h2o"]
"""


def test_smollm2_s_prompt_costs_what_its_weights_and_attention_do() -> None:
    """135M parameters, 28M of them the tied embedding: ~0.21 GFLOP a token through the rest, plus attention."""
    flops = ModelFlops.of(SMOLLM2)
    assert flops.per_token == pytest.approx(2 * 30 * 3_538_944)  # q, k, v, o and the MLP of 30 layers, 2 FLOPs a MAC
    assert flops.prompt(2048) == pytest.approx(2048 * flops.per_token + 4 * 30 * 9 * 64 * 2048**2 / 2
                                               + 2 * 576 * 49152)  # fmt: skip
    assert 5.5e11 < flops.prompt(2048) < 6.5e11  # ~6 s on one thread at the ~95 GFLOP/s measured here


def test_a_sample_s_passes_follow_the_decoder() -> None:
    flops = ModelFlops.of(SMOLLM2)
    grid = parse_grid({"name": "g", "tasks": ["passkey"], "seq_lens": [2048], "methods": ["h2o", "deltanet"],
                       "keep": [0.5, 0.25]})  # fmt: skip
    settings = grid.settings(2048)  # full, h2o at two shares, deltanet with its own prefill
    needle = Sample("passkey", 0, list(range(2000)), list(range(10)), answers=("12345",), answer_tokens=8)
    low, high = sample_flops(flops, needle, settings, aware=False)
    rows = [2000 * (s.share or 1.0) + 10 for s in settings]
    assert high - low == pytest.approx(7 * sum(flops.appended(1, c, 1) for c in rows))  # 7 passes after the first token
    prompts = 2 * flops.prompt(2000) + flops.per_pair * 2000**2 / 2  # the exact one, deltanet's own, H2O's masses
    assert low == pytest.approx(prompts + sum(flops.appended(10, c - 10, 1) for c in rows))
    text = Sample("continuation", 0, list(range(2000)), [], continuation=tuple(range(64)))
    low, high = sample_flops(flops, text, settings, aware=False)
    assert low == high  # nothing greedy: 63 tokens teacher-forced in one pass a row
    assert low == pytest.approx(prompts + sum(flops.appended(63, c - 10, 63) for c in rows))


def test_units_go_to_whichever_worker_is_free_first() -> None:
    assert finish_time([3.0, 1.0, 1.0, 1.0], workers=2, start_s=0.5) == 3.5  # the long one alone, the rest beside it
    assert finish_time([1.0] * 4, workers=2, start_s=0.0) == 2.0
    assert finish_time([1.0], workers=4, start_s=0.5) == 1.5  # a worker with no unit loads nothing


def test_a_dry_run_prints_the_grid_s_estimated_time(tmp_path: Path, offline_model: Path) -> None:
    grid = tmp_path / "tiny.toml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    result = run_cli("generate", str(grid), "--model", str(offline_model), "--dry-run", "--out", str(out))
    assert result.returncode == 0, result.stderr
    said = " ".join(result.stdout.split())
    assert "total: 4 units" in said
    assert said.split("total: 4 units ")[1].startswith("estimated time: ")
    assert "with 2 workers here (--jobs)" in said and "GFLOP/s on a worker's 1 thread" in said
    assert "not counted: " in said and "Recorded for this grid" not in said  # a file of its own: no recorded time
    assert not out.exists()  # nothing was written


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU fallback is for a machine without CUDA")
def test_a_dry_run_for_a_cluster_s_gpus_times_this_machine_s_cpu(tmp_path: Path, offline_model: Path) -> None:
    """--device cuda with --executor ray --address: the nodes bring the GPUs, so a CPU-only machine times its own CPU
    for the estimate, says so, and the dry run exits 0 (it once died with "Torch not compiled with CUDA enabled")."""
    grid = tmp_path / "tiny.toml"
    grid.write_text(GRID)
    result = run_cli("generate", str(grid), "--model", str(offline_model), "--dry-run", "--device", "cuda",
                     "--executor", "ray", "--address", "127.0.0.1:1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "estimated time: " in " ".join(result.stdout.split())
    said = " ".join(result.stderr.split())
    assert "cuda is not available here" in said and "the estimate below is of this machine's CPU" in said
    assert "Traceback" not in result.stderr


def test_the_estimate_times_the_placement_where_its_device_is_here() -> None:
    from attnbench.generation.placement import Placement
    from attnbench.generation.run import timing_placement

    assert timing_placement(Placement("cpu", "bfloat16")) == (Placement("cpu", "bfloat16"), None)
    cuda = Placement("cuda", "bfloat16")
    timed_on, why = timing_placement(cuda)
    if __import__("torch").cuda.is_available():
        assert (timed_on, why) == (cuda, None)
    else:
        assert timed_on == Placement("cpu", "bfloat16") and "this machine's CPU" in why
