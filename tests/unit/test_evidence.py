"""The verdict names its evidence: on a causal run with real heads, each N is answered on them (each variant held to
its worse text), a disagreeing `realistic` is said and not followed; without them, one line says the accuracy is a
synthetic stand-in's and which command gets the real heads; a non-causal run says nothing of it."""

from __future__ import annotations

from pathlib import Path

from attnbench.report.evidence import evidence_markdown, real_heads_name
from attnbench.report.view import RunView
from helpers import edit_rows, synthetic_run

TIMING = ("time_median_s", "time_p10_s", "time_p25_s", "time_p75_s", "time_p90_s", "time_iqr_s", "time_repeats",
          "speedup", "speedup_low", "speedup_high", "baseline", "noisy")  # fmt: skip


def causal_run(folder: Path, heads: dict[str, dict[str, float]] | None, realistic_band: float = 0.7) -> Path:
    """synthetic_run made causal, band's error on `realistic` set, and for each real text of `heads` an untimed
    copy of the realistic rows with the errors given per variant."""
    run = synthetic_run(folder)

    def edit(rows):
        out = []
        for row in rows:  # synthetic_run's input, gaussian, as `realistic`
            row["causal"], row["input"] = "True", "realistic"
            for key in ("cell_key", "group_key"):
                row[key] = row[key].replace("gaussian", "realistic")
            if row["variant"] == "band" and row["status"] == "ok":
                row["err_vs_uniform"] = str(realistic_band)
            out.append(row)
        for text, errors in (heads or {}).items():
            for row in rows:
                label = f"heads(text={text})"
                copy = {**row, "input": label, "timed": "False"}
                for key in ("cell_key", "group_key"):  # a row is known by its key: the copy is another cell's
                    copy[key] = row[key].replace("realistic", label)
                copy.update({column: "" for column in TIMING if column in copy})
                if copy["status"] == "ok":
                    copy["err_vs_uniform"] = str(errors[copy["variant"]])
                out.append(copy)
        return out

    edit_rows(run, edit)
    return run


def test_real_heads_answer_and_a_disagreeing_realistic_is_said_not_followed(tmp_path):
    run = causal_run(tmp_path / "run", {"prose": {"full": 0, "band": 0.1, "strided": 0.2},
                                        "code": {"full": 0, "band": 0.25, "strided": 0.9}})  # fmt: skip
    [item] = RunView.read(run).evidence
    assert item.real
    at_2048 = next(line for line in item.lines if line.startswith("N=2048"))
    assert "on real heads (prose, code)" in at_2048
    assert "Use band" in at_2048 and "error 0.25" in at_2048  # the worse of the texts: code's 0.25, not prose's 0.1
    assert "`realistic` (synthetic) answers otherwise (nothing beats the baseline): this verdict follows the real heads" in at_2048
    assert "Evidence" in evidence_markdown([item])


def test_where_both_agree_it_is_said(tmp_path):
    run = causal_run(tmp_path / "run", {"prose": {"full": 0, "band": 0.1, "strided": 0.2}}, realistic_band=0.3)
    [item] = RunView.read(run).evidence
    assert any(line.startswith("N=2048") and "`realistic` (synthetic) agrees" in line for line in item.lines)


def test_a_causal_run_without_real_heads_says_once_its_accuracy_is_synthetic(tmp_path):
    run = causal_run(tmp_path / "run", None)
    [item] = RunView.read(run).evidence
    assert not item.real and len(item.lines) == 1
    assert "synthetic stand-in" in item.lines[0] and "make model" in item.lines[0]


def test_a_non_causal_run_has_no_evidence_line(tmp_path):
    assert RunView.read(synthetic_run(tmp_path / "run")).evidence == []


def test_real_heads_are_named_by_their_texts_and_a_model_other_than_the_default():
    assert real_heads_name(["heads(text=prose)", "heads(text=code)"]) == "real heads (prose, code)"
    assert real_heads_name(["heads"]) == "real heads (prose)"
    assert real_heads_name(["heads(model=Mine, text=code)"]) == "real heads (code; Mine)"


def test_the_opening_line_names_the_real_model_and_the_files_read(tmp_path, fake_heads):
    from attnbench.report.evidence import evidence_line

    run = causal_run(tmp_path / "run", {"code": {"full": 0, "band": 0.1, "strided": 0.2}})
    frame = RunView.read(run).frame
    gone = evidence_line(frame)  # heads captured once, no longer here
    assert gone.startswith("**Evidence: a real model's attention** — SmolLM2-135M's captured heads (code; no longer in")
    folder = fake_heads(texts=("prose", "code"))
    assert evidence_line(frame) == (f"**Evidence: a real model's attention** — SmolLM2-135M's captured heads "
                                    f"(`code.pt` in `{folder}`); the other inputs are synthetic (`realistic`).")  # fmt: skip


def test_the_opening_line_of_a_run_without_real_attention_says_synthetic_and_how_to_get_real_heads(tmp_path):
    from attnbench.report.evidence import evidence_line

    line = evidence_line(RunView.read(causal_run(tmp_path / "run", None)).frame)
    assert line == ("**Evidence: synthetic inputs only** (`realistic`), no real model's attention: run `make model` "
                    "for real heads (SmolLM2-135M's, which then judge the causal cells).")  # fmt: skip


def test_a_captured_file_is_real_attention_named_by_its_path(tmp_path):
    from attnbench.report.evidence import evidence_line

    run = synthetic_run(tmp_path / "run")
    label = "captured(path=/data/real.pt)"

    def captured(rows):
        for row in rows:
            row["input"] = label
            for key in ("cell_key", "group_key"):
                row[key] = row[key].replace('"gaussian", {}', '"captured", {"path": "/data/real.pt"}')
        return rows

    edit_rows(run, captured)
    assert evidence_line(RunView.read(run).frame) == ("**Evidence: a real model's attention** — captured attention "
                                                      "(`/data/real.pt`).")  # fmt: skip
