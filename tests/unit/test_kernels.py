"""attnbench.kernels: when the fused steps run (float32 on the CPU, outside autograd, not under `eager_steps`), what
happens where they cannot be built (every step eager, the reason said), and how generate names the form it timed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from attnbench.generation.placement import Placement
from attnbench.generation.step_timing import step_form
from attnbench.kernels import eager_steps, unavailable_reason, usable

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no kernels: {unavailable_reason()}")


def test_usable_only_for_float32_cpu_tensors_outside_autograd_and_eager_steps() -> None:
    x = torch.zeros(2, 3)
    assert usable(x)
    assert not usable(x.double()) and not usable(x.bfloat16())
    assert not usable(x.t())  # last axis not contiguous
    with eager_steps():
        assert not usable(x)
        with eager_steps(False):  # nested: the inner choice, then the outer again
            assert usable(x)
        assert not usable(x)
    assert usable(x)
    grad = torch.zeros(3, requires_grad=True)
    assert not usable(grad) and usable(grad.detach())
    with torch.no_grad():
        assert usable(grad)


def test_generate_names_the_form_it_times() -> None:
    assert step_form(Placement("cpu", "float32")) == "fused"
    assert step_form(Placement("cpu", "bfloat16")) == "eager"


def test_without_kernels_every_step_is_eager_and_says_why() -> None:
    code = ("import torch; from attnbench.kernels import unavailable_reason, usable; from attnbench.registry import "
            "registry; v = registry.create('topk'); q = torch.randn(1, 2, 200, 16); "
            "s = v.prefill_state(q[:, :, :199], q[:, :, :199], q[:, :, :199], room=1); "
            "v.step(s, q[:, :, 199:], q[:, :, 199:], q[:, :, 199:]); "
            "print(usable(q), unavailable_reason())")  # fmt: skip
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"ATTNBENCH_NO_KERNELS": "1", "PATH": "/usr/bin:/bin"}).stdout  # fmt: skip
    assert shown.strip() == "False disabled by ATTNBENCH_NO_KERNELS"


def kernel_reason(env: dict[str, str]) -> str:
    """unavailable_reason() in a fresh process with `env` (and a step taken: it must not crash)."""
    code = ("import torch; from attnbench.kernels import unavailable_reason; from attnbench.ops import softmax_step; "
            "q = torch.randn(1, 2, 1, 8); softmax_step(q, torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)); "
            "print(unavailable_reason())")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_a_damaged_cached_library_is_built_again_never_loaded(tmp_path) -> None:
    env = {"ATTNBENCH_CACHE": str(tmp_path)}
    assert kernel_reason(env) == "None"
    (built,) = (tmp_path / "kernels").glob("*.so")
    for damage in (b"", b"\x7fELF not a library", built.read_bytes()[:1000]):  # empty, garbage, truncated
        built.write_bytes(damage)
        assert kernel_reason(env) == "None"
        assert built.stat().st_size > 1000  # rebuilt whole


def test_a_cache_that_cannot_be_written_or_a_failing_compiler_gives_a_reason(tmp_path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert "could not be built or loaded" in kernel_reason({"ATTNBENCH_CACHE": str(blocked)})
    failed = kernel_reason({"ATTNBENCH_CACHE": str(tmp_path / "c"), "CC": "false"})
    assert failed.startswith("building") and "exit status 1" in failed
