"""pytest-benchmark settings for this suite: warm-up always on, and the machine facts that move its numbers."""

from __future__ import annotations

import torch


def pytest_configure(config) -> None:
    if hasattr(config.option, "benchmark_warmup"):  # lazy set-up and caches land in the warm-up, not the timing
        config.option.benchmark_warmup = True
        config.option.benchmark_warmup_iterations = min(config.option.benchmark_warmup_iterations, 3)


def pytest_benchmark_update_machine_info(config, machine_info: dict) -> None:
    from attnbench.measure.machine import cpu_model, versions

    machine_info["torch"] = torch.__version__
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["cpu_model"] = cpu_model()
    machine_info["attnbench"] = versions().get("attnbench")
