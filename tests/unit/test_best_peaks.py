"""A run's peaks are the highest of its measurements (start, between groups, end), each figure its own highest: a
bandwidth must never fall back to a lower measurement because another one had the higher matmul peak."""

from __future__ import annotations

from attnbench.runfolder.meta import best_peaks


def test_each_rate_keeps_its_own_highest_measurement() -> None:
    start = {"cpu/float32": {"matmul_flops_per_s": 1.0, "read_bytes_per_s": 10.0, "copy_bytes_per_s": 10.0,
                             "write_bytes_per_s": 3.0, "trials": 5}}  # fmt: skip
    end = {"cpu/float32": {"matmul_flops_per_s": 2.0, "read_bytes_per_s": 5.0, "copy_bytes_per_s": 12.0, "trials": 2}}
    best = best_peaks(start, end)["cpu/float32"]
    assert best["matmul_flops_per_s"] == 2.0 and best["trials"] == 2  # the matmul measurement's own fields
    assert best["read_bytes_per_s"] == 10.0 and best["copy_bytes_per_s"] == 12.0 and best["write_bytes_per_s"] == 3.0
    assert best_peaks(end, start)["cpu/float32"]["read_bytes_per_s"] == 10.0  # in either order


def test_a_device_measured_once_or_failed_is_kept_as_measured() -> None:
    failed = {"cuda/float32": {"error": "RuntimeError: no CUDA"}}
    assert best_peaks(failed, {})["cuda/float32"] == {"error": "RuntimeError: no CUDA"}
