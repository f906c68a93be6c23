"""FlexAttention (torch.nn.attention.flex_attention) as a second backend for exact sparse patterns.

The pattern is given as a mask_mod; its block mask is built once per (pattern, N, device) and cached,
and flex_attention is compiled (Inductor: a C++ compiler on the CPU, Triton on CUDA). Where either is
missing the backend reports itself unsupported instead of failing inside a benchmark cell.
"""

from __future__ import annotations

import functools
import shutil
from typing import Any, Callable, Hashable

import torch
from attnbench.interface import Hyperparameter
from torch import Tensor

FLEX_BACKEND = "flex"
FLEX_DTYPES = ("float32", "float16", "bfloat16")


@functools.cache
def _compiler_missing(device_type: str) -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as error:
        return f"FlexAttention is not in this torch ({torch.__version__}): {error}"
    if device_type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler found for torch.compile on the CPU (install g++)"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed, so FlexAttention cannot be compiled on CUDA"
    return None


def flex_unsupported_reason(name: str, *, device: str, dtype: Any, padded: bool, **_: Any) -> str | None:
    """Why the flex backend cannot run these options, or None."""
    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name not in FLEX_DTYPES:
        return f"{name} with backend='flex' does not support {dtype_name} (supported: {', '.join(FLEX_DTYPES)})"
    if padded:
        return f"{name} with backend='flex' takes no key padding mask (it would need a new block mask every call)"
    missing = _compiler_missing(torch.device(device).type)
    return f"{name} with backend='flex': {missing}" if missing else None


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


_block_masks: dict[Hashable, Any] = {}


def flex_attention_call(q: Tensor, k: Tensor, v: Tensor, mask_mod: Callable[..., Tensor], key: Hashable) -> Tensor:
    """flex_attention(q, k, v) under `mask_mod`; `key` names the pattern (same key, same mask_mod)."""
    from torch.nn.attention.flex_attention import create_block_mask

    cache_key = (key, q.shape[-2], k.shape[-2], str(q.device))
    block_mask = _block_masks.get(cache_key)
    if block_mask is None:
        block_mask = create_block_mask(mask_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
        _block_masks[cache_key] = block_mask
    return _compiled_flex()(q, k, v, block_mask=block_mask)


BACKEND = Hyperparameter(
    "blocked",
    "blocked: ours; flex: FlexAttention with a block mask (compiled)",
    kind=str,
    choices=("blocked", FLEX_BACKEND),
)


class FlexBackend:
    """Mixin for variants with a `backend` hyperparameter: the flex backend's capabilities and its memory."""

    backend: str
    name: str

    @property
    def cpu_memory_trackable(self) -> bool:
        return self.backend != FLEX_BACKEND  # a compiled kernel must not run under the tracker

    def unsupported_reason(self, **options: Any) -> str | None:
        reason = super().unsupported_reason(**options)  # type: ignore[misc]
        if reason is None and self.backend == FLEX_BACKEND:
            reason = flex_unsupported_reason(self.name, **options)
        return reason
