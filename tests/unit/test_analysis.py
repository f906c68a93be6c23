"""Scaling fits against constructed data with known answers."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from attnbench.report.analysis import loglog_slope, scaling_table


def test_slope_of_power_laws() -> None:
    n = [1024, 2048, 4096, 8192]
    assert loglog_slope(n, [3 * x**2 for x in n]) == pytest.approx(2.0)
    assert loglog_slope(n, [0.5 * x for x in n]) == pytest.approx(1.0)
    assert loglog_slope(n, [x * math.log(x) for x in n]) == pytest.approx(1.13, abs=0.02)
    assert math.isnan(loglog_slope([1024], [1.0]))
    assert loglog_slope(n, [1.0, float("nan"), 4.0, 8.0]) == pytest.approx(1.0)


def test_scaling_table_uses_only_ok_cells() -> None:
    frame = pd.DataFrame(
        {
            "label": ["a"] * 4 + ["b"] * 2,
            "status": ["ok", "ok", "ok", "oom", "ok", "error"],
            "seq_len": [100, 200, 400, 800, 100, 200],
            "time_median_s": [1.0, 2.0, 4.0, float("nan"), 1.0, float("nan")],
            "peak_mem_bytes": [10, 40, 160, float("nan"), 5, float("nan")],
        }
    )
    table = scaling_table(frame).set_index("label")
    assert table.loc["a", "time_slope"] == pytest.approx(1.0)
    assert table.loc["a", "memory_slope"] == pytest.approx(2.0)
    assert table.loc["a", "n_range"] == "100–400" and table.loc["b", "points"] == 1


def test_of_roofline_takes_the_slower_of_compute_and_memory() -> None:
    """1 at the limit: a compute-bound cell at the matmul peak, a memory-bound one at the copy peak; twice as slow
    reads 0.5; a missing figure or a failed cell reads NaN."""
    from attnbench.report.analysis import of_roofline

    peaks = {"cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10}}
    cells = pd.DataFrame(
        {
            "device": ["cpu"] * 4,
            "dtype": ["float32"] * 4,
            "mode": ["fwd"] * 4,
            "status": ["ok", "ok", "ok", "error"],
            "flops": [1e11, 1e9, float("nan"), 1e11],  # 1 s of matmul; 0.01 s; unknown
            "bytes_moved": [1e8, 1e10, 1e8, 1e8],  # 0.01 s of copying; 1 s
            "time_median_s": [1.0, 2.0, 1.0, 1.0],
        }
    )
    shares = of_roofline(cells, peaks).tolist()
    assert shares[:2] == [1.0, 0.5] and all(r != r for r in shares[2:])
    assert of_roofline(cells, {}).isna().all()
    # a forward and backward call does three forward calls' work (mode_work), as the guard's estimate assumes
    backward = cells.assign(mode="fwd+bwd", time_median_s=[3.0, 6.0, 1.0, 1.0])
    assert of_roofline(backward, peaks).tolist()[:2] == [1.0, 0.5]  # no peaks measured: nothing to compare with


def test_a_cell_slower_than_at_a_longer_n_is_called_implausible(tmp_path) -> None:
    """Issue 39, item 4: after a resume under load one group (N=4096) was timed 3-6x slower than at N=8192 and the
    verdict concluded from it. The noise sentence now names such a pair; a plain rising series is not named."""
    import pandas as pd
    from attnbench.report.analysis import implausible_timings
    from attnbench.report.summary import noise_line

    def rows(times: dict[int, float]) -> pd.DataFrame:
        return pd.DataFrame([
            {"status": "ok", "label": "band(window=256)", "device": "cpu", "dtype": "float32", "mode": "fwd",
             "causal": False, "seed": 0, "padding": 0.0, "batch": 1, "heads": 8, "head_dim": 64, "value_dim": 0,
             "kv_len": 0, "compiled": False, "seq_len": n, "noisy": "", "time_median_s": t,
             "time_p10_s": 0.95 * t, "time_p90_s": 1.05 * t}
            for n, t in times.items()
        ])  # fmt: skip

    odd = rows({2048: 0.010, 4096: 0.090, 8192: 0.040})
    assert [f.phrase for f in implausible_timings(odd)] == [
        "band(window=256) at N=4096 (90 ms) 9× its time at N=2048 (10 ms), beyond quadratic growth",
        "band(window=256) at N=4096 (90 ms) slower than at N=8192 (40 ms)",
    ]
    assert "Implausible: band(window=256) at N=4096" in noise_line(odd)
    assert implausible_timings(rows({2048: 0.010, 4096: 0.020, 8192: 0.040})) == []
    assert implausible_timings(rows({2048: 0.0100, 4096: 0.0098})) == []  # within the spreads: not named
    assert implausible_timings(rows({1024: 0.001, 2048: 0.0055})) == []  # quadratic and a little more: not named
