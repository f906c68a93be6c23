"""One comparison group measured by the measurement of its mode: full-sequence calls (`fwd`, `fwd+bwd`:
`attnbench.measure.group`) or generation one token at a time (`decode`: `attnbench.measure.decode`)."""

from __future__ import annotations

from attnbench.measure.decode import DecodeMeasurement
from attnbench.measure.group import GroupMeasurement, GroupResult, Progress
from attnbench.plan.cells import Group
from attnbench.plan.config import Settings
from attnbench.registry import Registry


def measure_group(
    group: Group,
    settings: Settings,
    registry: Registry,
    *,
    self_checks: dict[tuple, tuple[bool, str]] | None = None,
    progress: Progress | None = None,
) -> GroupResult:
    """Rows (one per cell, failures included) and timing samples of one comparison group."""
    kind = DecodeMeasurement if group.setting.mode == "decode" else GroupMeasurement
    return kind(group, settings, registry, self_checks=self_checks, progress=progress).run()
