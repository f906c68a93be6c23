"""A variant's call under `torch.compile`: the `compile` axis of a sweep.

A compiled cell times `torch.compile(variant.__call__, dynamic=False)`: one graph per shape, as a model compiled
for a fixed length runs. Compilation happens in the cell's first call, so its seconds land in `compile_s`, apart
from the timed calls. The compiled twin is timed in the same group as the eager call, in turns, so what compiling
does is a paired ratio.

Three things keep the figure honest. Each group starts from an empty compile cache (`fresh_compile_cache`), so a
graph compiled for another shape is never guarded against; hitting dynamo's recompile limit raises instead of
falling back to eager silently; and a failure of dynamo or inductor itself (an operator it cannot trace, a missing
C++ compiler, guards that fail on every timed call) makes the cell `unsupported` with the compiler's reason, while
an error the eager call also raises stays an error. The graphs a call compiles into are counted: a call cut into
pieces runs partly eager.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Callable, Iterator

import torch

from attnbench.interface import AttentionVariant

COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch._subclasses", "torch.fx")
COMPILER_LOGGERS = ("torch._dynamo", "torch._inductor")
RECOMPILE_LIMIT = 64  # graphs per variant class within one group (one per setting and mode): far above any preset


def compiled_call(variant: AttentionVariant) -> Callable[..., torch.Tensor]:
    """The variant's call compiled for static shapes (compiled lazily, at its first call)."""
    return torch.compile(variant.__call__, dynamic=False)


@contextlib.contextmanager
def fresh_compile_cache() -> Iterator[None]:
    """An empty dynamo cache for one group, the recompile limit turned from a silent fall-back into an error, and
    dynamo's warnings (graph breaks, each printed once) kept off the terminal: the graphs are counted instead."""
    torch._dynamo.reset()
    config = torch._dynamo.config
    patch = {"recompile_limit": RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
    patch = {key: value for key, value in patch.items() if hasattr(config, key)}  # names of this torch
    loggers = [logging.getLogger(name) for name in COMPILER_LOGGERS]
    levels = [logger.level for logger in loggers]
    with config.patch(**patch), warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"torch\._dynamo.*|torch\._inductor.*")
        for logger in loggers:  # graph breaks are logged as warnings, with a stack each
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)
            torch._dynamo.reset()


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (read before and after a first call: 1 is a whole call in
    one graph; each graph break adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def no_recompiling() -> Iterator[None]:
    """Timed calls of compiled code that must not compile again: a variant whose guards fail on every call would
    put its compilation inside its timing (below the recompile limit, silently). Here it raises instead."""
    with torch._dynamo.config.patch(error_on_recompile=True):
        yield


def is_compiler_failure(error: BaseException) -> bool:
    """Whether `error` comes from the compiler stack rather than from the variant's own code."""
    return any(type(error).__module__.startswith(module) for module in COMPILER_MODULES)


def compiler_reason(error: BaseException) -> str:
    """A one-line reason for an `unsupported` compiled cell: the compiler's error, its first line, and the first
    line of the error underneath it (a backend's own failure) where there is one."""
    if type(error).__name__ == "RecompileError":
        again = "torch.compile compiled it again between timed calls (its guards change every call)"
        return f"{again}: {_first_line(error)}"[:400]
    lines = [f"{type(error).__name__}: {_first_line(error)}"]
    cause = error.__cause__ or error.__context__
    if cause is not None and _first_line(cause) not in lines[0]:
        lines.append(f"{type(cause).__name__}: {_first_line(cause)}")
    return f"torch.compile could not compile it: {' '.join(lines)}"[:400]


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def call_of(variant: AttentionVariant, compiled: bool) -> Callable[..., Any]:
    """What a cell times: the variant's call, or its compiled call."""
    return compiled_call(variant) if compiled else variant
