"""The section a generation report gains beside another model's run (`attnbench generate --report DIR --beside
OTHER`), from `cross_model.compare`: per N and protocol, the settings both ran with their accuracy and rank in each
model, a line counting how the two models' orders meet (with Spearman's rank correlation), the pairs some model orders,
and sentences naming where the models disagree (a reversed pair; a setting whose standing against its own exact model
differs)."""

from __future__ import annotations

import math

import pandas as pd

from attnbench.report.cross_model import (
    AGREES, REVERSED, Comparison, Side, compare, distinct, side_intervals, spearman, standing_against_exact,
)  # fmt: skip
from attnbench.report.document import Block
from attnbench.report.generation_summary import n_text
from attnbench.report.generation_verdict import EXACT_FLOOR, accuracy_text, and_list


def intro_text(a: Side, b: Side) -> str:
    """What the section compares and by which rules."""
    run = f" (`{b.run}`)" if b.run and b.run not in b.name else ""
    return (
        f"This run ({a.name}) beside {b.name}{run}, at each N and protocol both ran: each method setting both ran "
        "(its label and share), its accuracy pooled over the needle tasks both ran whose exact model is within reach "
        f"in both (a task whose exact interval lies wholly below {EXACT_FLOOR:.0%} in either model is beyond it and "
        "left out), with its Wilson 95% interval and its rank in its model (1 the highest, = a tie). A pair of "
        "settings (two methods at one share, or one method at two shares) is ordered in a model only where its "
        "intervals separate: *agrees* where both models order it the same way, *reversed* where they order it "
        "opposite ways, *<model> only* where the other model's intervals overlap. Spearman's ρ reads the settings' "
        "point accuracies; the pairs read what the intervals can tell."
    )  # fmt: skip


def scope_lines(c: Comparison, a: Side, b: Side) -> list[str]:
    """The tasks pooled and those left out, the exact models' accuracy on them, and why nothing is compared where
    nothing is."""
    head = f"**{n_text(c.seq_len)} ({c.protocol})**"
    left = f"; left out: {'; '.join(c.left_out)}" if c.left_out else ""
    if not c.tasks:
        return [f"{head}: no task both ran is within both models{left}: nothing to compare."]
    exact = ", ".join(f"{side.name} {accuracy_text(e)}" for side, e in zip((a, b), c.exact) if e is not None)
    line = f"{head}: pooled over {and_list(c.tasks)}{left}." + (f" The exact model: {exact}." if exact else "")
    lines = [line]
    if c.untried:
        lines.append(f"Not compared (run on only some of these tasks in one model): {', '.join(c.untried)}.")
    if not c.compared:
        lines.append("No method setting besides the exact model is in both runs on every one of these tasks: nothing "
                     "to compare.")  # fmt: skip
    return lines


def _rank_text(rank: int, column: pd.Series) -> str:
    return f"{rank}=" if (column == rank).sum() > 1 else str(rank)


def settings_table(c: Comparison, a: Side, b: Side) -> tuple[list[str], list[list[str]]]:
    """setting | accuracy in each model [interval] | rank in each; the exact model first."""
    headers = ["setting", a.name, b.name, f"rank in {a.name}", f"rank in {b.name}"]
    rows = []
    for side_a, side_b, r in zip(side_intervals(c.settings, "a").values(), side_intervals(c.settings, "b").values(),
                                 c.settings.itertuples()):  # fmt: skip
        rows.append([r.label + (" (exact)" if r.exact else ""), accuracy_text(side_a), accuracy_text(side_b),
                     _rank_text(r.rank_a, c.settings.rank_a), _rank_text(r.rank_b, c.settings.rank_b)])  # fmt: skip
    return headers, rows


def _samples(column: pd.Series) -> str:
    fewest, most = int(column.min()), int(column.max())
    return f"{fewest}" if fewest == most else f"{fewest}–{most}"


def summary_line(c: Comparison, a: Side, b: Side) -> str:
    """How the two orders meet: the pairs both models order (agree, reversed), those one orders alone, the rest; and
    Spearman's ρ of the settings' accuracies with the samples behind them."""
    outcomes = [p.outcome(a.name, b.name) for p in c.pairs]
    agree, reversed_ = outcomes.count(AGREES), outcomes.count(REVERSED)
    both = agree + reversed_
    only_a, only_b = outcomes.count(f"{a.name} only"), outcomes.count(f"{b.name} only")
    rho = spearman(c.settings.accuracy_a, c.settings.accuracy_b)
    rho_text = ("not defined (fewer than three settings, or one model gives every setting one accuracy)"
                if math.isnan(rho) else f"{rho:+.2f}")  # fmt: skip
    return (f"**Do the orders agree?** Of the {both} pair{'s' if both != 1 else ''} both models order, {agree} "
            f"agree{'s' if agree == 1 else ''} and {reversed_} {'is' if reversed_ == 1 else 'are'} reversed; {only_a} "
            f"{'is' if only_a == 1 else 'are'} ordered in {a.name} only and {only_b} in {b.name} only; the other "
            f"{c.candidates - len(c.pairs)} of the {c.candidates} pairs overlap in both. Spearman's ρ of the "
            f"{len(c.settings)} settings' accuracies: {rho_text} ({a.name}: {_samples(c.settings.samples_a)} samples a "
            f"setting; {b.name}: {_samples(c.settings.samples_b)}).")  # fmt: skip


ORDER = {REVERSED: 0, AGREES: 1}  # the pairs table: reversed first, then agreeing, then one-sided


def pairs_table(c: Comparison, a: Side, b: Side) -> tuple[list[str], list[list[str]]]:
    """Every pair some model orders: which pair, the higher and the lower (by the first model that orders them),
    their accuracies in each model, and how the orders meet."""
    figures = side_intervals(c.settings, "a"), side_intervals(c.settings, "b")
    rows = []
    for p in sorted(c.pairs, key=lambda p: (ORDER.get(p.outcome(a.name, b.name), 2), p.a == 0)):
        cells = [f"{accuracy_text(f[p.first])} vs {accuracy_text(f[p.second])}" for f in figures]
        rows.append([p.kind, p.first, p.second, *cells, p.outcome(a.name, b.name)])
    return ["pair", "higher", "lower", a.name, b.name, "across the models"], rows


def disagreement_lines(c: Comparison, a: Side, b: Side) -> list[str]:
    """Where the models disagree: each reversed pair with its figures, and the settings whose standing against their
    own model's exact one (clearly below it, not clearly below it, clearly above it) differs; or that they nowhere
    do where both can tell."""
    ia, ib = side_intervals(c.settings, "a"), side_intervals(c.settings, "b")
    lines = [f"**Reversed** ({p.kind}): {p.first} lies clearly above {p.second} in {a.name} "
             f"({accuracy_text(ia[p.first])} vs {accuracy_text(ia[p.second])}) but clearly below it in {b.name} "
             f"({accuracy_text(ib[p.first])} vs {accuracy_text(ib[p.second])})."
             for p in c.pairs if p.outcome(a.name, b.name) == REVERSED]  # fmt: skip
    if None not in c.exact:
        differ: dict[tuple[str, str], list[str]] = {}
        for label in c.settings.label[~c.settings.exact]:
            sa, sb = (standing_against_exact(i[label], e) for i, e in zip((ia, ib), c.exact))  # type: ignore[arg-type]
            if sa != sb:
                differ.setdefault((sa, sb), []).append(label)
        lines += [f"**Against its own exact model**, {sa} it in {a.name} but {sb} it in {b.name}: {and_list(labels)}."
                  for (sa, sb), labels in differ.items()]  # fmt: skip
    if not lines:
        lines.append("**Where they disagree**: nowhere both models can tell: no pair both order is reversed, and every "
                     "setting stands alike against its own exact model in both.")  # fmt: skip
    return lines


def no_common_text(a: Side, b: Side) -> str:
    """The line for two runs without one (N, protocol) of needle tasks in common."""

    def where(side: Side) -> str:
        ok = side.rows[(side.rows.status == "ok") & side.rows.score.notna()]
        keys = sorted(set(zip(ok.seq_len, ok.protocol)))
        return ", ".join(f"{n_text(int(n))} ({p})" for n, p in keys) or "no needle task finished"

    return (f"No N and protocol at which both runs finished a needle task: nothing to compare ({a.name}: {where(a)}; "
            f"{b.name}: {where(b)}).")  # fmt: skip


def cross_model_blocks(ours: Side, other: Side) -> list[Block]:
    """The section 'Beside <other model>': the intro, then per (N, protocol) the scope, the settings table, the line
    on how the orders meet, the pairs table and where the models disagree."""
    a, b = distinct(ours, other)
    blocks = [Block("heading", f"Beside {b.name}", level=2), Block("text", intro_text(a, b))]
    comparisons = compare(a, b)
    if not comparisons:
        return blocks + [Block("text", no_common_text(a, b))]
    for c in comparisons:
        blocks += [Block("text", line) for line in scope_lines(c, a, b)]
        if not c.compared:
            continue
        headers, rows = settings_table(c, a, b)
        blocks.append(Block("table", headers=headers, rows=rows, caption=(
            f"{n_text(c.seq_len)} ({c.protocol}): accuracy pooled over {and_list(c.tasks)} [Wilson 95% interval] "
            "and rank in each model.")))  # fmt: skip
        blocks.append(Block("text", summary_line(c, a, b)))
        if c.pairs:
            headers, rows = pairs_table(c, a, b)
            blocks.append(Block("table", headers=headers, rows=rows, caption=(
                "The pairs some model orders (their intervals separate): the pair's share (two methods) or method "
                "(two shares), the higher and the lower in the first model that orders them, their accuracies in "
                "each.")))  # fmt: skip
        blocks += [Block("text", line) for line in disagreement_lines(c, a, b)]
    return blocks

