"""FlexAttention (torch.nn.attention.flex_attention) as a second backend for exact sparse patterns.

The pattern is given as a mask_mod; its block mask is built once per (pattern, heads, N, device) and
cached, a few query blocks at a time, so that no N x N tensor ever exists (create_block_mask builds one).
flex_attention is compiled (Inductor: a C++ compiler on the CPU, Triton on CUDA) once per shape, on
purpose: dynamo's recompile limit is raised to RECOMPILE_LIMIT for a call that compiles, and a call past a
limit raises instead of falling back to the unfused eager path. The first call of each new shape is timed
apart: `last_compile_seconds()`. Where a compiler is missing the backend reports itself unsupported instead
of failing inside a benchmark cell.

h - heads, i - query in block, j - key in block, qb - query block, kb - key block
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.interface import Hyperparameter
from attnbench.ops import synchronize
from einops import reduce
from torch import Tensor

FLEX_BACKEND = "flex"
FLEX_DTYPES = ("float32", "float16", "bfloat16")


@functools.cache
def _compiler_missing(device_type: str) -> str | None:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as error:
        return f"FlexAttention is not in this torch ({torch.__version__}): {error}"
    if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        return f"the flex backend needs dynamo's recompile-limit settings; torch {torch.__version__} is too old"
    if device_type == "cpu" and not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler found for torch.compile on the CPU (install g++)"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "Triton is not installed, so FlexAttention cannot be compiled on CUDA"
    return None


def flex_unsupported_reason(
    name: str, *, device: str, dtype: Any, padded: bool, backward: bool = False, **_: Any
) -> str | None:
    """Why the flex backend cannot run these options, or None."""
    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name not in FLEX_DTYPES:
        return f"{name} with backend='flex' does not support {dtype_name} (supported: {', '.join(FLEX_DTYPES)})"
    if padded:
        return f"{name} with backend='flex' takes no key padding mask (it would need a new block mask every call)"
    if backward and torch.device(device).type == "cpu":
        return f"{name} with backend='flex' has no backward on the CPU (FlexAttention's autograd needs CUDA)"
    missing = _compiler_missing(torch.device(device).type)
    return f"{name} with backend='flex': {missing}" if missing else None


BLOCK = 128  # FlexAttention's default sparse block: a tile is BLOCK queries x BLOCK keys
STEP_ELEMENTS = 2**21  # mask entries evaluated per step while building a block mask (int64 indices: 16 MiB)
RECOMPILE_LIMIT = 256  # shapes flex_attention may be compiled for in one process; past it a call raises


def _ordered(blocks: Tensor) -> tuple[Tensor, Tensor]:
    """(h, qb, kb) bool -> (1, h, qb) counts and (1, h, qb, kb) indices, int32: the used blocks first, in
    ascending order, then the rest, as create_block_mask orders them."""
    blocks = blocks[None].to(torch.int32)
    order = torch.argsort(blocks, dim=-1, descending=True, stable=True)
    return blocks.sum(dim=-1, dtype=torch.int32), order.to(torch.int32)


def build_block_mask(mask_mod: Callable[..., Tensor], heads: int, n_q: int, n_k: int, device: torch.device) -> Any:
    """create_block_mask(mask_mod, 1, heads, n_q, n_k)'s BlockMask, without its dense (n_q, n_k) mask.

    The mask_mod is evaluated on broadcast indices, (1, rows, n_k) or (heads, rows, n_k) when it reads `h`,
    a few query blocks at a time (about STEP_ELEMENTS entries), and each tile is reduced at once to empty,
    partial or full. Positions past n_q or n_k are masked, so a ragged tile is partial, as in
    create_block_mask. Kept: O((N / BLOCK)^2) int32 indices. The batch index is always 0.
    """
    from torch.nn.attention.flex_attention import BlockMask

    q_blocks, kv_blocks = -(-n_q // BLOCK), -(-n_k // BLOCK)
    rows = BLOCK * max(1, STEP_ELEMENTS // (heads * BLOCK * n_k))
    batch = torch.zeros((), dtype=torch.long, device=device)
    head = torch.arange(heads, device=device)[:, None, None]
    kv_idx = torch.arange(n_k, device=device)
    counts = []
    for start in range(0, q_blocks * BLOCK, rows):
        q_idx = torch.arange(start, min(start + rows, n_q), device=device)[:, None]
        allowed = mask_mod(batch, head, q_idx, kv_idx)
        allowed = allowed.expand(torch.broadcast_shapes(allowed.shape, (1, len(q_idx), n_k)))  # (h | 1, rows, n_k)
        allowed = F.pad(allowed, (0, kv_blocks * BLOCK - n_k, 0, -len(q_idx) % BLOCK))  # outside: masked
        counts.append(reduce(allowed, "h (qb i) (kb j) -> h qb kb", "sum", i=BLOCK, j=BLOCK))
    count = torch.cat(counts, dim=1)  # (h | 1, qb, kb): allowed pairs per tile
    full = count == BLOCK * BLOCK
    partial = (count > 0) & ~full
    return BlockMask.from_kv_blocks(
        *_ordered(partial), *_ordered(full), BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(n_q, n_k)
    )


@functools.cache
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False, fullgraph=True)


def _room_for_new_shape() -> contextlib.AbstractContextManager:
    """Dynamo's limits raised to RECOMPILE_LIMIT for a call that compiles a new shape (patched only then:
    a patch costs ~80 us, as much as a small call on a GPU)."""
    return torch._dynamo.config.patch(
        recompile_limit=RECOMPILE_LIMIT,
        accumulated_recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.accumulated_recompile_limit),
        fail_on_recompile_limit_hit=True,
    )


def _run_compiled(q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> Tensor:
    """The compiled flex_attention. Past the recompile limit dynamo raises (fullgraph=True, and
    fail_on_recompile_limit_hit while a new shape compiles) instead of running the unfused eager path."""
    from torch._dynamo.exc import FailOnRecompileLimitHit

    try:
        return _compiled_flex()(q, k, v, block_mask=block_mask)
    except FailOnRecompileLimitHit as error:
        raise RuntimeError(
            f"FlexAttention reached dynamo's recompile limit (attnbench allows {RECOMPILE_LIMIT} shapes per process) "
            "and will not fall back to its unfused eager path: raise attnbench.variants.flex.RECOMPILE_LIMIT or run "
            "fewer shapes per process"
        ) from error


_block_masks: dict[Hashable, Any] = {}
_compiled_signatures: set[Hashable] = set()
_last_compile_seconds: float | None = None


def last_compile_seconds() -> float | None:
    """Seconds the latest flex_attention_call spent compiling, or None if it reused a compiled kernel.

    A call compiles when its signature is new (pattern key, device, dtype, grad mode, which of q, k, v are one
    tensor, and their shapes, strides and requires_grad); its time is that first call's wall time (compile plus
    one run, device synchronized), the block mask's construction excluded. The harness reports it as compile time.
    """
    return _last_compile_seconds


def flex_attention_call(q: Tensor, k: Tensor, v: Tensor, mask_mod: Callable[..., Tensor], key: Hashable) -> Tensor:
    """flex_attention(q, k, v) under `mask_mod`; `key` names the pattern (same key, same mask_mod)."""
    global _last_compile_seconds
    heads, n_q, n_k = q.shape[1], q.shape[-2], k.shape[-2]
    mask_key = (key, heads, n_q, n_k, str(q.device))
    if mask_key not in _block_masks:
        _block_masks[mask_key] = build_block_mask(mask_mod, heads, n_q, n_k, q.device)
    block_mask = _block_masks[mask_key]
    inputs = tuple((t.shape, t.stride(), t.requires_grad) for t in (q, k, v))
    signature = (key, str(q.device), q.dtype, torch.is_grad_enabled(), (q is k, k is v, q is v), inputs)
    if signature in _compiled_signatures:
        _last_compile_seconds = None
        return _run_compiled(q, k, v, block_mask)
    start = time.perf_counter()
    with _room_for_new_shape():
        out = _run_compiled(q, k, v, block_mask)
    synchronize(q.device)
    _last_compile_seconds = time.perf_counter() - start
    _compiled_signatures.add(signature)
    return out


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

    @property
    def compiles_itself(self) -> bool:
        return self.backend == FLEX_BACKEND

    def unsupported_reason(self, **options: Any) -> str | None:
        reason = super().unsupported_reason(**options)  # type: ignore[misc]
        if reason is None and self.backend == FLEX_BACKEND:
            reason = flex_unsupported_reason(self.name, **options)
        return reason
