"""`attnbench list`: every registered variant (built-in and plugins) with its capabilities and package, the papers'
names `attnbench generate` takes (each a variant's setting), then the plugins that failed to load."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from typing import Any

from attnbench.commands.terminal import terminal_width
from attnbench.exit_status import Exit
from attnbench.interface import AttentionVariant
from attnbench.registry import registry

HEADERS = ("name", "family", "softmax", "causal", "padding", "Nq!=Nk", "backward", "decode", "devices", "package")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `list` verb (it takes no arguments)."""
    subparsers.add_parser(
        "list",
        help="every variant: family, relation to softmax, capabilities, package; the papers' names; broken plugins",
        description=(
            "List every registered variant (built-in and plugins) with its capabilities and package. softmax: exact "
            "(softmax on its own support), approx. (an approximation of softmax attention) or other (a different "
            "operator, e.g. gated linear attention: never recommended on its error vs softmax). causal: only = it "
            "refuses non-causal calls; decode = it runs in --mode decode alone (a KV-cache method). Then the papers' "
            "names `attnbench generate --methods` takes (quest, streamingllm, ...): the variant setting each is, and "
            "its paper's parameter names mapped onto the variant's."
        ),
    )


def softmax_relation(cls: type[AttentionVariant]) -> str:
    """'exact', 'approx.' or 'other': what the variant computes, relative to softmax attention."""
    if cls.exact:
        return "exact"
    return "approx." if cls.approximates_softmax else "other"


def causal_mark(cls: type[AttentionVariant]) -> str:
    """'yes', 'no', 'only' when a default instance refuses non-causal calls, 'decode' when it runs in decode alone."""
    if not cls.supports.causal:
        return "no"
    caps = cls.supports
    try:
        variant = cls()
    except Exception:  # a plugin whose defaults cannot build an instance: its declaration alone
        return "yes"
    accepted = variant.causal_options(device=caps.devices[0], dtype=caps.dtypes[0])
    if not accepted:  # a decode-only method, or one this machine cannot run at all (its declaration then)
        return "decode" if cls.decodes() else "yes"
    return "only" if accepted == [True] else "yes"


def method_source(cls: type[AttentionVariant]) -> str:
    """'paper: …; kvpress: …' for a KV-cache method that names its paper and kvpress's press of the same rule (the
    class attributes `paper` and `press`, as every scored press sets them), else ''."""
    said = [f"{what}: {value}" for what, value in (("paper", getattr(cls, "paper", "")),
                                                  ("kvpress", getattr(cls, "press", ""))) if value]  # fmt: skip
    return "; ".join(said)


def print_aliases(width: int) -> None:
    """The papers' names `attnbench generate` takes: what each runs, and its paper's parameters as the variant's."""
    from attnbench.generation.budgets import knob_of
    from attnbench.generation.grid import ALIASES, PAPER_PARAMETERS, alias_method

    print("\n" + textwrap.fill("papers' names (attnbench generate --methods): each a setting of a variant; it takes "
                               "its paper's parameter names (paper's -> variant's) and the variant's own", width))  # fmt: skip
    for alias in ALIASES:
        method = alias_method(alias)
        swept = f"; {knob_of(method.variant.name).parameter} set by --keep" if method.swept else ""
        print(textwrap.fill(f"{alias:<17} = {method.label()}{swept}", width, subsequent_indent=" " * 20))
        for key, parameter in PAPER_PARAMETERS.get(alias, {}).items():
            said = f"{key} -> {parameter.sets}: {parameter.doc}"
            print(textwrap.fill(said, width, initial_indent=" " * 18, subsequent_indent=" " * 20))


def main(args: argparse.Namespace) -> int:
    """One row per working variant, its hyperparameters under it; a broken plugin by name and error."""
    entries = registry.load_all()
    working = [e for e in entries if e.variant_class is not None]
    broken = [e for e in entries if e.error is not None]
    rows = []
    for entry in working:
        cls = entry.variant_class
        caps = cls.supports
        flags = [caps.key_padding_mask, caps.cross_attention, caps.backward, cls.decodes()]
        marks = ["yes" if f else "no" for f in flags]
        rows.append([entry.name, cls.family, softmax_relation(cls), causal_mark(cls), *marks,
                     ",".join(caps.devices), entry.package])  # fmt: skip
    widths = [max(len(str(r[i])) for r in [list(HEADERS), *rows]) + 1 for i in range(len(HEADERS) - 1)]
    line = lambda values: " ".join(f"{v:<{w}}" for v, w in zip(values, widths)) + f" {values[-1]}"  # noqa: E731
    width = terminal_width()

    def hyperparameters(entry: Any, indent: int) -> None:
        """The variant's paper and kvpress press where it names them, then its hyperparameters, one line each."""
        if source := method_source(entry.variant_class):
            print(textwrap.fill(source, width, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2)))
        for key, spec in entry.variant_class.hyperparameters.items():
            said = f"{key} = {spec.default!r}: {spec.doc}"
            print(textwrap.fill(said, width, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2)))

    terminal = sys.stdout is not None and sys.stdout.isatty()  # None: started with its output closed
    piped = not terminal and not os.environ.get("COLUMNS")  # `attnbench list | grep x`: a line each
    if piped or len(line(max(rows + [list(HEADERS)], key=lambda r: len(line(r))))) <= width:  # one line fits
        print(line(HEADERS))
        for entry, row in zip(working, rows):
            print(line(row))
            hyperparameters(entry, 18)
    else:  # narrower: the table wrapped to the width, then each variant's hyperparameters under its name
        from attnbench.report.text import aligned_table

        print(aligned_table(list(HEADERS), rows, width=width, breakable=(0, len(HEADERS) - 1)))
        print("\nhyperparameters (name = default: meaning):")
        for entry in working:
            print(entry.name)
            hyperparameters(entry, 2)
    print_aliases(width)
    if broken:
        print("\nbroken plugins (every other variant still works):")
        for entry in broken:
            print(f"  {entry.name} ({entry.package}): {entry.error}")
    return Exit.OK
