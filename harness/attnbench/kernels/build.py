"""Build and load attnbench's CPU decode kernels (the C files beside this one, one library): compiled once per machine with the system's C compiler,
loaded with ctypes, so a step is one call with no Python loop and no torch extension toolchain.

The library lands in the cache (`$ATTNBENCH_CACHE/kernels`, default ~/.cache/attnbench/kernels), named by the hash
of its source, flags and this CPU's feature flags (it is compiled for this CPU: -march=native), written to a temporary
name and renamed, so concurrent builds never see half a file. It links the OpenMP runtime torch already loaded, so
its threads and torch's are one pool. Where no compiler is found or the build fails, `kernels()` is None and
`unavailable_reason()` says why: every caller keeps its eager PyTorch form (labelled), never a silent failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

SOURCES = sorted(Path(__file__).parent.glob("*.c"))  # one library of every kernel file here
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC")  # fast-math: exp vectorized (libmvec)
DISABLE = "ATTNBENCH_NO_KERNELS"  # 1, true, yes or on: every caller takes its eager form
I64, F32, INT, PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_int, ctypes.c_void_p  # argument types, for callers


def cache_dir() -> Path:
    return Path(os.environ.get("ATTNBENCH_CACHE") or Path.home() / ".cache" / "attnbench") / "kernels"


def _cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def _torch_openmp() -> list[str]:
    """Link flags for the OpenMP runtime torch ships (one pool of threads), else the compiler's own."""
    lib = Path(torch.__file__).with_name("lib")
    runtime = lib / "libgomp.so.1"
    return [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"] if runtime.exists() else []


def _compiler() -> str | None:
    return next((cc for cc in (os.environ.get("CC"), "gcc", "cc", "clang") if cc and shutil.which(cc)), None)


class _Build:
    library: ctypes.CDLL | None = None
    reason: str | None = None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compile(compiler: str, link: list[str], target: Path) -> str | None:
    """Build the library into `target` (a temporary name, then renamed, its SHA-256 beside it): None, or why not."""
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        built = Path(work) / target.name
        run = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", str(built), *link, "-lm"],
                             capture_output=True, text=True)  # fmt: skip
        if run.returncode != 0:
            said = run.stderr.strip()[-500:] or f"exit status {run.returncode}, nothing on stderr"
            return f"building {', '.join(p.name for p in SOURCES)} failed ({compiler}): {said}"
        Path(work, "digest").write_text(_digest(built))
        os.replace(Path(work, "digest"), target.with_suffix(".sha256"))
        os.replace(built, target)
    return None


def _intact(target: Path) -> bool:
    """The cached library is the one built (its SHA-256 as recorded): a truncated or damaged file is never loaded
    (loading one can kill the process)."""
    recorded = target.with_suffix(".sha256")
    return target.exists() and recorded.exists() and recorded.read_text().strip() == _digest(target)


@functools.cache
def _build() -> _Build:
    result = _Build()
    if os.environ.get(DISABLE, "").strip().lower() in ("1", "true", "yes", "on"):
        result.reason = f"disabled by {DISABLE}"
        return result
    compiler = _compiler()
    if compiler is None:
        result.reason = "no C compiler found (gcc, cc or clang): decode steps run eager PyTorch"
        return result
    sources = [path.read_text() for path in SOURCES]
    link = _torch_openmp()
    key = hashlib.sha256("\n".join([*sources, compiler, *FLAGS, *link, _cpu_flags()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"decode-{key}.so"
    try:
        if not _intact(target):  # missing or damaged: built (again)
            target.parent.mkdir(parents=True, exist_ok=True)
            result.reason = _compile(compiler, link, target)
            if result.reason:
                return result
        result.library = ctypes.CDLL(str(target))
    except OSError as error:
        result.reason = f"the kernel library in {target.parent} could not be built or loaded: {error}"
    return result


def kernels() -> ctypes.CDLL | None:
    """The loaded library, or None where it cannot be built (`unavailable_reason`)."""
    return _build().library


_FUNCTIONS: dict[str, Callable[..., None]] = {}  # by name: each function has one signature
_CALLS = [0]


def kernel(name: str, *arguments: type) -> Callable[..., None]:
    """The library's function `name`, its argument types declared at its first use (ctypes then converts Python ints
    and floats without guessing), counted as one fused call (`fused_calls`); call only where `usable` said yes."""
    _CALLS[0] += 1
    function = _FUNCTIONS.get(name)
    if function is None:
        function = getattr(kernels(), name)
        function.argtypes, function.restype = list(arguments), None
        _FUNCTIONS[name] = function
    return function


def fused_calls() -> int:
    """Kernel calls so far in this process: a step that made none ran its eager form."""
    return _CALLS[0]


_EAGER = [False]


@contextlib.contextmanager
def eager_steps(eager: bool = True) -> Iterator[None]:
    """Inside: `usable` says no, so every step takes its eager PyTorch form (a decode cell that is not `compiled`
    times that form; the fused one is the default everywhere else)."""
    before, _EAGER[0] = _EAGER[0], eager
    try:
        yield
    finally:
        _EAGER[0] = before


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used in this process (no compiler, a failed build, disabled), or None when they can
    (`eager_steps` still chooses the eager form inside it)."""
    return _build().reason


def usable(*tensors: torch.Tensor) -> bool:
    """The kernels take these tensors: built, float32 on the CPU, outside autograd, last axis contiguous (a plain
    loop: this is asked once a step, ~1 µs)."""
    if _EAGER[0] or kernels() is None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if not t.is_cpu or t.dtype is not torch.float32 or t.stride(-1) != 1 or (grad and t.requires_grad):
            return False
    return True
