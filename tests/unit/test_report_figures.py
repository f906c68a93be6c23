"""How a run's figures read: one formatter for every ratio (a tiny one as 1/N×, never 0.00×), the 'faster from N'
column explained under the table that shows it, and no whitespace-only line where a terminal table wraps."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from attnbench.report.analysis import compile_sentence
from attnbench.report.compare import compare_runs, format_comparison
from attnbench.report.summary import summary_tables
from attnbench.report.text import aligned_table, interval_text, ratio_text, speedup_text
from attnbench.report.verdict import verdict_blocks, verdict_markdown, verdict_terminal, verdicts
from attnbench.runfolder.results import read_results
from helpers import synthetic_run


@pytest.mark.parametrize(
    "value, spec, text",
    [
        (1 / 900, ".2f", "1/900×"),
        (0.00105, ".2f", "1/950×"),
        (0.05, ".2f", "1/20×"),
        (0.094, ".2f", "1/11×"),  # below 0.095: the inverse, whole below 100
        (0.0094, ".2f", "1/110×"),  # from 1/100: two digits
        (0.51, ".2f", "0.51×"),
        (12.17, ".2f", "12.17×"),
        (12.17, ".3g", "12.2×"),  # a sentence's three digits
        (1036.4, ".3g", "1036×"),  # whole from 99.5, whatever the spec
        (float("nan"), ".2f", "–"),
        (None, ".2f", "–"),
    ],
)
def test_one_formatter_writes_every_ratio(value: float | None, spec: str, text: str) -> None:
    assert ratio_text(value, spec) == text


def test_a_tiny_speedup_and_its_interval_read_as_fractions() -> None:
    assert interval_text(1 / 900, 1 / 950, 1 / 850) == "1/900× [1/950–1/850]"
    row = pd.Series({"speedup": 1 / 900, "speedup_low": 1 / 950, "speedup_high": 0.12})
    assert speedup_text(row) == "1/900× [1/950–0.12]"
    assert interval_text(1.0234, 1.01, 1.04, ".3f", unit="") == "1.023 [1.010–1.040]"  # a compare's A/B


def test_no_table_or_sentence_of_a_run_prints_a_tiny_ratio_as_zero(tmp_path: Path) -> None:
    """full(kv_cache=False) read '0.00× [0.00–0.00]': here band is ~2000× slower than full, in the terminal's
    verdict, summary.md's tables and verdict, and compare's table alike."""
    run = synthetic_run(tmp_path / "run", scale={"band": 2000.0})
    frame = read_results(run)
    blocks = verdict_blocks(verdicts(frame))
    texts = {
        "terminal": verdict_terminal(blocks, 120),
        "markdown": verdict_markdown(blocks),
        "summary": summary_tables(frame),
        "compare": format_comparison(compare_runs(run, run), run, run),
    }
    for where, text in texts.items():
        assert "0.00×" not in text and "[0.00" not in text, where
    assert "band (slower than full beyond noise and not more accurate; 1/980× [1/1000–1/930]" in texts["terminal"]
    assert "| 1/980× [1/1000–1/930] |" in texts["summary"]
    assert "| 1/980× | 1/980× |" in texts["compare"]  # A's and B's speedups
    compiled = frame.assign(compiled=True, compiled_speedup=frame.speedup, compiled_speedup_low=0.0009,
                            compiled_speedup_high=0.0011)  # fmt: skip
    assert "1/980× at N=2048" in compile_sentence(compiled[frame.label == "band"])


def test_the_faster_from_column_is_explained_once_under_the_first_table_showing_it(tmp_path: Path) -> None:
    """'≈ 1,000, clear ≥ 2,048' was printed without a word on what it means."""
    blocks = verdict_blocks(verdicts(read_results(synthetic_run(tmp_path / "run"))))
    terminal = verdict_terminal(blocks, 200)
    assert terminal.count("faster from N: ") == 1
    shown, legend = terminal.split("faster from N: ")
    assert "≈ 1,000, clear ≥ 2,048" in shown.rstrip(" ").splitlines()[-1]  # right above: the table's last row
    assert legend.startswith("≈ N: the crossover estimate")
    assert "clear ≥ N: faster beyond noise (95% intervals) from that N on." in " ".join(legend.split())
    markdown = verdict_markdown(blocks)
    assert markdown.count("_faster from N: ≈ N: the crossover estimate") == 1
    before = markdown.split("_faster from N: ")[0].rstrip().splitlines()[-1]
    assert before.startswith("| band (speed ties full) |") and before.endswith("| ≈ 1,000, clear ≥ 2,048 |")


@pytest.mark.parametrize("width", [60, 80])
def test_a_wrapped_terminal_table_leaves_no_whitespace_only_line(tmp_path: Path, width: int) -> None:
    """Wrapped noisy cells set the rows apart with a blank line, which the verdict's indent filled with spaces."""
    run = synthetic_run(tmp_path / "run", iqr=0.3)  # every timed cell flagged noisy: its speedup cell wraps
    text = verdict_terminal(verdict_blocks(verdicts(read_results(run))), width)
    lines = text.splitlines()
    assert any("noisy" in line for line in lines) and "" in lines  # rows wrapped, and set apart
    assert [line for line in lines if line and not line.strip()] == []
    assert max(map(len, lines)) <= width
    table = aligned_table(["variant", "speedup"], [["full", "1.00× [0.95–1.05] noisy"], ["band", "2×"]], width=14)
    assert [line for line in table.splitlines() if line != line.rstrip()] == []
