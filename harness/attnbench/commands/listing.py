"""`attnbench list`: every registered variant (built-in and plugins) with its capabilities and package, then the
plugins that failed to load."""

from __future__ import annotations

import argparse

from attnbench.exit_status import Exit
from attnbench.registry import registry


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `list` verb (it takes no arguments)."""
    subparsers.add_parser(
        "list",
        help="every variant: family, exactness, capabilities, package; broken plugins",
        description="List every registered variant (built-in and plugins) with its capabilities and package.",
    )


def main(args: argparse.Namespace) -> int:
    """One row per working variant, its hyperparameters under it; a broken plugin by name and error."""
    entries = registry.load_all()
    working = [e for e in entries if e.variant_class is not None]
    broken = [e for e in entries if e.error is not None]
    print(
        f"{'name':<16} {'family':<10} {'exact':<6} {'causal':<7} {'padding':<8} {'Nq!=Nk':<7} "
        f"{'backward':<9} {'decode':<7} {'devices':<10} package"
    )
    for entry in working:
        cls = entry.variant_class
        caps = cls.supports
        flags = [caps.causal, caps.key_padding_mask, caps.cross_attention, caps.backward, cls.decodes()]
        marks = ["yes" if f else "no" for f in flags]
        print(
            f"{entry.name:<16} {cls.family:<10} {'yes' if cls.exact else 'no':<6} {marks[0]:<7} {marks[1]:<8} "
            f"{marks[2]:<7} {marks[3]:<9} {marks[4]:<7} {','.join(caps.devices):<10} {entry.package}"
        )
        for key, spec in cls.hyperparameters.items():
            print(f"{'':<18}{key} = {spec.default!r}: {spec.doc}")
    if broken:
        print("\nbroken plugins (every other variant still works):")
        for entry in broken:
            print(f"  {entry.name} ({entry.package}): {entry.error}")
    return Exit.OK
