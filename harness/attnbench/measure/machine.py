"""What machine a run measured on: versions, device, threads, commit, and its measured peaks."""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from attnbench.measure.timing import clock

PACKAGES = ("attnbench", "torch", "einops", "pandas", "seaborn", "numpy", "xformers")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0]}
    for package in PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The commit of the attnbench checkout (None for an installed copy or outside git)."""
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=12"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_description(device: str) -> str:
    """The kind of machine a cell ran on: the GPU's name, or the CPU model with the cores this process may use."""
    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            return "cuda (not available)"
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_model()}, {usable_cores()} cores"


def _best_time(fn, device: torch.device, trials: int, calls: int = 3) -> float:
    """The fastest of `trials` bursts of `calls` calls each (after a warm-up), in seconds per call."""
    clock(fn, device)  # warm-up
    return min(clock(fn, device, calls) / calls for _ in range(trials))


def measure_peaks(
    device: str,
    dtype: torch.dtype,
    *,
    size: int = 1024,
    copy_mib: int = 64,
    read_mib: int = 256,
    trials: int = 5,
    streams: bool = False,
) -> dict[str, float]:
    """Dense matmul FLOP/s and three bandwidths (bytes/s) on this device and dtype: the yardsticks for efficiency.

    - copy: a read and a write stream at once (`copy_`), the yardstick of a call that reads and writes alike;
    - read: one read stream, STREAM-like (a sum over a buffer well past the caches: each byte read once, nothing
      written but one number), what a decode step does with its cache;
    - write: one write stream (`fill_`).
    Each is timed in `trials` separate bursts and the best kept: a burst that met a busy stretch of a shared
    machine reads low, and a peak read low would make efficiencies above 100%. The read and write streams (a buffer
    past the last-level cache: seconds, and a GB on a large-cache server) only with `streams`: what decode's step
    roofline needs, measured by a run with decode cells.
    """
    dev = torch.device(device)
    a = torch.randn(size, size, device=dev).to(dtype)
    b = torch.randn(size, size, device=dev).to(dtype)
    source = torch.empty(copy_mib * 2**20 // 4, dtype=torch.float32, device=dev)
    target = torch.empty_like(source)
    peaks: dict[str, float] = {
        "matmul_flops_per_s": 2 * size**3 / _best_time(lambda: a @ b, dev, trials),
        "copy_bytes_per_s": 2 * source.numel() * 4 / _best_time(lambda: target.copy_(source), dev, trials),
        "matmul_size": size,
        "trials": trials,
    }
    if not streams:
        return peaks
    cache = last_level_cache_bytes() if dev.type == "cpu" else None
    read_mib = max(read_mib, 2 * (cache or 0) // 2**20)  # past the last-level cache: memory's own rate
    stream = torch.ones(read_mib * 2**20 // 4, dtype=torch.float32, device=dev)
    peaks["read_bytes_per_s"] = stream.numel() * 4 / _best_time(lambda: stream.sum(), dev, trials, calls=1)
    peaks["write_bytes_per_s"] = stream.numel() * 4 / _best_time(lambda: stream.fill_(1.0), dev, trials, calls=1)
    peaks["read_mib"] = read_mib
    return peaks


def last_level_cache_bytes() -> int | None:
    """The CPU's largest cache in bytes (sysfs), or None where it cannot be read."""
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes) if sizes else None


def memory_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpus() -> list[dict[str, Any]]:
    """Each visible CUDA device: name, memory, and the driver and CUDA versions (empty without CUDA)."""
    if not torch.cuda.is_available():
        return []
    driver = None
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        driver = result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        pass
    out = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        out.append(
            {
                "name": properties.name,
                "memory_bytes": properties.total_memory,
                "driver": driver,
                "cuda": torch.version.cuda,
            }  # fmt: skip
        )
    return out


def machine_info(devices: list[str]) -> dict[str, Any]:
    return {
        "versions": versions(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_bytes": memory_total_bytes(),
        "torch_threads": torch.get_num_threads(),
        "devices": {device: device_description(device) for device in devices},
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus(),
        "git_commit": git_commit(),
    }


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_KEEP = 1 << 30  # while timing: allocations up to 1 GiB stay in the heap when freed
_MMAP_AFTER = 32 << 20  # otherwise: blocks over 32 MiB (glibc's own ceiling) are mapped and returned when freed
_TRIM_AFTER = 128 << 10  # glibc's default trim threshold
ALLOCATOR_NOTE = (
    "glibc: freed memory retained while a group is timed (mmap and trim thresholds 1 GiB), "
    "returned to the system after it (malloc_trim)"
)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


@contextmanager
def warm_allocator() -> Iterator[None]:
    """While timing, have glibc keep freed memory for reuse instead of returning it to the OS at every free.

    By default every large tensor is a fresh mmap whose pages fault in on first touch, and each repeat of a
    timed call pays that again; real training loops run warm (CUDA's caching allocator does the same). Only
    while timing: kept outside it, freed memory would pile up as resident memory the guard cannot see
    (a large float64 reference grew by a third that way), so on leaving it is returned (malloc_trim).
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _KEEP)
        libc.mallopt(_M_TRIM_THRESHOLD, _KEEP)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_AFTER)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_AFTER)
            libc.malloc_trim(0)


def allocator_note() -> str:
    """What the run does to the CPU allocator, for meta.json."""
    return ALLOCATOR_NOTE if _libc() is not None else "system default (no glibc mallopt here)"


_known_peaks: dict[str, dict[str, Any]] = {}  # "device/dtype" -> measured peaks, this process


def remember_peaks(peaks: dict[str, Any]) -> None:
    """Peaks measured elsewhere (the run's start, the driver of a worker) for `peaks_for` to use."""
    _known_peaks.update({key: value for key, value in peaks.items() if "matmul_flops_per_s" in (value or {})})


def known_peaks() -> dict[str, dict[str, Any]]:
    return dict(_known_peaks)


def peaks_for(device: str, dtypes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Measured peaks of `device` in each dtype: known ones, else measured once in this process (~0.2 s each)."""
    for dtype in dtypes:
        key = f"{device}/{dtype}"
        if key not in _known_peaks:
            try:
                _known_peaks[key] = measure_peaks(device, getattr(torch, dtype))
            except Exception as error:  # e.g. a device this machine lacks: no estimate, the cell says why
                _known_peaks[key] = {"error": f"{type(error).__name__}: {error}"}
    return {key: value for key, value in _known_peaks.items() if key.split("/")[0] == device}


CGROUP_ROOT = Path("/sys/fs/cgroup")  # where the kernel mounts the control groups (a test points it elsewhere)
PROC_CGROUP = Path("/proc/self/cgroup")  # which group this process is in


def available_memory_bytes(device: str) -> int:
    """Free memory the run may use on this device. CPU: MemAvailable, or less where this process's control group
    (a container, a Slurm job; cgroup v2 or v1) caps memory below it; CUDA: free device memory."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return free
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    capped = cgroup_headroom_bytes()
    return available if capped is None else min(available, capped)


def cgroup_headroom_bytes() -> int | None:
    """Limit minus usage of the memory control group this process is in (None: no limit found).

    v2: `<group>/memory.max` and `memory.current` (under `unified/` on a hybrid host), the group named by the
    `0::` line of /proc/self/cgroup;
    v1: `memory/<group>/memory.limit_in_bytes` and `memory.usage_in_bytes`."""
    root = CGROUP_ROOT
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    groups = {}
    for line in lines:
        _id, controllers, group = line.split(":", 2)
        groups[controllers] = group.lstrip("/")
    candidates = []
    if "" in groups:  # v2, unified: at the root, or under unified/ on a hybrid (v1 + v2) host
        candidates.append((root / groups[""], "memory.max", "memory.current"))
        candidates.append((root / "unified" / groups[""], "memory.max", "memory.current"))
    for controllers, group in groups.items():
        if "memory" in controllers.split(","):  # v1
            candidates.append((root / "memory" / group, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    for folder, limit_file, usage_file in candidates:
        for where in (folder, *folder.parents):  # the nearest level that states a limit
            if not str(where).startswith(str(root)):
                break
            try:
                limit_text = (where / limit_file).read_text().strip()
                usage = int((where / usage_file).read_text().strip())
            except (OSError, ValueError):
                continue
            if limit_text == "max" or int(limit_text) >= 1 << 60:  # "max" (v2) or v1's "unlimited" (~2^63)
                continue
            return max(0, int(limit_text) - usage)
    return None


