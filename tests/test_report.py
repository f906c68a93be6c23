"""Reports and comparisons built from small synthetic runs (failed and skipped cells included)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attnbench.analysis import crossover
from attnbench.cli import main
from attnbench.compare import compare_runs, verdict
from attnbench.config import parse_config
from attnbench.report import write_report
from attnbench.results import ResultsWriter, Row

# time = a * N^slope, memory = m * N^slope; full quadratic, band linear but slower at small N
CURVES = {"full": (1e-8, 2.0, 100.0, 1.0), "band": (1e-5, 1.0, 50.0, 1.0), "strided": (1e-6, 1.5, 400.0, 1.0)}


def synthetic_run(folder: Path, scale: dict[str, float] | None = None, iqr: float = 0.01, cpu: str = "cpu A") -> Path:
    """A run folder written through the real writer: three variants, four N, one error and one skipped cell."""
    folder.mkdir(parents=True)
    config = parse_config({"variants": list(CURVES), "seq_lens": [256, 512, 1024, 2048]})
    with ResultsWriter(folder / "results.csv") as writer:
        for cell in config.cells():
            name, n = cell.variant.name, cell.seq_len
            row = Row.for_cell(cell, family=name, exact=True)
            if name == "strided" and n == 2048:
                row.status, row.reason = "skipped", "larger N skipped: over time_budget_s"
            elif name == "band" and n == 256:
                row.status, row.reason = "error", "RuntimeError: constructed failure"
            else:
                a, slope, m, memory_slope = CURVES[name]
                row.time_median_s = a * n**slope * (scale or {}).get(name, 1.0)
                row.time_iqr_s = iqr * row.time_median_s
                row.time_repeats = 5
                row.peak_mem_bytes = int(m * n**memory_slope)
                row.err_vs_uniform, row.err_rel_fro, row.err_row_cosine, row.err_max_abs = 0.1, 0.2, 0.9, 0.5
                row.flops = 4 * n * n * 64
            writer.append(row)
    meta = {
        "config": {"name": "synthetic"},
        "machine": {"cpu": cpu, "versions": {"torch": "2.13.0"}},
        "peaks": {"cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10}},
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def test_report_has_every_table_and_plot(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path / "run")
    text = write_report(run).read_text()
    for expected in [
        "Time per call",
        "Speedup against `full`",
        "Peak memory",
        "Error against exact",
        "Achieved FLOP/s",
        "log-log slopes",
        "Crossover",
        "constructed failure",
        "over time_budget_s",
    ]:
        assert expected in text, expected
    plots = sorted(p.name for p in (run / "plots").iterdir())
    assert len(plots) == 3 + 4  # time, memory, error, and a Pareto chart per N
    assert all((run / "plots" / name).stat().st_size > 10_000 for name in plots)
    page = (run / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(plots) and "src='plots/" not in page


def test_report_slopes_and_crossovers_recover_the_constructed_curves(tmp_path: Path) -> None:
    text = write_report(synthetic_run(tmp_path / "run")).read_text()
    assert "| full | 256–2048 | 2.00 | 1.00 |" in text
    assert "| band | 512–2048 | 1.00 | 1.00 |" in text  # the failed N=256 cell is left out of the fit
    assert "| strided | 256–1024 | 1.50 | 1.00 |" in text
    # band: 1e-5 N vs 1e-8 N^2 -> equal at N = 1000; memory 50 N vs 100 N: smaller everywhere
    assert "| band | N ≈ 1,000 (between 512 and 1024) | already at N=512 (smallest swept) |" in text


def test_report_of_a_run_written_before_newer_columns(tmp_path: Path) -> None:
    import pandas as pd

    run = synthetic_run(tmp_path / "run")
    old = pd.read_csv(run / "results.csv").drop(columns=["input_entropy", "input_band_mass", "dropped_mass"])
    old.to_csv(run / "results.csv", index=False)
    assert "Time per call" in write_report(run).read_text()


def test_crossover_interpolates_in_log_log() -> None:
    assert crossover([100, 400], [2.0, 0.5])[0] == pytest.approx(200)
    assert crossover([100, 400], [2.0, 1.5]) == (None, "not within the swept range (N ≤ 400)")
    assert crossover([100, 400], [0.5, 0.2])[0] == 100
    assert crossover([], [])[0] is None


def test_compare_flags_a_regression_and_ignores_noise(tmp_path: Path) -> None:
    base = synthetic_run(tmp_path / "a")
    regressed = synthetic_run(tmp_path / "b", scale={"band": 1.5, "strided": 1.02})
    result = compare_runs(base, regressed)
    verdicts = result.table.groupby("label").verdict.unique()
    assert list(verdicts["band"]) == ["slower"]
    assert list(verdicts["strided"]) == ["same (within noise)"]  # 2% is under the 3% floor and the IQR
    assert list(verdicts["full"]) == ["same (within noise)"]
    assert result.only_in_a == result.only_in_b == 0 and result.machine_notes == []
    assert main(["compare", str(base), str(regressed), "--fail-above", "40"]) == 1
    assert main(["compare", str(base), str(regressed), "--fail-above", "60"]) == 0


def test_noisy_runs_do_not_call_a_change_and_other_machines_are_named(tmp_path: Path, capsys) -> None:
    assert verdict(1.0, 0.3, 1.2, 0.3) == "same (within noise)"
    assert verdict(1.0, 0.01, 0.8, 0.01) == "faster"
    a = synthetic_run(tmp_path / "a")
    b = synthetic_run(tmp_path / "b", cpu="cpu B")
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "different machines" in out and "cpu: cpu A vs cpu B" in out


def test_report_command_refuses_a_folder_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err
