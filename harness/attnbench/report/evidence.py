"""What a causal verdict rests on: a real decoder's heads (the `heads` input), or `realistic`, a synthetic stand-in.

Per causal setting and N, the real heads' answer comes first: every variant judged on the worse of its errors over
the real texts run (prose and code), with the run's speed, memory and needle recall, by the verdict's one rule
(`attnbench.report.verdict.verdicts` on those rows). Where `realistic` answers otherwise it is said, and the real
heads are followed; at an N the heads do not reach (beyond the positions they were captured at) the answer is
`realistic`'s, named as synthetic. A causal run without real heads says once that its accuracy comes from the
stand-in, and which command gets the real ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from attnbench.inputs.heads_cache import HEADS_COMMAND
from attnbench.plan.budget import AccuracyBudget
from attnbench.report.verdict import SETTING_COLUMNS, Answer, InputVerdict, setting_key, verdicts, with_machine

SYNTHETIC = "realistic"


def is_real_heads(label: str) -> bool:
    """Whether an input label is a real model's heads (`heads`, `heads(text=code)`, ...); needles planted in them
    are recall, not the evidence for error."""
    return label == "heads" or label.startswith("heads(")


def real_heads_name(labels: list[str]) -> str:
    """'real heads (prose, code)': the texts (and a model other than the default) of the heads inputs run."""
    texts = [m.group(1) if (m := re.search(r"text=([\w-]+)", label)) else "prose" for label in labels]
    models = {m.group(1) for label in labels if (m := re.search(r"model=([^,)]+)", label))}
    return f"real heads ({', '.join(dict.fromkeys(texts))}{'; ' + ', '.join(sorted(models)) if models else ''})"


def with_worst_real(frame: pd.DataFrame) -> tuple[pd.DataFrame, str] | None:
    """`frame` with one more input: per setting, variant and N the real-heads row of the largest error vs uniform
    (the texts' worse), named `real_heads_name`; None when no real heads ran ok."""
    frame = with_machine(frame)  # a setting's columns, as the verdict groups them
    real = frame[frame["input"].astype(str).map(is_real_heads) & (frame.status == "ok")]
    if real.empty:
        return None
    name = real_heads_name(list(dict.fromkeys(real["input"].astype(str))))
    keys = SETTING_COLUMNS + ["label", "seq_len"]
    worst = real.sort_values("err_vs_uniform", na_position="first").groupby(keys, dropna=False, sort=False).tail(1)
    return pd.concat([frame, worst.assign(input=name)], ignore_index=True), name


@dataclass
class Evidence:
    """One causal setting's evidence: per N the sentence that says which input answers, and whether it is real."""

    setting: str
    setting_key: tuple[str, ...]
    lines: list[str] = field(default_factory=list)
    real: bool = False  # real heads answered at one N at least


def _use(answer: Answer | None) -> str:
    return answer.use if answer is not None else ""


def _said(answer: Answer) -> str:
    return f"Use {answer.use}" if answer.use else "nothing beats the baseline"


def evidence(
    frame: pd.DataFrame, samples: dict[str, list[float]], budget: AccuracyBudget, found: list[InputVerdict]
) -> list[Evidence]:
    """Per causal setting, which input answers at each N (see the module's docstring); [] for a run with no causal
    setting judged on error. `found` is the run's verdict (`verdicts`), reused for `realistic`."""
    if frame.empty or "causal" not in frame or not frame["causal"].astype(str).isin(["True", "true", "1"]).any():
        return []
    combined = with_worst_real(frame)
    real_verdicts: dict[tuple[str, ...], InputVerdict] = {}
    if combined is not None:
        rows, name = combined
        needed = (rows["input"] == name) | rows.time_median_s.notna() | rows["input"].astype(str).str.startswith("needles")
        for verdict in verdicts(rows[needed], samples, budget):  # speed from the timed rows, recall from the needles
            if verdict.input == name:
                real_verdicts[verdict.setting_key] = verdict
    out = []
    for setting, rows in with_machine(frame).groupby(SETTING_COLUMNS, sort=False, dropna=False):
        if str(rows.iloc[0]["causal"]) not in ("True", "true", "1"):
            continue
        key = setting_key(setting)
        synthetic = next((v for v in found if v.setting_key == key and v.input == SYNTHETIC), None)
        real = real_verdicts.get(key)
        if synthetic is None and real is None:
            continue
        item = Evidence((real or synthetic).setting, key, real=real is not None and bool(real.answers))
        if real is None:
            item.lines.append(
                f"Accuracy here comes from `{SYNTHETIC}`, a synthetic stand-in for a decoder's heads, not from a real "
                f"model: {HEADS_COMMAND} captures SmolLM2-135M's heads on prose and code, and the causal presets "
                "then judge on them (`realistic` is calibrated to that model, and judges windows more harshly than "
                "its real heads do)."
            )
            out.append(item)
            continue
        by_n_real = {a.n: a for a in real.answers}
        by_n_synthetic = {a.n: a for a in synthetic.answers} if synthetic else {}
        for n in sorted(set(by_n_real) | set(by_n_synthetic)):
            answer, other = by_n_real.get(n), by_n_synthetic.get(n)
            if answer is None:
                assert other is not None
                item.lines.append(f"N={n}, on `{SYNTHETIC}` only (synthetic: the real heads do not reach this N): "
                                  f"{other.sentence}")  # fmt: skip
                continue
            held = ", each variant held to its worse error of the texts" if "," in real.input.split(";")[0] else ""
            line = f"N={n}, on {real.input}{held}: {answer.sentence}"
            line += f" {answer.asked}" if answer.asked else ""  # --min-speedup's answer, on the same evidence
            if other is not None and _use(other) != _use(answer):
                line += (f" `{SYNTHETIC}` (synthetic) answers otherwise ({_said(other)}): this verdict follows the "
                         "real heads.")  # fmt: skip
            elif other is not None:
                line += f" `{SYNTHETIC}` (synthetic) agrees."
            item.lines.append(line)
        out.append(item)
    return out


def evidence_markdown(found: list[Evidence]) -> str:
    """The evidence as Markdown paragraphs ('' when there is none)."""
    parts = []
    for item in found:
        title = "**Evidence — " + item.setting + ":** "
        parts.append(title + ("\n\n".join(item.lines) if len(item.lines) == 1 else "\n\n- " + "\n- ".join(item.lines)))
    return "\n\n".join(parts)


def evidence_terminal(found: list[Evidence], width: int) -> str:
    """The evidence as plain text wrapped to `width` ('' when there is none): said before the verdict's blocks."""
    import textwrap

    parts = []
    for item in found:
        lines = [textwrap.fill(f"Evidence — {item.setting}:", width)]
        lines += [textwrap.fill(line.replace("`", ""), width, initial_indent="  ", subsequent_indent="    ")
                  for line in item.lines]  # fmt: skip
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
