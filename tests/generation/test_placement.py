"""Where a generation runs (`attnbench.generation.placement`): `generate --device cuda` refused where torch sees no
GPU, before any folder; a method that cannot run at the device or dtype named; bfloat16 generating on the CPU through
the whole in-model path (the same model as float32's, up to rounding, its caches half the bytes); the units, a Ray
task's resources and meta.json carrying the placement; a resumed grid keeping its dtype. On a GPU, the same grid on
CUDA."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench.commands.generate import _placement
from attnbench.generation.grid import parse_grid, read_grid
from attnbench.generation.placement import Placement, placement_problems
from attnbench.generation.run import outcomes, run_grid
from attnbench.generation.unit import UnitJob, loaded
from attnbench.variants.press_attention import SnapKV
from helpers import run_cli

GRID = {"name": "tiny", "tasks": ["passkey", "continuation"], "seq_lens": [512], "samples": 1, "block": 1,
        "keep": [0.5], "continuation_tokens": 8, "answer_tokens": 8,
        "methods": ["snapkv", "h2o", "streamingllm", "quest", "kvzip", "deltanet",
                    {"name": "snapkv", "quantize": "kivi-4", "label": "snapkv + kivi-4"}]}  # fmt: skip
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def grid():
    return parse_grid(dict(GRID), "tiny grid")


def test_a_placement_is_one_of_the_devices_and_dtypes() -> None:
    placed = Placement()
    assert (placed.device, placed.dtype, placed.torch_dtype, str(placed)) == ("cpu", "float32", torch.float32,
                                                                              "cpu, float32")  # fmt: skip
    ids = Placement("cpu", "bfloat16").tokens([3, 1, 2])
    assert ids.dtype == torch.long and ids.device.type == "cpu" and ids.tolist() == [3, 1, 2]  # ids stay ids
    for device, dtype in (("tpu", "float32"), ("cpu", "float16")):
        with pytest.raises(ValueError, match="must be one of"):
            Placement(device, dtype)


def test_cuda_without_a_gpu_is_refused_before_any_folder(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one
    out = tmp_path / "results"
    (tmp_path / "no-model").mkdir()  # a folder without a model: --model takes it, the preflight would refuse it
    done = run_cli("generate", "--tasks", "passkey", "--seq-lens", "256", "--samples", "1", "--device", "cuda",
                   "--model", str(tmp_path / "no-model"), "--out", str(out), env=env)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--device cuda: CUDA is not available to torch" in done.stderr and "--device cpu" in done.stderr
    assert "no config.json" not in done.stderr  # refused before the model is even looked at
    assert not out.exists()


def test_the_problems_name_cuda_and_a_method_that_refuses_the_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    shipped = read_grid("generation")
    (problem,) = placement_problems(shipped, Placement("cuda", "bfloat16"))
    assert problem.startswith("--device cuda: CUDA is not available")
    assert placement_problems(shipped, Placement("cuda", "bfloat16"), here=False) == []  # a Ray cluster's GPUs
    assert placement_problems(shipped, Placement("cpu", "bfloat16")) == []
    monkeypatch.setattr(SnapKV, "supports", replace(SnapKV.supports, dtypes=("float32",)))
    (problem,) = placement_problems(shipped, Placement("cpu", "bfloat16"))
    assert problem.startswith("snapkv cannot generate inside the model on cpu, bfloat16: ") and "dtype" in problem


def rows_at(folder: Path, offline_model: Path, placement: Placement) -> pd.DataFrame:
    """The tiny grid run at the placement into `folder`: its rows, ordered by key (meta.json checked)."""
    meta = run_grid(grid(), folder, offline_model, placement=placement, say=lambda text: None)
    assert (meta["device"], meta["dtype"]) == (placement.device, placement.dtype)
    assert json.loads((folder / "meta.json").read_text())["dtype"] == placement.dtype
    return pd.read_csv(folder / "generations.csv").sort_values("key").reset_index(drop=True)


def test_bfloat16_on_the_cpu_runs_every_method_as_float32_does(tmp_path: Path, offline_model: Path) -> None:
    exact, half = (rows_at(tmp_path / dtype, offline_model, Placement("cpu", dtype)) for dtype in ("float32",
                                                                                                   "bfloat16"))  # fmt: skip
    assert len(half) == len(exact) == 2 * 8 and (half.status == "ok").all(), half[half.status != "ok"].reason.tolist()
    assert (half.key == exact.key).all()
    model, _, _ = loaded(str(offline_model), Placement("cpu", "bfloat16"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # moved once loaded, the cache keyed by it
    assert {b.dtype for b in model.model.rotary_emb.buffers()} == {torch.float32}  # its angles not rounded to 8 bits
    # the same model up to rounding: the continuation's loss per token within bfloat16's steps of float32's
    continuation = exact.task == "continuation"
    assert half.answer[~continuation].fillna("").str.len().gt(0).all()  # greedy tokens (a random model's bytes)
    assert (half.nll[continuation] - exact.nll[continuation]).abs().max() < 0.05
    full = (exact.method == "full") & ~continuation
    assert half.cache_bytes[full].item() * 2 == exact.cache_bytes[full].item()  # a bfloat16 key holds 2 bytes


def test_a_unit_job_carries_its_placement_to_a_ray_task(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: dict = {}

    def tasks_on_ray(jobs, task, **options):
        asked.update(options, jobs=jobs)
        return iter(())

    monkeypatch.setattr("attnbench.run.ray_executor.tasks_on_ray", tasks_on_ray)
    tiny = grid()
    jobs = [UnitJob(tiny, unit, "model", 2, Placement(device)) for unit, device in zip(tiny.units(), ("cuda", "cpu"))]
    assert list(outcomes(jobs, "ray", 1, None, say=lambda text: None)) == []
    assert [asked["gpus"](job) for job in jobs] == [1, 0] and [asked["cpus"](job) for job in jobs] == [2, 2]
    assert UnitJob(tiny, tiny.units()[0], "model").placement == Placement()  # cpu, float32 by default


def test_a_resumed_grid_keeps_its_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["attnbench", "generate"], "device": "cpu",
                                                    "dtype": "bfloat16"}))  # fmt: skip
    args = lambda **given: argparse.Namespace(**{"device": None, "dtype": None, "executor": "local",  # noqa: E731
                                                 "address": None, **given})  # fmt: skip
    assert _placement(args(), grid(), tmp_path) == Placement("cpu", "bfloat16")
    assert _placement(args(dtype="bfloat16"), grid(), tmp_path) == Placement("cpu", "bfloat16")
    refused = _placement(args(dtype="float32"), grid(), tmp_path)
    assert isinstance(refused, str) and "generated in bfloat16" in refused and "start a new grid" in refused
    (tmp_path / "meta.json").write_text(json.dumps({"command": ["attnbench", "generate"]}))  # from before --dtype
    assert _placement(args(), grid(), tmp_path) == Placement() and isinstance(_placement(args(dtype="bfloat16"),
                                                                                         grid(), tmp_path), str)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in _placement(args(device="cuda"), grid(), None)
    assert _placement(args(device="cuda", executor="ray", address="10.0.0.1:6379"), grid(), None) == Placement("cuda")


@CUDA
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_on_cuda_the_grid_runs_as_on_the_cpu(tmp_path: Path, offline_model: Path, dtype: str) -> None:
    on_cpu = rows_at(tmp_path / "cpu", offline_model, Placement("cpu", "float32"))
    on_gpu = rows_at(tmp_path / "cuda", offline_model, Placement("cuda", dtype))
    assert (on_gpu.status == "ok").all(), on_gpu[on_gpu.status != "ok"].reason.tolist()
    continuation = on_cpu.task == "continuation"
    assert (on_gpu.nll[continuation] - on_cpu.nll[continuation]).abs().max() < (0.05 if dtype == "bfloat16" else 1e-3)
    assert on_gpu.attention_s.notna().any()  # the step timing ran on the GPU's states
