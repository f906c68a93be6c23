"""Needle recall end to end: a run with a `needles` input records recall beside time, memory and error; the report
shows its table and plot; the verdict shows the column and `--min-recall` leaves out a variant that forgets."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnbench.cli import main
from attnbench.exit_status import Exit
from attnbench.runfolder.results import read_results

CONFIG = """
variants = [{{name = "full"}}, {{name = "band", window = 128}}]
seq_lens = [256, 1024]
heads = 2
head_dim = 64
causal = true
min_run_time = 0.01
{extra}
[[inputs]]
name = "realistic"
[[inputs]]
name = "needles"
pairs = 8
"""


def run(tmp_path: Path, extra: str = "", *flags: str) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(extra=extra))
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", *flags]) == 0
    return next((tmp_path / "out").iterdir())


def test_a_needle_run_records_recall_and_the_report_shows_it(tmp_path: Path) -> None:
    folder = run(tmp_path)
    rows = read_results(folder)
    needle = rows[rows["input"] == "needles(pairs=8)"].set_index(["label", "seq_len"])
    assert (needle.needle_accuracy.loc["full"] == 1.0).all() and (needle.needle_pairs == 8).all()
    assert (needle.needle_probes == 16).all()  # batch 1 × 2 heads × 8 pairs
    assert (needle.needle_accuracy.loc["band(window=128)"] < 1).all()  # needles beyond 128 positions are lost
    assert rows[rows["input"] == "realistic"].needle_accuracy.isna().all()
    report = (folder / "report.md").read_text()
    assert "| needle recall (least) |" in report and "Needle recall: the share of the 16 planted" in report
    assert list((folder / "plots").glob("*-recall.png"))
    assert "recall" in report.split("## Detail")[0].split("Left out: band(window=128)")[1].split("\n")[0]


def test_min_recall_leaves_out_a_variant_that_forgets(tmp_path: Path, capsys) -> None:
    folder = run(tmp_path, "", "--min-recall", "0.9", "--max-error", "0.8")
    verdict = (folder / "report.md").read_text().split("## Detail")[0]
    assert "Recall required (`--min-recall 0.9`)" in verdict
    assert "band(window=128) (needle recall below 90%" in verdict
    assert main(["report", str(folder)]) == 0  # the run recorded it: the report judges with it again
    assert "band(window=128) (needle recall below 90%" in (folder / "report.md").read_text()


def test_min_recall_on_a_run_without_needles_is_refused(tmp_path: Path, capsys) -> None:
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full"]\nseq_lens = [16]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n')
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    folder = next((tmp_path / "out").iterdir())
    assert main(["report", str(folder), "--min-recall", "0.9"]) == 2
    assert "has no `needles` input" in capsys.readouterr().err
    assert main(["run", str(config), "--out", str(tmp_path / "o2"), "--no-progress", "--min-recall", "0.9"]) == 2
    assert 'add [[inputs]] name = "needles"' in capsys.readouterr().err


@pytest.mark.slow
def test_decode_scores_the_needles_its_steps_ask_for(tmp_path: Path) -> None:
    extra = 'mode = "decode"\ndecode_steps = 8\nvariants = [{name = "full"}, {name = "band", window = 128}, {name = "h2o", budget = 128}]'
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.format(extra="").replace('variants = [{name = "full"}, {name = "band", window = 128}]', extra))
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    rows = read_results(next((tmp_path / "out").iterdir()))
    needle = rows[rows["input"] == "needles(pairs=8)"].set_index(["label", "seq_len"])
    assert (needle.status == "ok").all()
    assert (needle.needle_accuracy.loc["full"] == 1.0).all()
    assert (needle.needle_accuracy.loc["band(window=128)"] < 1).all()


def test_min_speedup_answers_only_among_variants_that_recall(tmp_path: Path) -> None:
    folder = run(tmp_path, "", "--min-recall", "0.9", "--max-error", "0.8", "--min-speedup", "1.01")
    verdict = (folder / "report.md").read_text().split("## Detail")[0]
    asked = [line for line in verdict.splitlines() if "At least 1.01× faster" in line]
    withheld = verdict.count("No conclusion at this N: its timings are implausible")  # a busy machine's N: no answer
    assert len(asked) + withheld >= 2  # both inputs answered at some N, or withheld and said so
    assert all("leaving out band(window=128): needle recall below 90%" in line for line in asked)
    assert not any("least error: band" in line for line in asked)


def test_recall_asked_but_not_measured_at_an_n_leaves_the_variant_out(tmp_path: Path) -> None:
    folder = run(tmp_path)
    rows = (folder / "results.csv").read_text().splitlines()
    kept = [line for line in rows if not ('needles' in line and ',256,' in line)]  # no needle rows at N=256
    (folder / "results.csv").write_text("\n".join(kept) + "\n")
    # rows of the plan gone: the report judges what is there, and says the run is unfinished (Exit.UNFINISHED)
    assert main(["report", str(folder), "--min-recall", "0.1", "--max-error", "0.8"]) == Exit.UNFINISHED
    verdict = (folder / "report.md").read_text().split("## Detail")[0]
    assert "band(window=128) (needle recall not measured at this N" in verdict
    assert "**Unfinished run: 6 of 8 planned cells recorded**" in verdict


def test_min_recall_where_the_needles_were_skipped_judges_as_the_run_did(tmp_path: Path, capsys) -> None:
    """`run --min-recall` on needles that fit no cell says 'not measured at this N' and exits 0; `report` with the
    same flag on that run did otherwise (exit 2, 'measured no recall'): both judge alike now."""
    config = tmp_path / "c.toml"
    config.write_text('variants = ["full", "band"]\nseq_lens = [32]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.01\n'
                      '[[inputs]]\nname = "realistic"\n[[inputs]]\nname = "needles"\npairs = 16\n')  # fmt: skip
    assert main(["run", str(config), "--out", str(tmp_path / "out"), "--no-progress", "--min-recall", "0.9"]) == 0
    folder = next((tmp_path / "out").iterdir())
    assert main(["report", str(folder), "--min-recall", "0.9"]) == 0
