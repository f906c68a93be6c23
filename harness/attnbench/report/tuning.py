"""`--tune`'s answer and the knob's curve: from tuning.csv (`attnbench.run.tune`), per mode and N, the fastest pick
within the budget in one sentence ("Use band(sinks=4, window=W): S× at error E"), the other picks after it, and per
setting the error of every knob value probed (the curve the bisection walked)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.report.text import format_percent, interval_text, ratio_text
from attnbench.report.evidence import is_real_heads, real_heads_name
from attnbench.report.modes import Mode, mode_of
from attnbench.report.verdict import error_text


def _speed(row: pd.Series) -> str:
    return interval_text(row.speedup, row.speedup_low, row.speedup_high, ".3g")


def _evidence(labels: str) -> str:
    """The inputs a tuning judged on, as the verdict names them: 'real heads (prose, code)', or the input."""
    inputs = [label.strip() for label in str(labels).replace("), ", ")|").split("|")]
    return real_heads_name(inputs) if all(is_real_heads(x) for x in inputs) else f"`{labels}`"


def tuning_sentences(
    tuning: pd.DataFrame, baseline: str, max_error: float | None = None, min_recall: float | None = None
) -> list[str]:
    """Per mode and N the tuned answer under each rule searched (`attnbench.run.tune.RULES`: error alone, and with
    needle recall where the run planted needles, as the verdict answers): the fastest pick clearly faster than the
    baseline, then the others. Where the report judges with another budget (`max_error`) than the tuning did, or asks
    a needle recall (`min_recall`) the search did not, the answer says so."""
    if tuning.empty:
        return []
    tuning = tuning.assign(rule=tuning["rule"].fillna("continuation")) if "rule" in tuning else tuning.assign(
        rule="continuation", recall=float("nan"), min_recall=float("nan"))  # a tuning.csv from before the rules
    out = []
    for (mode_name, causal, n), rows in tuning.groupby(["mode", "causal", "seq_len"], sort=False):
        mode = mode_of(mode_name)
        where = (f"Tuned at N={n} ({mode.words}{', causal' if str(causal) == 'True' else ''}, error on "
                 f"{_evidence(rows.iloc[0].evidence)})")  # fmt: skip
        budget = rows.iloc[0].budget
        caveats = ""
        if max_error is not None and abs(max_error - budget) > 1e-12:
            within = rows[rows.err_vs_uniform <= max_error].sort_values("value").drop_duplicates("setting")
            smallest = ", ".join(r.label for r in within.itertuples()) or "none"
            caveats += (f" (Tuned for the error budget {budget:g}; this report judges at {max_error:g}, where the "
                        f"smallest values probed within it are: {smallest}, not timed: tune again with --tune "
                        f"--max-error {max_error:g}.)")  # fmt: skip
        asked = rows.min_recall.dropna()
        if min_recall is not None and not (len(asked) and (asked - min_recall).abs().min() < 1e-12):
            caveats += f" (The search did not ask the needle recall --min-recall {min_recall:g} asks.)"
        both = rows.rule.nunique() > 1
        recalls = rows.dropna(subset=["recall"]).groupby("label").recall.min()  # a setting's recall, where measured
        rows = rows.assign(recall=rows.label.map(recalls))  # the continuation picks too: said beside their "Use"
        parts = [_rule_answer(ruled, budget, baseline, mode, both) for _, ruled in rows.groupby("rule", sort=False)]
        out.append(f"{where}: {' '.join(parts)}{caveats}")
    return out


def _rule_answer(rows: pd.DataFrame, budget: float, baseline: str, mode: Mode, both: bool) -> str:
    """One rule's tuned answer: 'Use X: S× … at error E …', or that no value is within it; prefixed with the rule
    when it asks needle recall ('For retrieval (needle recall at least 90%): …'), or when `both` rules were searched."""
    recall = rows.min_recall.dropna()
    asks = f"needle recall at least {format_percent(float(recall.iloc[0]))}" if len(recall) else ""
    prefix = f"For retrieval ({asks}): " if asks else ("For continuation (error alone): " if both else "")
    within = f"the error budget {budget:g}" + (f" with {asks}" if asks else "")
    picks = rows[rows["pick"].astype(bool)].sort_values("speedup", ascending=False)
    recalled = (lambda r: f", needle recall {format_percent(r.recall)}" if r.recall == r.recall else "")
    if picks.empty:
        least = rows.loc[rows.err_vs_uniform.idxmin()] if rows.err_vs_uniform.notna().any() else None
        said = f" (the least error: {least.label}'s {error_text(least.err_vs_uniform)}{recalled(least)})" if least is not None else ""
        return f"{prefix}no value of any knob brings a setting within {within}{said}."
    faster = picks[picks.speedup_low > 1]
    others = "; ".join(f"{r.label} {_speed(r)} at {error_text(r.err_vs_uniform)}{recalled(r)}" for r in picks.itertuples()
                       if faster.empty or r.label != faster.iloc[0].label)  # fmt: skip
    if faster.empty:
        return f"{prefix}no tuned setting within {within} is faster than {mode.against(baseline)} beyond noise ({others})."
    best = faster.iloc[0]
    per = " per generated token" if mode.decode else ""
    return (f"{prefix}Use {best.label}: {_speed(best)} faster{per} than {mode.against(baseline)} at error "
            f"{error_text(best.err_vs_uniform)} vs uniform{recalled(best)}, the fastest setting within {within} of each "
            f"family's key knob" + (f" (then: {others})." if others else "."))  # fmt: skip


def tuning_table(tuning: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Every probe: N, setting, knob value, error, within the budget, and the picks' speedups."""
    headers = ["N", "setting", "knob", "value", "error vs uniform", "needle recall", "rule", "within its rule",
               "speedup (picks)"]  # fmt: skip
    if "rule" not in tuning:  # a tuning.csv from before the rules: error alone
        tuning = tuning.assign(rule="continuation", recall=float("nan"))
    rows = []
    for r in tuning.sort_values(["seq_len", "setting", "value", "rule"]).itertuples():
        recall = format_percent(r.recall) if r.recall == r.recall else "–"
        rows.append([str(r.seq_len), r.setting, r.knob, str(r.value), error_text(r.err_vs_uniform), recall, r.rule,
                     "yes" if r.within else "no", _speed(r) if r.pick and r.speedup == r.speedup else ""])  # fmt: skip
    return headers, rows


def tuning_plot(tuning: pd.DataFrame, path: Path) -> Path | None:
    """Error vs knob value, one panel per N, a line per setting, the budget dashed, each pick ringed and labelled
    with its speedup. None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = tuning[tuning.err_vs_uniform.notna()]
    if data.empty:
        return None
    lengths = sorted(data.seq_len.unique())
    path.parent.mkdir(parents=True, exist_ok=True)
    from matplotlib.ticker import FuncFormatter, LogLocator

    figure, axes = plt.subplots(1, len(lengths), figsize=(max(7.0, 4.6 * len(lengths)), 4.8), squeeze=False, sharey=True)
    lines: dict[str, object] = {}
    for axis, n in zip(axes[0], lengths):
        at = data[data.seq_len == n]
        for setting, rows in at.groupby("setting", sort=False):
            rows = rows.sort_values("value")
            name = f"{setting} by {rows.iloc[0].knob}"
            line = axis.plot(rows.value, rows.err_vs_uniform, marker="o", label=name)[0]
            lines.setdefault(name, line)
            for pick in rows[rows["pick"].astype(bool)].itertuples():
                axis.scatter([pick.value], [pick.err_vs_uniform], s=160, facecolors="none", edgecolors=line.get_color())
                if pick.speedup == pick.speedup:
                    axis.annotate(ratio_text(pick.speedup, ".2g"), (pick.value, pick.err_vs_uniform), textcoords="offset points",
                                  xytext=(6, 6), fontsize=8, color=line.get_color())  # fmt: skip
        axis.axhline(at.iloc[0].budget, color="grey", linestyle="--", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.xaxis.set_major_locator(LogLocator(base=4))
        axis.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_title(f"N={n}", fontsize=10)
        axis.set_xlabel("knob value (window, top_k, budget, …)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("error vs uniform (the worse input's)" if data.evidence.astype(str).str.contains(",").any()
                          else "error vs uniform")  # fmt: skip
    figure.suptitle("Error by knob value; ringed: the smallest within the error budget (the dashed line), with its "
                    "speedup", fontsize=10)  # fmt: skip
    figure.legend(list(lines.values()), list(lines), loc="lower center", ncol=min(3, len(lines)), fontsize=8,
                  frameon=False)  # fmt: skip
    rows_of_legend = (len(lines) + 2) // 3
    figure.tight_layout(rect=(0, 0.06 * rows_of_legend + 0.02, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
