"""`attnbench reproduce`: each check on constructed results that hold, hold in trend only, and fail; the catalogue's
entries are well formed (their configs parse, their checks exist, the labels they compare are in their sweeps)."""

from __future__ import annotations

import json
from dataclasses import fields

import pandas as pd
import pytest
from attnbench.plan.config import parse_config
from attnbench.reproduce.checks import CANNOT, CHECKS, FAILS, HOLDS, TREND
from attnbench.reproduce.claims import CLAIMS


def row(label: str, n: int = 512, *, variant: str | None = None, hparams: dict | None = None, **values) -> dict:
    base = {"label": label, "variant": variant or label.split("(")[0], "hparams": json.dumps(hparams or {}),
            "seq_len": n, "seed": 0, "input": "realistic", "status": "ok", "reason": None}  # fmt: skip
    return base | values


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


# ---- gains_rise_with_n ---------------------------------------------------------------------------------------------

GAINS = {"baseline": "full-math", "published": {"lin(k=1)": {512: (1.5, 2.0), 4096: (3.4, 14.0)}, "lin(k=2)": {}},
         "falls_with_k": ["lin(k=1)", "lin(k=2)"]}  # fmt: skip


def gains_frame(memory_4096: float = 14.0, time_4096: float = 3.4, k2_time_4096: float = 2.0) -> pd.DataFrame:
    """full-math takes 1 s and 1 GB at every N; the variants' times and memories give the ratios asked for."""
    rows = []
    for n, (t1, m1, t2, m2) in {512: (1.5, 2.0, 1.2, 1.5), 4096: (time_4096, memory_4096, k2_time_4096, 8.0)}.items():
        rows += [row("full-math", n, time_median_s=1.0, peak_mem_bytes=1e9),
                 row("lin(k=1)", n, variant="lin", time_median_s=1 / t1, peak_mem_bytes=1e9 / m1),
                 row("lin(k=2)", n, variant="lin", time_median_s=1 / t2, peak_mem_bytes=1e9 / m2)]  # fmt: skip
    return frame(rows)


def test_gains_hold_when_they_rise_shrink_with_k_and_memory_matches() -> None:
    outcome = CHECKS["gains_rise_with_n"](gains_frame(), GAINS)
    assert outcome.verdict == HOLDS, outcome
    assert "lin(k=1): time 1.5× (512) → 3.4× (4096)" in outcome.ours


def test_gains_hold_in_trend_when_memory_is_off_in_size() -> None:
    outcome = CHECKS["gains_rise_with_n"](gains_frame(memory_4096=50.0), GAINS)
    assert outcome.verdict == TREND and "memory at N=4096: 50× here, 14× published" in outcome.detail


@pytest.mark.parametrize(
    "changes, says",
    [({"time_4096": 1.0}, "time gain does not rise"), ({"k2_time_4096": 5.0}, "gains no more time than lin(k=2)")],
)
def test_gains_fail_when_a_trend_breaks(changes: dict, says: str) -> None:
    outcome = CHECKS["gains_rise_with_n"](gains_frame(**changes), GAINS)
    assert outcome.verdict == FAILS and says in outcome.detail


def test_a_claim_whose_cells_did_not_run_says_why() -> None:
    rows = gains_frame()
    rows.loc[rows.label == "lin(k=2)", ["status", "reason"]] = ["skipped", "estimated peak memory exceeds the limit"]
    outcome = CHECKS["gains_rise_with_n"](rows, GAINS)
    assert outcome.verdict == CANNOT and "lin(k=2) at N=512: skipped (estimated peak memory exceeds the limit)" in (
        outcome.detail
    )


# ---- error_falls_along ---------------------------------------------------------------------------------------------

def along(errors: list[float]) -> pd.DataFrame:
    return frame([row(f"performer(features={m})", variant="performer", hparams={"features": m}, err_vs_uniform=e)
                  for m, e in zip([16, 64, 256], errors)])  # fmt: skip


@pytest.mark.parametrize(
    "errors, verdict",
    [([0.9, 0.7, 0.5], HOLDS), ([0.9, 0.5, 0.6], TREND), ([0.5, 0.7, 0.9], FAILS), ([1.5, 1.499, 1.498], FAILS)],
)
def test_error_falls_along_an_axis(errors: list[float], verdict: str) -> None:
    outcome = CHECKS["error_falls_along"](along(errors), {"variant": "performer", "axis": "features"})
    assert outcome.verdict == verdict, outcome
    assert outcome.ours.startswith(f"{errors[0]:.3g} (features=16)")


def test_a_check_needs_every_cell_it_compares() -> None:
    """A cell skipped or failed at one N makes the claim 'cannot run here' (with the cell's reason), never a verdict
    drawn from the N that are left; one value of an axis, or one N of a slope, is not a trend."""
    rows = gains_frame()
    rows.loc[(rows.label == "full-math") & (rows.seq_len == 4096), ["status", "reason"]] = ["skipped", "too big"]
    outcome = CHECKS["gains_rise_with_n"](rows, GAINS)
    assert outcome.verdict == CANNOT and "full-math at N=4096: skipped (too big)" in outcome.detail
    one = along([0.9, 0.7, 0.5]).iloc[:1]
    assert CHECKS["error_falls_along"](one, {"variant": "performer", "axis": "features"}).verdict == CANNOT
    slopes = {"slopes": {"linear": [0.7, 1.3], "full-math": [1.6, 2.4]}}
    assert CHECKS["time_slopes"](timed(1.0, 2.0).iloc[[0, 4, 5]], slopes).verdict == CANNOT
    window = sinks(0.5, 0.41)
    window.loc[1, ["status", "reason"]] = ["error", "output has NaN or Inf"]
    params = {"window": "band(sinks=0, window=256)", "sinks": "band(sinks=4, window=256)"}
    assert CHECKS["sinks_restore"](window, params).verdict == CANNOT
    assert CHECKS["not_transferable"](frame([]), {"why": "a training claim"}).verdict == CANNOT


def test_the_default_value_of_the_axis_counts_as_its_value() -> None:
    rows = along([0.9, 0.7, 0.5])
    rows.loc[2, "hparams"] = "{}"  # features=256 is performer's default: a label without it
    outcome = CHECKS["error_falls_along"](rows, {"variant": "performer", "axis": "features"})
    assert outcome.verdict == HOLDS and "(features=256)" in outcome.ours


# ---- more_accurate -------------------------------------------------------------------------------------------------

def paired(better: list[float], worse: list[float], inputs: tuple[str, ...] = ("realistic",)) -> pd.DataFrame:
    rows = []
    for name in inputs:
        for seed, (good, bad) in enumerate(zip(better, worse)):
            rows += [row("lsh", variant="lsh", hparams={}, seed=seed, input=name, err_vs_uniform=good),
                     row("lsh(shared_qk=True)", variant="lsh", hparams={"shared_qk": True}, seed=seed, input=name,
                         err_vs_uniform=bad)]  # fmt: skip
    return frame(rows)


SHARED = {"variant": "lsh", "better": {"shared_qk": False}, "worse": {"shared_qk": True}}


@pytest.mark.parametrize(
    "better, worse, verdict",
    [
        ([0.5, 0.52, 0.49], [0.9, 0.95, 0.88], HOLDS),
        ([0.5, 0.9, 0.3], [0.6, 0.88, 0.6], TREND),  # lower by 18% on average, not beyond the noise
        ([0.9, 0.95, 0.88], [0.5, 0.52, 0.49], FAILS),
        ([0.5, 0.5, 0.5], [0.5001, 0.5001, 0.5001], FAILS),  # lower every time, by 0.02%: no measurable effect
    ],
)
def test_more_accurate_pairs_by_seed(better: list[float], worse: list[float], verdict: str) -> None:
    outcome = CHECKS["more_accurate"](paired(better, worse), SHARED)
    assert outcome.verdict == verdict, outcome
    assert "(3 pairs)" in outcome.ours


# ---- time_slopes ---------------------------------------------------------------------------------------------------

def timed(linear: float, softmax: float) -> pd.DataFrame:
    ns = [1024, 2048, 4096, 8192]
    return frame([row("linear", n, time_median_s=1e-3 * (n / 1024) ** linear) for n in ns]
                 + [row("full-math", n, time_median_s=1e-3 * (n / 1024) ** softmax) for n in ns])  # fmt: skip


@pytest.mark.parametrize("linear, softmax, verdict", [(1.0, 2.0, HOLDS), (0.6, 2.6, TREND), (2.0, 1.0, FAILS)])
def test_time_slopes(linear: float, softmax: float, verdict: str) -> None:
    outcome = CHECKS["time_slopes"](timed(linear, softmax), {"slopes": {"linear": [0.7, 1.3], "full-math": [1.6, 2.4]}})
    assert outcome.verdict == verdict, outcome
    assert f"linear slope {linear:.2f}" in outcome.ours


# ---- sinks_restore -------------------------------------------------------------------------------------------------

def sinks(error_with: float, dropped_with: float) -> pd.DataFrame:
    return frame([
        row("band(sinks=0, window=256)", variant="band", err_vs_uniform=0.9, dropped_mass=0.5, input_sink_mass=0.1),
        row("band(sinks=4, window=256)", variant="band", err_vs_uniform=error_with, dropped_mass=dropped_with,
            input_sink_mass=0.1),
    ])  # fmt: skip


@pytest.mark.parametrize(
    "error_with, dropped_with, verdict", [(0.5, 0.41, HOLDS), (0.8, 0.48, TREND), (0.95, 0.41, FAILS)]
)
def test_sinks_restore(error_with: float, dropped_with: float, verdict: str) -> None:
    params = {"window": "band(sinks=0, window=256)", "sinks": "band(sinks=4, window=256)"}
    assert CHECKS["sinks_restore"](sinks(error_with, dropped_with), params).verdict == verdict


def recomputed(ratios: list[float]) -> pd.DataFrame:
    """band at windows 256, 512, 1024: cached steps 1 ms, re-computed ones `ratio` ms."""
    rows = []
    for window, ratio in zip((256, 512, 1024), ratios):
        for cached, ms in ((True, 1.0), (False, ratio)):
            hparams = {"window": window, "sinks": 4, "kv_cache": cached}
            rows.append(row(f"band({window},{cached})", variant="band", hparams=hparams, time_median_s=ms / 1e3))
    return frame(rows)


@pytest.mark.parametrize("ratios, verdict", [([5, 20, 80], HOLDS), ([5, 4, 6], TREND), ([0.5, 2, 8], FAILS)])
def test_ratio_rises_along_an_axis(ratios: list[float], verdict: str) -> None:
    params = {"variant": "band", "axis": "window", "slow": {"kv_cache": False}, "fast": {"kv_cache": True}}
    assert CHECKS["ratio_rises_along"](recomputed(ratios), params).verdict == verdict


@pytest.mark.parametrize("mine, verdict", [(0.3, HOLDS), (0.7, TREND), (1.5, FAILS)])
def test_beats_at_equal_budget(mine: float, verdict: str) -> None:
    data = frame([row("h2o(budget=8)", err_vs_uniform=mine), row("band(window=7)", err_vs_uniform=1.2)])
    params = {"method": "h2o(budget=8)", "against": "band(window=7)", "max_error": 0.5}
    assert CHECKS["beats_at_equal_budget"](data, params).verdict == verdict


# ---- the catalogue -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("quick", [False, True], ids=["default", "quick"])
@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
def test_every_claim_is_well_formed(claim, quick: bool) -> None:
    """Its config parses, its check exists, and every label its check compares is a label its sweep makes."""
    assert claim.check in CHECKS
    if claim.generation:  # a generation grid: it parses, and the methods its check compares are among its labels
        from attnbench.generation.grid import parse_grid as parse_generation

        grid = parse_generation(claim.grid_config(quick), source=claim.id)
        labels = {method.label() for method in grid.methods}
        named = {claim.params["method"], *claim.params.get("others", [])}
        assert named <= labels, f"{claim.id}: {sorted(named - labels)} not among {sorted(labels)}"
        assert set(claim.params.get("shares", [])) <= set(grid.keep)
        return
    if claim.grid:  # an MQAR grid: it parses, and the labels its check compares are among its mixers
        from attnbench.recall.grid import parse_grid

        grid = parse_grid(claim.grid_config(quick), source=claim.id)
        assert grid.specs() and not grid.left_out
        labels = {variant.label() for variant in grid.variants}
        assert {claim.params["baseline"], *claim.params["labels"]} <= labels
        return
    if not claim.sweep:
        assert claim.check == "not_transferable" and claim.params["why"]
        return
    config = parse_config(claim.config(quick), source=claim.id)
    labels = {cell.variant.label() for cell in config.plan().cells}  # as results.csv labels them
    from attnbench.registry import registry
    from attnbench.runfolder.rows import Measured

    for side in ("better", "worse"):  # a misspelt key would silently match nothing
        if side in claim.params:
            assert set(claim.params[side]) <= set(registry.load(claim.params["variant"]).hyperparameters)
    assert claim.params.get("metric", "err_vs_uniform") in {f.name for f in fields(Measured)}
    named = set(claim.params.get("published", {})) | {claim.params.get("baseline")} | set(
        claim.params.get("falls_with_k", [])
    ) | set(claim.params.get("slopes", {})) | {claim.params.get("window"), claim.params.get("sinks")} | {
        claim.params.get("method"), claim.params.get("against")}
    assert named - {None} <= labels, f"{claim.id}: {sorted(named - {None} - labels)} not among {sorted(labels)}"
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)


# ---- overtakes_at_long_n -------------------------------------------------------------------------------------------

CROSSOVER = {"baseline": "full", "labels": ["gla", "retnet"], "published_range": (2048, 8192)}


def crossing(gla: list[float], retnet: list[float], coverage: float = 0.96) -> pd.DataFrame:
    """Speedups over full at N = 1024 .. 16384, each with an interval of ±5% of the given coverage."""
    ns = [1024, 2048, 4096, 8192, 16384]
    rows = [row("full", n, speedup=1.0, speedup_low=1.0, speedup_high=1.0, speedup_coverage=coverage) for n in ns]
    for label, speedups in (("gla", gla), ("retnet", retnet)):
        rows += [row(label, n, speedup=s, speedup_low=s * 0.95, speedup_high=s * 1.05, speedup_coverage=coverage)
                 for n, s in zip(ns, speedups)]  # fmt: skip
    return frame(rows)


@pytest.mark.parametrize(
    "gla, retnet, verdict, says",
    [
        ([0.3, 0.6, 1.2, 2.0, 4.0], [0.4, 0.9, 1.5, 3.0, 5.0], HOLDS, "gla from N=4096, retnet from N=4096"),
        ([0.3, 0.6, 0.9, 2.0, 4.0], [0.2, 0.5, 0.8, 0.98, 1.5], TREND, "gla from N=8192, retnet from N=16384"),
        ([0.3, 0.6, 1.2, 0.9, 4.0], [0.4, 0.9, 1.5, 3.0, 5.0], TREND, "gla from N=16384"),  # a dip: from 16K on
        ([0.3, 0.5, 0.6, 0.7, 0.9], [0.4, 0.9, 1.5, 3.0, 5.0], FAILS, "gla never"),
        ([1.2, 1.5, 2.0, 3.0, 4.0], [0.4, 0.9, 1.5, 3.0, 5.0], FAILS, "gla not slower beyond noise at the smallest N"),
        ([0.98, 1.5, 2.0, 3.0, 4.0], [0.4, 0.9, 1.5, 3.0, 5.0], FAILS, "gla not slower beyond noise"),  # a tie
    ],
)
def test_overtakes_at_long_n(gla: list[float], retnet: list[float], verdict: str, says: str) -> None:
    outcome = CHECKS["overtakes_at_long_n"](crossing(gla, retnet), CROSSOVER)
    assert outcome.verdict == verdict, outcome
    assert says in outcome.ours + outcome.detail


def test_an_interval_of_too_few_rounds_overtakes_nothing() -> None:
    """3 rounds give a min–max interval of 75% coverage: no N counts as faster beyond noise."""
    outcome = CHECKS["overtakes_at_long_n"](crossing([0.3, 0.6, 1.2, 2.0, 4.0], [0.4, 0.9, 1.5, 3.0, 5.0], 0.75),
                                            CROSSOVER)  # fmt: skip
    assert outcome.verdict == FAILS and "never faster beyond noise" in outcome.detail


# ---- attention_recalls_others_fall_behind -----------------------------------------------------------------------------

MQAR = {"baseline": "full", "labels": ["linear", "gla"], "solved": 0.99}


def trainings(accuracies: dict[str, dict[tuple[int, int], float]]) -> pd.DataFrame:
    """Three seeds per (label, N, pairs), each at the given accuracy."""
    return frame([{"label": label, "seq_len": n, "pairs": p, "seed": seed, "status": "ok", "reason": "",
                   "accuracy": accuracy} for label, table in accuracies.items() for (n, p), accuracy in table.items()
                  for seed in range(3)])  # fmt: skip


@pytest.mark.parametrize(
    "full, linear, verdict",
    [
        (1.0, (0.9, 0.3), HOLDS),
        (0.95, (0.9, 0.3), TREND),  # every other falls behind, but attention misses the bar somewhere
        (1.0, (0.9, 0.85), FAILS),  # linear does not fall behind
    ],
)
def test_attention_recalls_where_others_fall_behind(full: float, linear: tuple, verdict: str) -> None:
    points = [(64, 4), (64, 64), (256, 4), (256, 64)]
    table = {
        "full": {point: 1.0 for point in points} | {(256, 64): full},
        "linear": {(64, 4): 1.0, (64, 64): 0.5, (256, 4): linear[0], (256, 64): linear[1]},
        "gla": {(64, 4): 1.0, (64, 64): 0.6, (256, 4): 0.95, (256, 64): 0.2},
    }
    outcome = CHECKS["attention_recalls_others_fall_behind"](trainings(table), MQAR)
    assert outcome.verdict == verdict, outcome
    assert "at N=256, 4 → 64 pairs" in outcome.ours


def test_a_failed_training_makes_the_mqar_claim_unrunnable() -> None:
    rows = trainings({"full": {(64, 4): 1.0}, "linear": {(64, 4): 1.0}, "gla": {(64, 4): 1.0}})
    rows.loc[0, ["status", "reason"]] = ["error", "boom"]
    assert CHECKS["attention_recalls_others_fall_behind"](rows, MQAR).verdict == CANNOT
