"""Where a generation runs: the device the model and every method's states live on (cpu | cuda) and the dtype the
model computes in (float32 | bfloat16). Checked before any work (`placement_problems`: CUDA present, each method able
to run there); the model, loaded in float32 on the CPU (`attnbench.model.study.load_model`), is then moved and cast
(`Placement.place`), and every tensor a unit makes follows it (its prompts, the step timing's inputs).

bfloat16 runs on the CPU too (the whole in-model path: `tests/generation/test_placement.py`), so a grid meant for a
GPU can be tried small here first. The rows follow the dtype: a cache in bfloat16 holds half the bytes of float32's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from attnbench.ops import synchronize

if TYPE_CHECKING:
    from attnbench.generation.grid import GenerationGrid

DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Placement:
    """The device and the dtype of one generation (every unit of a grid alike)."""

    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def place(self, model: nn.Module) -> nn.Module:
        """The model moved to this device and its parameters cast to this dtype, in place (tied weights stay tied).
        Buffers keep their dtype, as `from_pretrained(dtype=...)` leaves them: `model.to(bfloat16)` would round the
        rotary embedding's inverse frequencies to 8 bits, turning the angles at N = 32768 into noise. A module the
        model keeps in float32 whatever the dtype (`_keep_in_fp32_modules_strict`) stays so."""
        model.to(device=self.device)
        kept = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
        for name, parameter in model.named_parameters():
            if not kept.intersection(name.split(".")):
                parameter.data = parameter.data.to(self.torch_dtype)
        return model

    def tokens(self, ids: list[int]) -> torch.Tensor:
        """Token ids (n,) as a long tensor on this device."""
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def synchronize(self) -> None:
        """Wait for the device's queued work, so a clock read after it counts that work (a no-op on the CPU)."""
        synchronize(torch.device(self.device))

    def __str__(self) -> str:
        return f"{self.device}, {self.dtype}"


def cuda_problem(placement: Placement) -> str | None:
    """Why this machine cannot run on the placement's device (CUDA asked for, torch sees no GPU), or None."""
    if placement.device != "cuda" or torch.cuda.is_available():
        return None
    why = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}, but it sees no GPU"
    return (f"--device cuda: CUDA is not available to torch {torch.__version__} here ({why}); run on a machine with a "
            "GPU and a CUDA build of torch, or with --device cpu")  # fmt: skip


def placement_problems(grid: GenerationGrid, placement: Placement, *, here: bool = True) -> list[str]:
    """Every reason the grid cannot run at the placement: no CUDA on this machine (`here`: the units run on it, not
    on a Ray cluster's nodes), a method whose variant refuses the device or the dtype inside the model."""
    problems = []
    if here and (problem := cuda_problem(placement)) is not None:
        problems.append(problem)
    from attnbench.registry import registry

    for method in grid.methods:
        variant = registry.create(method.variant.name, seed=0, **dict(method.variant.params))
        why = variant.unsupported_reason(device=placement.device, dtype=placement.dtype, causal=True, padded=False,
                                         n_q=64, n_k=64, decode=variant.decodes(), in_model=True)  # fmt: skip
        if why is None and method.quantize != "none":  # KIVI's cache holds what it keeps
            from attnbench.generation.kept import quantizer

            why = quantizer(method.quantize).unsupported_reason(device=placement.device, dtype=placement.dtype,
                                                                causal=True, padded=False, n_q=64, n_k=64,
                                                                decode=True, in_model=True)  # fmt: skip
        if why is not None:
            problems.append(f"{method.label()} cannot generate inside the model on {placement}: {why}")
    return problems
