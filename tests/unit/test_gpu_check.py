"""`make gpu-check` (tests/gpu_check.py) on a machine without a GPU: it refuses before any work (--preflight too), its
sweep's config validates to the intended cells, its generate steps find their model (or skip), and its table says
what passed, failed or was not run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gpu_check
import pytest
from attnbench.conformance import CheckResult
from attnbench.generation.grid import read_grid as load_generation_grid
from attnbench.plan.config import load_config
from attnbench.registry import registry
from gpu_check import (
    GENERATE_LEN,
    Generation,
    Step,
    check_step,
    exit_status,
    generate_name,
    generate_step,
    generation_row,
    sweep_step,
    table,
    variant_settings,
    within_budget,
)
from helpers import TESTS

DECODING = {"full", "band(sinks=4, window=256)", "topk", "h2o", "snapkv", "linear", "gla"}
FULL_SEQUENCE = {"full", "full-xformers", "band(sinks=4, window=256)", "band(backend=flex, sinks=4, window=256)",
                 "topk", "linear", "gla"}  # fmt: skip


@pytest.mark.parametrize("preflight", [[], ["--preflight"]], ids=["run", "preflight"])
def test_without_cuda_it_refuses_in_one_line_and_writes_nothing(tmp_path: Path, preflight: list[str]) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine that has one
    done = subprocess.run([sys.executable, str(TESTS / "gpu_check.py"), "--out", str(tmp_path / "results"), *preflight],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("gpu-check: CUDA is not available to torch") and done.stderr.count("\n") == 1
    assert "nothing was run or written" in done.stderr
    assert not (tmp_path / "results").exists()


def test_its_sweep_plans_each_mode_of_the_intended_variants_on_cuda() -> None:
    config = load_config("gpu-check", cluster=True)  # as `attnbench run` parses it; cluster: no CUDA needed here
    cells = config.plan().cells
    assert {(c.device, c.dtype, c.causal) for c in cells} == {("cuda", "bfloat16", True)}
    by_mode = {mode: {c.label() for c in cells if c.mode == mode} for mode in ("fwd", "fwd+bwd", "decode")}
    assert by_mode == {"fwd": FULL_SEQUENCE, "fwd+bwd": FULL_SEQUENCE, "decode": DECODING}
    assert {c.seq_len for c in cells if c.mode == "decode"} == {4096}
    assert {c.seq_len for c in cells if c.mode != "decode"} == {2048, 8192}
    assert {c.input.name for c in cells} == {"realistic", "needles"} and config.notes == []
    for cell in cells:  # every cell is one its variant declares it can run: none would be an `unsupported` row
        caps = registry.load(cell.variant.name).supports
        assert "cuda" in caps.devices and cell.dtype in caps.dtypes and caps.causal, cell.label()
        assert caps.backward or cell.mode != "fwd+bwd", cell.label()
        assert registry.load(cell.variant.name).decodes() or cell.mode != "decode", cell.label()


def test_every_registered_variant_is_checked_and_each_other_backend_too() -> None:
    settings = variant_settings(registry)
    assert [name for name, params in settings if not params] == registry.names()
    assert ("band", {"backend": "flex"}) in settings and ("strided", {"backend": "flex"}) in settings
    assert ("full-xformers", {}) in settings and gpu_check.DTYPES == ("bfloat16", "float32")


def test_a_variant_row_fails_on_any_failed_check_and_skips_only_when_all_skipped() -> None:
    passed, skipped = CheckResult("shapes", "pass"), CheckResult("decode", "skip", "no decode")
    failed = CheckResult("gradients", "fail", "NaN in dq")
    assert check_step("check band bfloat16", [passed, skipped], 1.0) == Step(
        "check band bfloat16", "pass", 1.0, "1 passed, 1 skipped")  # fmt: skip
    row = check_step("check lsh float32", [passed, failed, skipped], 2.0)
    assert row.status == "fail" and row.detail == "gradients: NaN in dq"
    assert check_step("check x float32", [skipped], 0.1).status == "skip"


def test_a_step_not_started_within_the_budget_fails_as_not_run() -> None:
    now = [0.0]

    def step(name: str, seconds: float):
        def run(left: float) -> Step:
            now[0] += seconds
            return Step(name, "pass", seconds, f"{left:g} s left")

        return name, run

    steps = list(within_budget([step("a", 5), step("b", 10), step("c", 1)], 12, clock=lambda: now[0]))
    assert [(s.name, s.status, s.detail) for s in steps] == [
        ("a", "pass", "12 s left"),
        ("b", "pass", "7 s left"),
        ("c", "fail", "not run: past the 12 s budget"),
    ]
    assert exit_status(steps) == 1 and exit_status(steps[:2]) == 0
    said = table(steps + [Step("model", "skip", 0.0, "no model folder")])
    assert "| c | fail | 0.0 | not run: past the 12 s budget |" in said
    assert said.endswith("2 passed, 1 failed, 1 skipped; 15 s in the steps")


def test_the_sweep_row_passes_only_when_every_cell_ran_ok_and_the_report_is_there(tmp_path: Path) -> None:
    run = tmp_path / "sweep" / "20261127-000000-gpu-check"
    run.mkdir(parents=True)
    (run / "results.csv").write_text("cell_key,status\na,ok\nb,ok\n")
    log = tmp_path / "sweep.log"
    assert sweep_step(0, tmp_path / "sweep", 3.0, log).status == "fail"  # no report.md yet
    (run / "report.md").write_text("# report\n")
    row = sweep_step(0, tmp_path / "sweep", 3.0, log)
    assert row.status == "pass" and row.detail == f"exit 0: 2 ok -> {run}"
    (run / "results.csv").write_text("cell_key,status\na,ok\nb,unsupported\nc,error\n")
    assert sweep_step(0, tmp_path / "sweep", 3.0, log).detail.startswith("exit 0: 1 error, 1 ok, 1 unsupported")
    assert sweep_step(0, tmp_path / "sweep", 3.0, log).status == "fail"
    assert sweep_step(None, tmp_path / "sweep", 480.0, log).status == "fail"  # past the budget


def model_folder(root: Path, name: str, positions: int) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text(f'{{"max_position_embeddings": {positions}}}')
    return root / name


def test_the_generate_steps_take_gemma_at_32k_else_smollm2_at_its_8k_else_skip(tmp_path: Path) -> None:
    folders = {"Gemma-3-270M": tmp_path / "Gemma-3-270M", "SmolLM2-135M": tmp_path / "SmolLM2-135M"}
    missing = Generation.found(folders)
    assert isinstance(missing, str) and str(folders["Gemma-3-270M"]) in missing and "MODEL=gemma-3-270m" in missing
    skipped = generate_step(missing, "bfloat16", tmp_path, 480.0)
    assert (skipped.name, skipped.status, skipped.seconds) == ("generate bfloat16", "skip", 0.0)
    assert not (tmp_path / "generate-bfloat16").exists()  # nothing run
    model_folder(tmp_path, "SmolLM2-135M", 8192)
    assert Generation.found(folders) == Generation("SmolLM2-135M", folders["SmolLM2-135M"], 8192, "generation-long")
    model_folder(tmp_path, "Gemma-3-270M", 32768)
    found = Generation.found(folders)
    assert found == Generation("Gemma-3-270M", folders["Gemma-3-270M"], GENERATE_LEN, "gemma-long")
    assert generate_name(found, "float32") == "generate gemma-long (Gemma-3-270M, N=32768, float32)"
    assert {load_generation_grid(grid).name for grid in gpu_check.GENERATE_MODELS.values()} == {"gemma-long",
                                                                                                "generation-long"}
    late = generate_step(found, "float32", tmp_path, 100.0, optional=True)  # if time allows: not with 100 s left
    assert late.status == "skip" and late.detail.startswith("not run: 100 s of the budget left")
    assert not (tmp_path / "generate-float32").exists()


def test_a_generate_row_passes_only_when_every_generation_ran_ok(tmp_path: Path) -> None:
    out, log, name = tmp_path / "generate-bfloat16", tmp_path / "generate-bfloat16.log", "generate (g, N=8, bfloat16)"
    assert generation_row(name, None, out, 180.0, log).status == "fail"  # past its time
    assert generation_row(name, 2, out, 3.0, log).detail == f"exit 2, no generations.csv ({log})"  # refused
    run = out / "20261128-000000-generation"
    run.mkdir(parents=True)
    (run / "generations.csv").write_text("method,share,status,score\nfull,,ok,1.0\nsnapkv,0.125,ok,0.0\n")
    row = generation_row(name, 0, out, 40.0, log)
    assert row == Step(name, "pass", 40.0, f"exit 0: full: score 1, snapkv at 0.125: score 0 -> {run}")
    (run / "generations.csv").write_text("method,share,status,score\nfull,,ok,1.0\nsnapkv,0.125,error,\n")
    row = generation_row(name, 1, out, 40.0, log)
    assert row.status == "fail" and "snapkv at 0.125: error" in row.detail


def test_an_optional_step_past_the_budget_is_skipped_not_failed() -> None:
    now = [0.0]

    def step(name: str):
        def run(left: float) -> Step:
            now[0] += 10
            return Step(name, "pass", 10.0)

        return name, run

    steps = list(within_budget([step("a"), step("b"), step("float32")], 5, clock=lambda: now[0],
                               optional=frozenset({"float32"})))  # fmt: skip
    assert [(s.name, s.status) for s in steps] == [("a", "pass"), ("b", "fail"), ("float32", "skip")]
