"""Peak memory of one call, beyond its inputs.

CUDA: the caching allocator's peak minus what was allocated before the call.
CPU:  the peak of bytes held by tensors created during the call, tracked with a TorchDispatchMode that
      sees every tensor an operator returns and a weak reference that sees its storage freed. It cannot
      see memory a kernel allocates privately and frees before returning (e.g. a fused attention kernel's
      scratch buffers, oneDNN workspaces), nor Python objects: it is a lower bound on the process's growth,
      and exact for code made of ordinary tensor operations.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CPU_METHOD = "live-tensor-peak"
CUDA_METHOD = "cuda-allocator-peak"


class LiveTensorPeak(TorchDispatchMode):
    """Tracks the peak bytes of tensor storages created while the mode is active and still alive."""

    def __init__(self, exclude: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        for item in tree_flatten(result)[0]:
            if isinstance(item, torch.Tensor):
                self._track(item)
        return result

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self.live or key in self.excluded:
            return
        size = storage.nbytes()
        self.live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)


def peak_memory(fn: Callable[[], Any], device: torch.device, inputs: tuple[torch.Tensor, ...]) -> tuple[int, str]:
    """Run `fn` once and return (peak bytes beyond `inputs`, the method used).

    The result of `fn` is dropped inside, so its memory counts at its peak and is then freed.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline, CUDA_METHOD
    with LiveTensorPeak(exclude=inputs) as tracker:
        fn()
    return tracker.peak, CPU_METHOD
