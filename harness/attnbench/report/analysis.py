"""Numbers derived from a run's rows: how time and memory scale with N."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.interface import mode_work
from attnbench.plan.cells import GROUP_COLUMNS
from attnbench.report.modes import mode_of, mode_of_rows
from attnbench.report.text import ratio_text


def loglog_slope(n: pd.Series | list[float], y: pd.Series | list[float]) -> float:
    """Least-squares slope of log(y) against log(N): 1 is linear, 2 quadratic. NaN with fewer than 2 points."""
    points = [(a, b) for a, b in zip(n, y) if a > 0 and b is not None and not math.isnan(b) and b > 0]
    if len(points) < 2:
        return float("nan")
    x, z = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, z, 1)[0])


def scaling_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per variant label: the N range of ok cells and the log-log slopes of median time and of the memory its mode
    weighs (peak per call; decode: the cache)."""
    rows = []
    memory = mode_of_rows(cells).memory
    timed = cells[(cells.status == "ok") & cells.time_median_s.notna()]  # error-only rows have no time
    for label, group in timed.groupby("label", sort=False):
        group = group.sort_values("seq_len")
        rows.append(
            {
                "label": label,
                "n_range": f"{group.seq_len.min()}–{group.seq_len.max()}",
                "points": len(group),
                "time_slope": loglog_slope(group.seq_len, group.time_median_s),
                "noisy": bool((group.noisy.fillna("") != "").any()) if "noisy" in group else False,
                "memory_slope": loglog_slope(group.seq_len, group[memory]),
            }
        )
    return pd.DataFrame(rows)


def crossover(n: list[float], ratio: list[float]) -> tuple[float | None, str]:
    """The N from which `ratio` (variant / baseline, sorted by N) is 1 or below at every larger measured N,
    interpolated in log-log between the last N above 1 and the next.

    Returns (N, description); N is None when the largest N is not below 1. A curve that dips below 1 before
    that point, or below 1 and back up, is "not monotone", and the description says where.
    """
    points = [(a, r) for a, r in zip(n, ratio) if r is not None and not math.isnan(r) and r > 0]
    if not points:
        return None, "no comparable points"
    above = [index for index, (_n, r) in enumerate(points) if r > 1]
    if not above:
        return points[0][0], f"already at N={points[0][0]:g} (smallest swept)"
    last = above[-1]
    earlier = [f"{a:g}" for a, r in points[:last] if r <= 1]
    if last == len(points) - 1:
        if earlier:
            return None, f"not monotone: below 1 at N={', '.join(earlier)}, above at N={points[-1][0]:g}"
        return None, f"not within the swept range (N ≤ {points[-1][0]:g})"
    (n_a, r_a), (n_b, r_b) = points[last], points[last + 1]
    fraction = math.log(r_a) / (math.log(r_a) - math.log(r_b))
    at = math.exp(math.log(n_a) + fraction * (math.log(n_b) - math.log(n_a)))
    note = f"; not monotone: also below 1 at N={', '.join(earlier)}" if earlier else ""
    return at, f"N ≈ {at:,.0f} (between {n_a:g} and {n_b:g}{note})"


def beyond_noise_from(n: list[float], speedup_low: list[float]) -> float | None:
    """The smallest N from which the speedup's interval lies above 1× at every larger measured N (None: not at
    the largest N): where "faster" stops depending on the noise."""
    clear = None
    for a, low in zip(reversed(n), reversed(speedup_low)):
        if low is None or math.isnan(low) or low <= 1:
            break
        clear = a
    return clear


def faster_from(n: list[float], speedup: list[float], speedup_low: list[float]) -> str:
    """The crossover N of the median speedups (`crossover`), with what the intervals add: the N from which it is
    faster beyond noise, where that is not the first N after the crossing, or that it never is."""
    at, text = crossover(n, [1 / s if s else float("nan") for s in speedup])
    if at is None:
        return text
    clear = beyond_noise_from(n, speedup_low)
    first = next((a for a in n if a >= at), None)  # the first measured N on the faster side
    if clear is None:
        return text + "; not faster beyond noise at the largest N (its interval reaches 1×)"
    if clear != first:
        return text + f"; beyond noise from N={clear:g}"
    return text


def crossover_table(cells: pd.DataFrame, baseline: str = "full") -> pd.DataFrame:
    """Per variant label: the N from which it is faster (with what its intervals add), and smaller (in the memory its
    mode weighs), than `baseline`."""
    ok = cells[cells.status == "ok"]
    memory = mode_of_rows(cells).memory
    base = ok[ok.label == baseline].set_index("seq_len")
    rows = []
    for label, group in ok[ok.label != baseline].groupby("label", sort=False):
        group = group.sort_values("seq_len")
        shared = [n for n in group.seq_len if n in base.index]
        if not shared:
            continue
        group = group.set_index("seq_len").loc[shared]
        memory_ratio = (group[memory] / base.loc[shared, memory]).tolist()
        rows.append(
            {
                "label": label,  # speedups paired, measured in turns with the baseline
                "faster_from": faster_from(shared, group.speedup.tolist(), group.speedup_low.tolist()),
                "smaller_from": crossover(shared, memory_ratio)[1],
            }
        )
    return pd.DataFrame(rows)


def efficiency(cells: pd.DataFrame, peaks: dict[str, dict]) -> pd.Series:
    """Achieved FLOP/s (the variant's cost model over its median time) as a fraction of the run's matmul peak."""

    def fraction(row: pd.Series) -> float:
        peak = peaks.get(f"{row['device']}/{row['dtype']}", {}).get("matmul_flops_per_s")  # row.dtype: the Series'
        if not peak or row["status"] != "ok" or not row["time_median_s"] or pd.isna(row["flops"]):
            return float("nan")
        return mode_work(row["mode"]) * row["flops"] / row["time_median_s"] / peak

    return cells.apply(fraction, axis=1) if len(cells) else pd.Series(dtype=float)


def step_bytes(row: pd.Series) -> tuple[float, float]:
    """What a decode step reads and what it writes, in bytes: its `bytes_moved` (the part of its state it reads, the
    token's q, k, v and its output) split, the written part being three token vectors (its output, and the token's
    k and v where a cache grows)."""
    itemsize = 2 if str(row["dtype"]) in ("float16", "bfloat16") else 8 if str(row["dtype"]) == "float64" else 4
    shape = [row.get(column) for column in ("batch", "heads", "head_dim")]
    written = 3 * itemsize * int(math.prod(shape)) if all(pd.notna(x) for x in shape) else 0
    written = min(written, float(row["bytes_moved"]))
    return float(row["bytes_moved"]) - written, written


def step_roofline(row: pd.Series, peak: dict) -> float:
    """A decode step's bandwidth roofline in seconds: what it must read (`step_bytes`) over memory's read bandwidth (a
    stream past the last-level cache), plus what it writes over the write bandwidth.
    Memory's rate even where a state would fit in the last-level cache: timed in turns, a step starts after the other
    variants' steps have run, as a layer's step in a model starts after the other layers' (measured here: `full`'s
    8K step reads 34 GB/s in a loop of its own, 18 GB/s in turns with the decode preset; the memory stream, 25-26).
    A run before read and write bandwidths were measured falls back to the copy peak."""
    copy = peak.get("copy_bytes_per_s")
    read, write = peak.get("read_bytes_per_s") or copy, peak.get("write_bytes_per_s") or copy
    reads, written = step_bytes(row)
    return reads / read + written / write


def read_bandwidth(cells: pd.DataFrame, peaks: dict[str, dict]) -> pd.DataFrame:
    """Each decode row's achieved read bandwidth, `step_read_bytes_per_s` (what its step reads, `step_bytes`, over its
    median time), and `read_share`, that over the machine's measured read bandwidth (a run before it was measured: its
    copy peak). Above 1, the step read from cache. NaN in other modes and where a figure is missing."""

    def rates(row: pd.Series) -> tuple[float, float]:
        peak = peaks.get(f"{row['device']}/{row['dtype']}", {})
        stream = peak.get("read_bytes_per_s") or peak.get("copy_bytes_per_s")
        timed = row["status"] == "ok" and pd.notna(row["time_median_s"]) and row["time_median_s"] > 0
        if not mode_of(row["mode"]).decode or not timed or pd.isna(row.get("bytes_moved")):
            return float("nan"), float("nan")
        rate = step_bytes(row)[0] / row["time_median_s"]
        return rate, rate / stream if stream else float("nan")

    columns = ["step_read_bytes_per_s", "read_share"]
    if cells.empty:
        return pd.DataFrame(columns=columns, index=cells.index, dtype=float)
    return pd.DataFrame(cells.apply(rates, axis=1).tolist(), columns=columns, index=cells.index).astype(float)


def of_roofline(cells: pd.DataFrame, peaks: dict[str, dict]) -> pd.Series:
    """Each cell's share of its roofline, over its median time: 1 is as fast as the work it counts allows on this
    machine; 0.5 takes twice that. NaN where a figure is missing. Far below 1, a speedup measures the implementation
    more than the method. The verdict's "of roofline" column, the report's table and its plot all read this one figure.

    A full-sequence call's roofline is max(FLOPs needed / matmul peak, bytes moved / copy peak), from its cost model
    (`useful_flops`: the method's work, not padding an implementation adds; runs before it: `flops`) and the run's
    peaks; a forward and backward call does `mode_work` times the forward's work. A decode step's is the bandwidth
    roofline alone (`step_roofline`), with no FLOP term (a step does a few FLOPs per byte it reads: memory sets its
    pace)."""

    def share(row: pd.Series) -> float:
        peak = peaks.get(f"{row['device']}/{row['dtype']}", {})
        matmul, copy = peak.get("matmul_flops_per_s"), peak.get("copy_bytes_per_s")
        if not copy or row["status"] != "ok" or pd.isna(row["time_median_s"]) or not row["time_median_s"]:
            return float("nan")
        if pd.isna(row.get("bytes_moved")):
            return float("nan")
        if mode_of(row["mode"]).decode:
            roofline = step_roofline(row, peak)
        else:
            flops = row["useful_flops"] if pd.notna(row.get("useful_flops")) else row.get("flops")
            if not matmul or pd.isna(flops):
                return float("nan")
            roofline = mode_work(row["mode"]) * max(flops / matmul, row["bytes_moved"] / copy)
        return roofline / row["time_median_s"] if roofline > 0 else float("nan")

    return cells.apply(share, axis=1).astype(float) if len(cells) else pd.Series(dtype=float)


def raised_peaks(cells: pd.DataFrame, peaks: dict[str, dict]) -> tuple[dict[str, dict], list[str]]:
    """`peaks` with each device/dtype's matmul peak raised to the highest FLOP/s an ok cell achieved, where that is
    higher (a peak measured low on a busy machine would put efficiencies above 100%), and a note per raise."""
    raised, notes = {key: dict(value) for key, value in peaks.items()}, []
    ok = cells[(cells.status == "ok") & cells.time_median_s.notna() & cells.flops.notna()] if len(cells) else cells
    for key, rows in (ok.groupby([ok["device"], ok["dtype"]]) if len(ok) else []):
        name = f"{key[0]}/{key[1]}"
        measured = raised.get(name, {}).get("matmul_flops_per_s")
        if not measured:
            continue
        rates = rows.flops * rows["mode"].map(mode_work) / rows.time_median_s
        top = rows.loc[rates.idxmax()]
        if rates.max() > measured:
            raised[name]["matmul_flops_per_s"] = float(rates.max())
            notes.append(
                f"{name}: {top['label']} at N={top['seq_len']} reached {rates.max() / 1e9:.1f} GFLOP/s, above the "
                f"measured matmul peak {measured / 1e9:.1f}: the peak is raised to it (efficiencies are shares of it)"
            )
    return raised, notes


ERROR_RESOLUTION = 1e-4  # errors vs uniform below this count as equal (float rounding, not accuracy)


def compile_sentence(cells: pd.DataFrame) -> str:
    """What compiling did, in one sentence: the settings whose compiled call was faster or slower than its eager
    twin beyond noise (the interval of their per-round ratio, timed in turns, clear of 1), with the N where, and
    those that could not be compiled. '' for a run without compiled cells."""
    compiled = cells[cells.compiled.fillna(False).astype(bool)] if "compiled" in cells else cells[:0]
    if compiled.empty:
        return ""
    ok = compiled[(compiled.status == "ok") & compiled.compiled_speedup.notna()]

    # the setting of each figure where the run has several (mode, causal, input, ...): two figures never read alike
    varying = [c for c in GROUP_COLUMNS if c != "seq_len" and c in cells and cells[c].nunique(dropna=False) > 1]

    def listed(rows: pd.DataFrame) -> str:
        by_label: dict[str, list[str]] = {}
        for _, row in rows.sort_values("seq_len").iterrows():
            where = "".join(f", {column} {row[column]}" for column in varying)
            ratio = row.compiled_speedup
            by_label.setdefault(str(row.label), []).append(ratio_text(ratio))
            by_label[str(row.label)][-1] += f" at N={row.seq_len}{where}"
        return "; ".join(f"{label} ({', '.join(dict.fromkeys(at))})" for label, at in by_label.items())

    parts = []
    slower, faster = ok[ok.compiled_speedup_high < 1], ok[ok.compiled_speedup_low > 1]
    if len(slower):
        parts.append(f"slower than eager beyond noise: {listed(slower)}")
    if len(faster):
        parts.append(f"faster than eager beyond noise: {listed(faster)}")
    if len(ok) > len(slower) + len(faster):
        parts.append(f"{len(ok) - len(slower) - len(faster)} compiled cell(s) within noise of eager")
    by_compiler = compiled.reason.astype(str).str.startswith("torch.compile")  # not those eager refuses too
    refused = compiled[(compiled.status == "unsupported") & by_compiler]
    if len(refused):
        parts.append(f"not compiled: {', '.join(dict.fromkeys(refused.label))} (see their reasons)")
    if not parts:
        return "Compiled: no compiled cell was timed beside its eager twin."
    return "Compiled (eager time / compiled time, per round, in turns): " + "; ".join(parts) + "."


SERIES = ("label", "input", "device", "dtype", "mode", "causal", "seed", "padding", "batch", "heads", "head_dim",
          "value_dim", "kv_len", "compiled")  # a variant setting's cells on one input that differ only in N
IMPLAUSIBLE = 1.5  # beyond the spreads by this factor: more than a change of code path or cache explains
STEEPEST = 2.0  # no attention costs more than quadratically in N (the exact one is quadratic; decode, linear)


@dataclass(frozen=True)
class Implausible:
    """Two groups of one variant setting whose timings contradict each other: one of them ran on a changed machine
    (a resume under load timed a whole group 3-6x slow), and nothing can say which."""

    label: str
    short: int  # the shorter N
    long: int
    phrase: str  # "band at N=4096 (90 ms) slower than at N=8192 (40 ms)"


def implausible_timings(frame: pd.DataFrame) -> list[Implausible]:
    """Neighbouring N of one variant setting timed beyond what attention can do, past both spreads: the shorter N
    slower (its p10 over IMPLAUSIBLE x the longer's p90), or the longer slower than quadratic growth allows (its p10
    over IMPLAUSIBLE x (N'/N)^2 x the shorter's p90): a step change of the machine between their groups."""
    timed = frame[(frame.status == "ok") & frame.time_median_s.notna() & frame.time_p10_s.notna()]
    keys = [column for column in SERIES if column in timed.columns]
    found = []
    for _, series in timed.groupby(keys, dropna=False, sort=False):
        by_n = series.groupby("seq_len").agg(p10=("time_p10_s", "min"), p90=("time_p90_s", "max"),
                                             mid=("time_median_s", "median")).sort_index()  # fmt: skip
        ns = list(by_n.index)
        label = str(series.label.iloc[0])
        for short, long in zip(ns, ns[1:]):
            at = {n: f"N={n} ({1e3 * by_n.mid[n]:.3g} ms)" for n in (short, long)}
            steepest = IMPLAUSIBLE * (long / short) ** STEEPEST
            if by_n.p10[short] > IMPLAUSIBLE * by_n.p90[long]:
                phrase = f"{label} at {at[short]} slower than at {at[long]}"
            elif by_n.p10[long] > steepest * by_n.p90[short]:
                ratio = by_n.mid[long] / by_n.mid[short]
                phrase = f"{label} at {at[long]} {ratio:.3g}× its time at {at[short]}, beyond quadratic growth"
            else:
                continue
            found.append(Implausible(label, int(short), int(long), phrase))
    return found
