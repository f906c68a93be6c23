"""meta.json: what a run was (command, config, versions, machine, peaks), read back as a typed `RunMeta` with its
types checked. The run writes it as a plain JSON object (`RunFolder.write_meta`); every reader goes through here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnbench.runfolder.results import RunFolderUnreadable

# the entries of meta.json that are read back, and what each must be (a hand edit can make them anything)
META_TYPES: dict[str, type] = {
    "config": dict, "overrides": dict, "machine": dict, "peaks": dict, "peaks_between": dict, "peaks_at_end": dict,
    "command": list, "resumed": list, "ray_cluster": dict, "model": dict, "status_counts": dict,
}  # fmt: skip


@dataclass(frozen=True)
class RunMeta:
    """A run folder's meta.json, typed: what a reader may rely on (an entry the run did not write reads as empty).
    `raw` is the object as read, for a writer that updates it (a resumed run)."""

    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, run_dir: Path) -> RunMeta:
        return cls(read_meta(run_dir))

    @property
    def command(self) -> list[str]:
        return self.raw.get("command", [])

    @property
    def config(self) -> dict[str, Any]:
        """The resolved config the run measured (`SweepConfig.to_dict`): `parse_config` reads it back."""
        return self.raw.get("config", {})

    @property
    def overrides(self) -> dict[str, Any]:
        return self.raw.get("overrides") or {}

    @property
    def machine(self) -> dict[str, Any]:
        return self.raw.get("machine", {})

    @property
    def started(self) -> str:
        return str(self.raw.get("started", "?"))

    @property
    def finished(self) -> str:
        return str(self.raw.get("finished", "not finished"))

    @property
    def isolated(self) -> bool:
        return bool(self.raw.get("isolated", False))

    @property
    def cpu_allocator(self) -> str:
        return str(self.raw.get("cpu_allocator", "not recorded"))

    @property
    def peaks(self) -> dict[str, dict]:
        """The best of the peaks measured at the run's start, between its groups and at its end."""
        return best_peaks(*(self.raw.get(key, {}) for key in ("peaks", "peaks_between", "peaks_at_end")))

    @property
    def model(self) -> dict[str, Any]:
        """`attnbench model`: the model studied (dir, type, kind, layers, causal)."""
        return self.raw.get("model", {})


def read_meta(run_dir: Path) -> dict[str, Any]:
    """A run folder's meta.json as written ({} when there is none); RunFolderUnreadable when it is not a JSON
    object or an entry read back has the wrong type. Readers take `RunMeta.read`."""
    path = run_dir / "meta.json"
    if not path.exists():
        return {}
    try:
        meta = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunFolderUnreadable(f"{path} is not valid JSON ({error}): restore it, or start a new run") from None
    if not isinstance(meta, dict):
        raise RunFolderUnreadable(f"{path} holds a {type(meta).__name__}, not the run's record (a JSON object)")
    wrong = [
        f"{key} is a {type(meta[key]).__name__}, not a {kind.__name__}"
        for key, kind in META_TYPES.items()
        if key in meta and not isinstance(meta[key], kind)
    ]
    if wrong:
        raise RunFolderUnreadable(f"{path} is not a run's record as written ({'; '.join(wrong)}): restore it")
    return meta


def best_peaks(*measurements: dict[str, dict]) -> dict[str, dict]:
    """Per device/dtype, the highest of several peak measurements (start and end of a run)."""
    best: dict[str, dict] = {}
    for peaks in measurements:
        for key, value in (peaks or {}).items():
            current = best.get(key, {})
            higher_matmul = value.get("matmul_flops_per_s", 0) >= current.get("matmul_flops_per_s", 0)
            merged = {**current, **value} if higher_matmul else dict(current)
            for rate in ("copy_bytes_per_s", "read_bytes_per_s", "write_bytes_per_s"):  # each its own highest
                highest = max(current.get(rate, 0), value.get(rate, 0))
                if highest:
                    merged[rate] = highest
            best[key] = merged
    return best
