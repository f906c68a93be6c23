"""Variants that none of a run's devices can run, found from each variant's declared `supports.devices`: a config's
own list is run without them and says so in one note before the plan (quick lists full-xformers, a CUDA kernel, for
the runs that have a GPU); a setting named on the command line (`--variants`) is refused. Either way none of their
cells becomes an `unsupported` row."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from attnbench.plan.cells import VariantSpec
from attnbench.registry import Registry

DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")  # the devices a config may name (others are refused by its validation)


@dataclass
class DeviceFilter:
    """A config's variant settings split by the run's devices: those kept, the note for those left out (None when
    none was), and the problems of those the command line named."""

    kept: list[VariantSpec]
    note: str | None = None
    problems: list[str] = field(default_factory=list)


def by_devices(
    specs: Sequence[VariantSpec], devices: Sequence[str], registry: Registry, *, flag: str | None = None
) -> DeviceFilter:
    """Leave out each setting whose variant supports none of `devices` (with one note), or, when `flag` says the
    command line named the settings (`--variants`), refuse it. Devices the config misspelt are not judged here."""
    kinds = {match.group(1) for d in devices if (match := DEVICE.fullmatch(d))}
    if not kinds:
        return DeviceFilter(list(specs))
    gone = [spec for spec in specs if not kinds & set(_devices(spec, registry))]
    kept = [spec for spec in specs if spec not in gone]
    run_on = ", ".join(sorted(kinds))
    if not gone:
        return DeviceFilter(kept)
    if flag is not None:
        return DeviceFilter(kept, problems=[
            f"{flag}: {spec.label()} runs only on {' or '.join(_devices(spec, registry))}, and this run is on "
            f"{run_on}: add --device {_devices(spec, registry)[0]} (on a machine that has one), or leave it out"
            for spec in gone
        ])  # fmt: skip
    listed = ", ".join(f"{spec.label()} runs on {' or '.join(_devices(spec, registry))} only" for spec in gone)
    if not kept:
        return DeviceFilter(kept, problems=[f"variants: none of them runs on {run_on}: {listed}"])
    return DeviceFilter(kept, note=f"{listed}: left out of this run on {run_on} (`attnbench list` shows each "
                                   "variant's devices)")  # fmt: skip


def _devices(spec: VariantSpec, registry: Registry) -> tuple[str, ...]:
    return tuple(registry.load(spec.name).supports.devices)


def causal_forms(specs: Sequence[VariantSpec], causal: Sequence[bool], registry: Registry) -> DeviceFilter:
    """A causal-only run (`--causal true` on quick) leaves out a config's own settings with no causal form
    (Nyströmformer's landmarks, Linformer's projection, lsh(shared_qk=False), …) with one note, not a row
    `unsupported` per input and N; a run with non-causal cells keeps them. All of them without a causal form: kept,
    so the run says why per cell."""
    if False in causal:
        return DeviceFilter(list(specs))
    gone = [spec for spec in specs if not _has_causal_form(spec, registry)]
    kept = [spec for spec in specs if spec not in gone]
    if not gone or not kept:
        return DeviceFilter(list(specs))
    listed = ", ".join(spec.label() for spec in gone)
    return DeviceFilter(kept, note=f"{listed}: no causal form, left out of this causal run (`attnbench list` shows "
                                   "each variant's capabilities)")  # fmt: skip


def _has_causal_form(spec: VariantSpec, registry: Registry) -> bool:
    """The setting runs causal where it runs at all (lsh's shared_qk=False does not; a setting that cannot be built
    is kept: its cells say why)."""
    try:
        variant = registry.create(spec.name, **dict(spec.params))
    except Exception:
        return True
    options = dict(device="cpu", dtype="float32", padded=False, n_q=16, n_k=16)
    causal, plain = (variant.unsupported_reason(causal=c, **options) for c in (True, False))
    return causal is None or plain is not None
