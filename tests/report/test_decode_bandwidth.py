"""Each decode row states the read bandwidth its step achieved (bytes a step reads / its median time) and that as a
share of the machine's measured read bandwidth: in the view's columns, the summary's decode table and the report's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from attnbench.report.analysis import read_bandwidth, step_bytes
from attnbench.report.modes import read_rate_text

PEAKS = {"cpu/float32": {"read_bytes_per_s": 20e9, "copy_bytes_per_s": 30e9}}


def decode_row(**more) -> dict:
    row = dict(mode="decode", status="ok", device="cpu", dtype="float32", batch=1, heads=8, head_dim=64,
               bytes_moved=8_400_896, time_median_s=0.42e-3)  # fmt: skip
    return {**row, **more}


def test_a_step_s_read_rate_is_its_reads_over_its_median_and_its_share_of_the_stream() -> None:
    others = [decode_row(mode="fwd"), decode_row(status="error"), decode_row(bytes_moved=None)]
    frame = pd.DataFrame([decode_row(), *others])
    rates = read_bandwidth(frame, PEAKS)
    reads, written = step_bytes(frame.iloc[0])
    assert written == 3 * 4 * 8 * 64 and reads + written == 8_400_896  # the output and the token's k and v
    assert rates.step_read_bytes_per_s[0] == pytest.approx(reads / 0.42e-3)
    assert rates.read_share[0] == pytest.approx(reads / 0.42e-3 / 20e9)
    assert rates.iloc[1:].isna().all().all()  # not a step, not ok, nothing counted
    old_run = read_bandwidth(frame.iloc[:1], {"cpu/float32": {"copy_bytes_per_s": 40e9}})
    assert old_run.read_share[0] == pytest.approx(reads / 0.42e-3 / 40e9)  # no read stream measured: the copy peak
    assert read_rate_text(reads / 0.42e-3, rates.read_share[0]) == "20.0 (100%)"
    assert read_rate_text(1.3e8, 0.0065) == "0.130 (0.65%)" and read_rate_text(float("nan"), 0.1) == "–"


def test_the_decode_tables_show_each_step_s_read_bandwidth(tmp_path: Path, monkeypatch) -> None:
    from attnbench.measure import machine
    from attnbench.plan.config import parse_config
    from attnbench.run import sweep
    from attnbench.report.document import render_html, render_markdown
    from attnbench.report.run_report import detail_blocks
    from attnbench.report.summary import summary_tables
    from attnbench.report.view import RunView
    from helpers import tiny

    config = tiny(mode="decode", causal=True, variants=["full", {"name": "band", "window": 4}], decode_steps=4)
    given = {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 3e10, "read_bytes_per_s": 2e10, "write_bytes_per_s": 2e10}
    monkeypatch.setattr(machine, "_known_peaks", {})  # the given peaks stay in this test
    monkeypatch.setattr(sweep, "_measure_peaks", lambda config, **_: {"cpu/float32": given, "cpu/float64": given})
    view = RunView.read(sweep.run_plan(parse_config(config), tmp_path, progress=False))
    frame = view.frame
    assert frame.step_read_bytes_per_s.gt(0).all() and frame.read_share.gt(0).all()
    peak = view.peaks["cpu/float32"]["read_bytes_per_s"]
    assert peak == 2e10
    assert (frame.step_read_bytes_per_s / frame.read_share).round().eq(round(peak)).all()
    summary = summary_tables(frame)
    assert "| read GB/s (of peak) |" in summary
    full = frame[frame.label == "full"].iloc[0]
    assert read_rate_text(full.step_read_bytes_per_s, full.read_share) in summary
    blocks = detail_blocks(frame, "decode", view.peaks, view.samples)
    [table] = [b for b in blocks if b.kind == "table" and b.caption.startswith("Read bandwidth a step achieved")]
    assert f"{peak / 1e9:.1f} GB/s, one read stream" in table.caption
    assert table.rows[0][1] == read_rate_text(full.step_read_bytes_per_s, full.read_share)
    for rendered in (render_markdown(blocks), render_html(blocks, tmp_path)):
        assert "Read bandwidth a step achieved" in rendered and table.rows[0][1].split(" (")[0] in rendered
