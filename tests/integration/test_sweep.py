"""The sweep writes one row per cell whatever happens in it, and a killed run keeps every finished row."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from attnbench.interface import AttentionVariant, Capabilities, Hyperparameter
from attnbench.plan.config import parse_config
from attnbench.report.summary import write_summary
from attnbench.run.sweep import run_plan as run_sweep
from attnbench.runfolder.results import read_results
from attnbench.runfolder.rows import COLUMNS


class Base(AttentionVariant):
    family = "test"
    exact = False


class Raises(Base):
    name = "raises"

    def forward(self, q, k, v, *, causal, key_padding_mask):
        raise RuntimeError("something broke inside")


class RunsOutOfMemory(Base):
    name = "runs-oom"

    def forward(self, q, k, v, *, causal, key_padding_mask):
        if q.shape[-2] >= 64:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")
        return v.clone()


class GivesNaN(Base):
    name = "gives-nan"

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return torch.full_like(v, float("nan"))


class Slow(Base):
    name = "slow"
    hyperparameters = {"delay": Hyperparameter(0.03, "seconds per call", kind=float, minimum=0.0)}

    def forward(self, q, k, v, *, causal, key_padding_mask):
        time.sleep(self.delay)
        return v.clone()


class CudaOnly(Base):
    name = "cuda-only"
    supports = Capabilities(devices=("cuda",))

    def forward(self, q, k, v, *, causal, key_padding_mask):
        return v.clone()


def test_every_failure_is_a_row_and_the_sweep_goes_on(toy_registry, tmp_path: Path) -> None:
    registry = toy_registry(Raises, RunsOutOfMemory, GivesNaN, Slow, CudaOnly)
    raw = {
        "variants": ["full", "raises", "runs-oom", "gives-nan", "slow", "cuda-only"],
        "seq_lens": [32, 64, 128],
        "heads": 2,
        "head_dim": 16,
        "min_run_time": 0.01,
        "time_budget_s": 0.02,
    }
    config = parse_config(raw, registry=registry)
    assert config.notes == ["cuda-only runs on cuda only: left out of this run on cpu (`attnbench list` shows each "
                            "variant's devices)"]  # not three `unsupported` rows (attnbench.plan.devices)
    run_dir = run_sweep(config, tmp_path, registry=registry, progress=False)
    frame = read_results(run_dir)
    assert len(frame) == 15 and list(frame.columns) == COLUMNS
    status = {(row.variant, row.seq_len): (row.status, row.reason) for row in frame.itertuples()}

    assert all(status[("full", n)][0] == "ok" for n in (32, 64, 128))
    assert status[("raises", 32)] == ("error", "RuntimeError: something broke inside")
    assert status[("runs-oom", 32)][0] == "ok"
    assert status[("runs-oom", 64)][0] == "oom"
    assert status[("runs-oom", 128)] == ("skipped", "larger N skipped: out of memory at N=64")
    assert status[("gives-nan", 32)] == ("error", "output has NaN or Inf")
    assert status[("slow", 32)][0] == "ok"
    assert status[("slow", 64)][0] == "skipped" and "over time_budget_s=0.02" in status[("slow", 64)][1]
    assert "cuda-only" not in set(frame.variant)

    ok = frame[frame.status == "ok"]
    assert ok.time_median_s.notna().all() and (ok.time_repeats >= 3).all()
    assert ok.peak_mem_bytes.notna().all() and ok.err_vs_uniform.notna().all()
    full = frame[frame.variant == "full"]
    assert (full.err_vs_uniform < 1e-5).all() and full.self_check.str.startswith("pass").all()
    assert "### device=cpu" in write_summary(run_dir)


def test_fwd_bwd_and_padding_cells(tmp_path: Path) -> None:
    config = parse_config(
        {
            "variants": ["full", "full-math"],
            "seq_lens": [48],
            "heads": 2,
            "head_dim": 16,
            "mode": ["fwd", "fwd+bwd"],
            "causal": [False, True],
            "padding": 0.25,
            "min_run_time": 0.01,
        }
    )
    frame = read_results(run_sweep(config, tmp_path, progress=False))
    assert (frame.status == "ok").all(), frame[["label", "status", "reason"]]
    backward = frame[frame["mode"] == "fwd+bwd"].set_index(["variant", "causal"]).peak_mem_bytes
    forward = frame[frame["mode"] == "fwd"].set_index(["variant", "causal"]).peak_mem_bytes
    assert (backward > forward).all()  # gradients and saved tensors are counted


def test_meta_json_records_the_machine_and_config(tmp_path: Path) -> None:
    import json

    config = parse_config({"variants": ["full"], "seq_lens": [16], "heads": 1, "head_dim": 8, "min_run_time": 0.01})
    meta = json.loads((run_sweep(config, tmp_path, progress=False) / "meta.json").read_text())
    assert meta["machine"]["versions"]["torch"] and meta["machine"]["torch_threads"] >= 1
    assert meta["peaks"]["cpu/float32"]["matmul_flops_per_s"] > 1e8
    assert meta["config"]["seq_lens"] == [16] and meta["status_counts"] == {"ok": 1}
