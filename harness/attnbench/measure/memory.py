"""Memory of one call, beyond its inputs, under one rule for every variant:

- **per-call peak**: the most bytes the call itself holds at once. State the variant keeps between calls
  (cached patterns, projections, rotations) is not part of it: it is measured on a warm variant, and a view
  of memory that existed before the call (an `expand` of a cached tensor) is no new memory.
- **kept state**: the bytes a fresh variant (its module-level caches emptied, see
  `attnbench.interface.kept_between_calls`) creates in its first call and still holds after it returns, its
  output dropped. Reported in a column of its own.

CUDA: the caching allocator's figures. CPU: two figures of one call.
- `peak_mem_bytes` (method `cpu-allocator-peak`): every byte the CPU allocator hands out during the call, a fused
  kernel's private scratch included (SDPA's flash kernel's per-thread blocks, a custom op's buffers), from the
  profiler's memory events (c10's allocator reports each allocation and free to it), summed in order: the peak;
  never below `tensor_mem_bytes` (the larger of the two is kept).
- `tensor_mem_bytes` (`live-tensor-peak`): bytes of the tensor storages operators return, tracked with a
  TorchDispatchMode that sees every tensor an operator returns and a weak reference that sees its storage freed:
  what the variant's own code holds, without the kernels' scratch. Where the two differ, the difference is scratch.
Neither sees memory taken outside torch's allocator (a BLAS library's own workspace) nor Python objects.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnbench.interface import clear_kept_state
from attnbench.runfolder.rows import CPU_METHOD, CUDA_METHOD


def _storage_key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class LiveTensorPeak(TorchDispatchMode):
    """Tracks the bytes of tensor storages created while the mode is active and still alive, and their peak.

    An operator's output that shares the storage of one of its tensor arguments (a view, an in-place result)
    is no new memory and is not counted.
    """

    def __init__(self, exclude: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.excluded = {_storage_key(t) for t in exclude}
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        arguments = {_storage_key(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for item in tree_flatten(result)[0]:
            if isinstance(item, torch.Tensor) and _storage_key(item) not in arguments:
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


# the profiler logs each start and stop to stderr (kineto's STAGE and USDT lines): silent unless the user set a level
os.environ.setdefault("KINETO_LOG_LEVEL", "6")


class AllocatorPeak:
    """The CPU allocator's peak during a `with` block, beyond what it held when the block began: the profiler's
    memory events (every allocation and free through c10's CPU allocator, kernels' private scratch included) summed
    in the order they happened."""

    def __enter__(self) -> "AllocatorPeak":
        from torch.profiler import ProfilerActivity, profile

        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        self.peak = 0
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)
        events = [e for e in self._profile.profiler.kineto_results.events() if e.name() == "[memory]"]
        current = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            current += event.nbytes()  # negative for a free
            self.peak = max(self.peak, current)


def ready_profiler() -> None:
    """Start and stop the profiler once on the main thread (once per process): kineto registers its client on the
    first profile and prints an ERROR line when that first profile runs on another thread, as a run's measuring
    thread does. Harmless elsewhere."""
    global _PROFILER_READY
    if not _PROFILER_READY and threading.current_thread() is threading.main_thread():
        with AllocatorPeak():
            pass
        _PROFILER_READY = True


_PROFILER_READY = False


@dataclass(frozen=True)
class CallMemory:
    """Per-call peak bytes (kept state excluded), the bytes of state kept between calls, and how measured; on CPU
    also the peak of live tensors alone (`tensor_peak_bytes`: without the kernels' scratch)."""

    peak_bytes: int
    state_bytes: int | None
    method: str
    tensor_peak_bytes: int | None = None


def _held_after(fn: Callable[[], Any], device: torch.device, inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes `fn` creates and still holds once it returned and its result was dropped."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device) - before
    with LiveTensorPeak(exclude=inputs) as tracker:
        fn()
    return tracker.current


def peak_memory(
    fn: Callable[[], Any], device: torch.device, inputs: tuple[torch.Tensor, ...], tensors: bool = True
) -> tuple[int, str, int | None]:
    """Run `fn` once and return (peak bytes beyond `inputs` and beyond what existed before, the method used, on
    CPU the live tensors' peak alone). The result of `fn` is dropped inside, so its memory counts at its peak.
    `tensors=False`: the allocator's peak alone, for compiled code, which must not run under a dispatch mode (its
    buffers go through the same allocator, so the peak sees them; the live-tensor figure is then None)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline, CUDA_METHOD, None
    if not tensors:
        with AllocatorPeak() as allocator:
            fn()
        return allocator.peak, CPU_METHOD, None
    with AllocatorPeak() as allocator, LiveTensorPeak(exclude=inputs) as tracker:
        fn()
    return max(allocator.peak, tracker.peak), CPU_METHOD, tracker.peak


def call_memory(
    warm_call: Callable[[], Any],
    first_call: Callable[[], Any] | None,
    device: torch.device,
    inputs: tuple[torch.Tensor, ...],
    tensors: bool = True,
) -> CallMemory:
    """The memory rule above. `warm_call` calls a variant that has run before (its state exists);
    `first_call`, when given, calls a fresh instance of it: its kept state is what that first call leaves (on CPU
    counted by live tensors, so not given for compiled code, with `tensors=False`: see `peak_memory`)."""
    state = None
    if first_call is not None:
        clear_kept_state()
        state = _held_after(first_call, device, inputs)
    peak, method, tensor_peak = peak_memory(warm_call, device, inputs, tensors)
    return CallMemory(peak_bytes=peak, state_bytes=state, method=method, tensor_peak_bytes=tensor_peak)
