"""What a verdict rests on: a real model's attention or synthetic inputs, and how much of the run's plan.

Every view of a run (the terminal's verdict, summary.md, report.md) opens with one line that says which
(`evidence_line`): a real model's captured heads (which model, which files) or synthetic inputs alone, with the
command that gets the real ones. A run that lacks some of its planned cells (interrupted, killed, rows lost) says
so next (`unfinished`): the cells recorded of those planned, what is missing per comparison group, and the
`--resume` command.

Then, per causal setting and N, which input answers: a real decoder's heads (the `heads` input), or `realistic`, a
synthetic stand-in. The real heads' answer comes first: every variant judged on the worse of its errors over
the real texts run (prose and code), with the run's speed, memory and needle recall, by the verdict's one rule
(`attnbench.report.verdict.verdicts` on those rows). Where `realistic` answers otherwise it is said, and the real
heads are followed; at an N the heads do not reach (beyond the positions they were captured at) the answer is
`realistic`'s, named as synthetic. A causal run without real heads says once that its accuracy comes from the
stand-in, and which command gets the real ones.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench.inputs.heads_cache import DEFAULT_HEADS_MODEL, HEADS_COMMAND, heads_folder, read_manifest
from attnbench.plan.budget import AccuracyBudget
from attnbench.plan.cells import Cell, InputSpec
from attnbench.plan.config import ConfigError, parse_config
from attnbench.report.modes import mode_of
from attnbench.report.text import GROUP_COLUMNS, MACHINE, plain_text
from attnbench.report.verdict import (
    SETTING_COLUMNS,
    Answer,
    InputVerdict,
    setting_key,
    setting_words,
    verdicts,
    with_machine,
)
from attnbench.runfolder.meta import RunMeta

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
    parts = []
    for item in found:
        lines = [textwrap.fill(f"Evidence — {item.setting}:", width)]
        lines += [textwrap.fill(line.replace("`", ""), width, initial_indent="  ", subsequent_indent="    ")
                  for line in item.lines]  # fmt: skip
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# ---- the one opening line: a real model's attention, or synthetic inputs -------------------------------------------


def _inputs_run(frame: pd.DataFrame) -> list[InputSpec]:
    """The inputs of the cells that ran ok (of every cell where none did), in the run's order."""
    rows = frame[frame.status == "ok"] if (frame.status == "ok").any() else frame
    return list(dict.fromkeys(_input_of(key, str(label)) for key, label in zip(rows.cell_key, rows["input"])))


def _input_of(key: str, label: str) -> InputSpec:
    """A row's input: as its label reads where the label reads back as itself (`Spec.parse`), else as its cell key
    records it (a path with a comma, a list), else by the label's name alone (a hand edit broke both)."""
    try:
        [spec] = InputSpec.parse(label, lists=True)
        if spec.label() == label:
            return spec
    except ValueError:
        pass
    try:
        return Cell.from_key(key).input
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return InputSpec(label.split("(")[0])


def _attention_source(spec: InputSpec) -> tuple[str, dict]:
    """Where an input's attention comes from, with its parameters: needles are planted in a background (a
    synthetic one unless `background` names `heads` or `captured`)."""
    params = dict(spec.params)
    if spec.name == "needles" and params.get("background") in ("heads", "captured"):
        return str(params["background"]), params
    return spec.name, params


def _heads_words(model: str, texts: list[str]) -> str:
    """"SmolLM2-135M's captured heads (`prose.pt`, `code.pt` in `/…/heads/SmolLM2-135M`)": the files read, as the
    manifest names them (the folder alone where they are no longer there)."""
    folder, manifest = heads_folder(model), read_manifest(model)
    if manifest is None:
        return f"{model}'s captured heads ({', '.join(texts)}; no longer in `{folder}`)"
    files = [f"`{manifest['texts'][text]['file']}`" if text in manifest["texts"] else text for text in texts]
    return f"{manifest.get('model', model)}'s captured heads ({', '.join(files)} in `{folder}`)"


def _heads_hint() -> str:
    """How to get real heads: `make model`, or, where it ran already, which runs use them."""
    manifest = read_manifest(DEFAULT_HEADS_MODEL)
    if manifest is None:
        return f"run `make model` for real heads ({DEFAULT_HEADS_MODEL}'s, which then judge the causal cells)"
    return (f"{DEFAULT_HEADS_MODEL}'s heads are captured here now: a run with causal cells (N up to "
            f"{manifest['positions']}) and the `heads` input judges on them")  # fmt: skip


def evidence_line(frame: pd.DataFrame) -> str:
    """The line every view of a run opens with (Markdown): whether its accuracy rests on a real model's attention
    (which model and which files: captured heads, or a captured file) or on synthetic inputs alone, with how to get
    the real heads. A reader must never take a synthetic verdict for a real model's."""
    heads: dict[str, list[str]] = {}
    captured, synthetic = [], []
    for spec in _inputs_run(frame):
        source, params = _attention_source(spec)
        if source == "heads":
            texts = heads.setdefault(str(params.get("model", DEFAULT_HEADS_MODEL)), [])
            texts += [text] if (text := str(params.get("text", "prose"))) not in texts else []
        elif source == "captured":
            captured.append(f"captured attention (`{params.get('path')}`)")
        else:
            synthetic.append(f"`{spec.label()}`")
    real = [_heads_words(model, texts) for model, texts in heads.items()] + list(dict.fromkeys(captured))
    if not real:
        return (f"**Evidence: synthetic inputs only** ({', '.join(synthetic)}), no real model's attention: "
                f"{_heads_hint()}.")  # fmt: skip
    others = f"; the other inputs are synthetic ({', '.join(synthetic)})" if synthetic else ""
    return f"**Evidence: a real model's attention** — {'; '.join(real)}{others}."


# ---- an unfinished run: the planned cells it lacks ------------------------------------------------------------------


@dataclass(frozen=True)
class Unfinished:
    """A run folder that lacks some of its planned cells (interrupted, killed, rows lost): how many it holds, what
    is missing, and the command that measures it."""

    recorded: int  # the planned cells it holds
    planned: int
    interrupted: str  # when meta.json says the run was interrupted ('' when it does not: killed, rows lost)
    absent: list[str]  # planned inputs, modes and N with no cell recorded: 'input `needles(pairs=16)`', 'N=1024'
    missing: dict[str, str]  # per comparison group, titled as its verdict is: what of it is missing
    resume: str  # `attnbench run --resume RUN_DIR` (with the executor the run used)


def planned_cells(meta: RunMeta) -> list[Cell] | None:
    """The cells a run's stored config plans, expanded again here (None where it cannot be read here: a plugin
    missing, a device or file this machine lacks, no config recorded)."""
    if not meta.config:
        return None
    cluster = str(meta.raw.get("executor", "")).startswith("ray")  # a Ray run's devices are its workers'
    try:
        return parse_config(meta.config, source="meta.json", cluster=cluster).plan().cells
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


def resume_command(run_dir: Path, meta: RunMeta) -> str:
    """The command that measures a run's missing cells, on the executor it ran on ('ray at HOST:PORT' recorded)."""
    executor, _, address = str(meta.raw.get("executor", "local")).partition(" at ")
    flags = f" --executor {executor}" if executor not in ("", "local") else ""
    return f"attnbench run --resume {shlex.quote(str(run_dir))}{flags}" + (f" --address {address}" if address else "")


def unfinished(run_dir: Path, meta: RunMeta, frame: pd.DataFrame) -> Unfinished | None:
    """What the run lacks of its plan (None when it holds every planned cell). Where the plan cannot be rebuilt
    here, the count of cells meta.json recorded is compared, and what is missing is not named."""
    keys = set(frame.cell_key)
    cells = planned_cells(meta)
    interrupted = str(meta.raw.get("interrupted", ""))
    if cells is None:
        planned = meta.raw.get("cells")
        if not isinstance(planned, int) or planned <= len(keys):
            return None
        return Unfinished(len(keys), planned, interrupted, [], {}, resume_command(run_dir, meta))
    lost = [cell for cell in cells if cell.key() not in keys]
    if not lost:
        return None
    return Unfinished(len(cells) - len(lost), len(cells), interrupted, _absent(cells, lost),
                      _missing_by_group(cells, lost, frame), resume_command(run_dir, meta))  # fmt: skip


def _absent(cells: list[Cell], lost: list[Cell]) -> list[str]:
    """The planned inputs, modes and N of which no cell was recorded: 'input `needles(pairs=16)`', 'mode decode
    (…)', 'N=1024'."""
    lost_keys = {cell.key() for cell in lost}
    kept = [cell for cell in cells if cell.key() not in lost_keys]
    absent = []
    for words in (lambda c: f"input `{c.input.label()}`", lambda c: f"mode {mode_of(c.mode).words}",
                  lambda c: f"N={c.seq_len}"):  # fmt: skip
        recorded = {words(cell) for cell in kept}
        absent += [said for said in dict.fromkeys(words(cell) for cell in cells) if said not in recorded]
    return absent


def _missing_by_group(cells: list[Cell], lost: list[Cell], frame: pd.DataFrame) -> dict[str, str]:
    """Per comparison group with cells missing, titled as its verdict is ('input — setting'), what is missing:
    'none of its 26 cells (N=256, 1024)', or per N 'N=1024 (all 13 variant settings)' or 'N=256: band, linear'."""
    titles = _group_titles(cells, frame)
    lost_keys = {cell.key() for cell in lost}
    by_group: dict[tuple[str, ...], list[Cell]] = {}
    for cell in cells:
        by_group.setdefault(_group_of(cell), []).append(cell)
    out = {}
    for key, members in by_group.items():
        missing = [cell for cell in members if cell.key() in lost_keys]
        if not missing:
            continue
        ns = list(dict.fromkeys(cell.seq_len for cell in members))
        if len(missing) == len(members):
            out[titles[key]] = f"none of its {len(members)} cells (N={', '.join(map(str, ns))})"
            continue
        parts = []
        for n in ns:
            at_n = [cell.label() for cell in members if cell.seq_len == n]
            gone = [cell.label() for cell in missing if cell.seq_len == n]
            if gone:
                parts.append(f"N={n} (all {len(at_n)} variant settings)" if len(gone) == len(at_n)
                             else f"N={n}: {', '.join(gone)}")  # fmt: skip
        out[titles[key]] = "; ".join(parts)
    return out


def _group_of(cell: Cell) -> tuple[str, ...]:
    """A cell's comparison group, N apart (the verdict's unit: a setting and input, N by N)."""
    columns = cell.columns()
    return tuple(str(columns[c]) for c in GROUP_COLUMNS)


def _group_titles(cells: list[Cell], frame: pd.DataFrame) -> dict[tuple[str, ...], str]:
    """Each planned group's title as the verdict writes it ('realistic — cpu, float32, …'), naming the axes the
    recorded rows vary in (as the verdict does), and those the plan varies in where that alone would give two
    groups one title (seed 1 not recorded at all)."""
    columns = [c for c in SETTING_COLUMNS if c != MACHINE]
    planned = pd.DataFrame([cell.columns() for cell in cells])
    varying = {c for c in columns if c in frame and frame[c].nunique(dropna=False) > 1}
    for extra in (set(), {c for c in columns if planned[c].nunique(dropna=False) > 1}):
        titles = {_group_of(cell): _title(cell, varying | extra) for cell in cells}
        if len(set(titles.values())) == len(titles):
            break
    return titles


def _title(cell: Cell, varying: set[str]) -> str:
    """A cell's group titled as the verdict titles it: 'input — setting in words' (`setting_words`)."""
    return f"{cell.input.label()} — {setting_words(pd.Series(cell.columns()), varying)}"


def _unfinished_head(lacking: Unfinished) -> str:
    """The unfinished run in one Markdown paragraph: recorded of planned, what has no cell at all, how to go on."""
    when = f" (interrupted {lacking.interrupted})" if lacking.interrupted else ""
    text = (f"**Unfinished run: {lacking.recorded} of {lacking.planned} planned cells recorded**{when}. The verdict "
            "rests on the recorded cells alone")  # fmt: skip
    text += f"; nothing was recorded for {', '.join(lacking.absent)}" if lacking.absent else ""
    return text + f". Measure the missing cells with `{lacking.resume}`, then read the report again."


def _missing_lines(lacking: Unfinished) -> list[str]:
    """'- realistic — cpu, …: N=1024 (all 13 variant settings)': what each comparison group lacks."""
    return [f"- {title}: {what}" for title, what in lacking.missing.items()]


def unfinished_markdown(lacking: Unfinished) -> str:
    """The unfinished run in Markdown: its paragraph, then what each comparison group lacks."""
    listed = "\n".join(_missing_lines(lacking))
    return _unfinished_head(lacking) + (f"\n\nMissing, by comparison group:\n\n{listed}" if listed else "")


TERMINAL_GROUPS = 8  # the terminal lists this many groups' missing cells; summary.md lists every one


def unfinished_terminal(lacking: Unfinished, width: int) -> str:
    """The unfinished run as plain text wrapped to `width` (said before the verdict's blocks), the first
    TERMINAL_GROUPS groups' missing cells listed."""
    lines = [textwrap.fill(plain_text(_unfinished_head(lacking)), width)]
    listed = _missing_lines(lacking)
    if listed:
        lines.append("Missing, by comparison group:")
        lines += [textwrap.fill(plain_text(line), width, subsequent_indent="    ") for line in listed[:TERMINAL_GROUPS]]
        if len(listed) > TERMINAL_GROUPS:
            lines.append(f"- … and {len(listed) - TERMINAL_GROUPS} more groups: summary.md lists every one")
    return "\n".join(lines)


def opening_markdown(frame: pd.DataFrame, lacking: Unfinished | None) -> str:
    """What summary.md and report.md open with, under their title: the evidence line, then what an unfinished run
    lacks."""
    return evidence_line(frame) + (f"\n\n{unfinished_markdown(lacking)}" if lacking else "")


def opening_terminal(frame: pd.DataFrame, lacking: Unfinished | None, found: list[Evidence], width: int) -> str:
    """What the terminal prints before the verdict's blocks (`run` and `report` alike): the evidence line, what an
    unfinished run lacks, then per causal setting the evidence N by N."""
    parts = [textwrap.fill(plain_text(evidence_line(frame)), width)]
    parts += [unfinished_terminal(lacking, width)] if lacking else []
    parts += [said] if (said := evidence_terminal(found, width)) else []
    return "\n\n".join(parts)
