"""The row schema: one row of results.csv per cell — the cell's axes, then what was measured — and the values of
its enumerated columns."""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from typing import Any

from attnbench.plan.cells import CELL_COLUMNS, Cell

CPU_METHOD = "cpu-allocator-peak"  # every allocation, kernels' scratch included (attnbench.measure.memory)
TENSOR_METHOD = "live-tensor-peak"  # tensor storages alone: the method of CPU figures before 2026-11-26


CUDA_METHOD = "cuda-allocator-peak"


STATUSES = ("ok", "oom", "error", "unsupported", "skipped", "crashed", "timeout")


@dataclass
class Measured:
    """What a cell's row says beyond the cell itself. None where the cell did not get that far."""

    status: str = "ok"
    reason: str = ""
    family: str = ""
    exact: bool = False
    # False: a different operator from softmax (gated linear attention), its error shown but never a reason to use it
    approximates_softmax: bool = True
    host: str = ""  # where it ran: host name and device name
    device_name: str = ""
    node: str = ""  # the Ray node that measured it ("" outside Ray): two nodes on one host told apart
    reruns: str = ""  # why its group was measured again from the start (a Ray node lost mid-group), "" if not
    threads: int | None = None
    load_before: float | None = None  # 1-minute load average before and after the cell's group
    load_after: float | None = None
    cpu_mhz: float | None = None  # mean current CPU frequency during the group, where readable
    noisy: str = ""  # why the cell's timing is not to be trusted alone ("" when it is)
    timed: bool = True  # False: error only; time and memory were measured on the setting's first input
    time_median_s: float | None = None
    time_p10_s: float | None = None
    time_p25_s: float | None = None  # quartiles: the spread bands of the plots
    time_p75_s: float | None = None
    time_p90_s: float | None = None
    time_iqr_s: float | None = None
    time_repeats: int | None = None  # samples (one per round)
    compile_s: float | None = None  # first call minus a timed call: compilation, lazy set-up
    compiled_graphs: int | None = None  # compiled cells: graphs dynamo compiled the call into (1: one whole graph)
    compiled_speedup: float | None = None  # compiled cells: eager twin's time / this time, paired per round
    compiled_speedup_low: float | None = None  # its order-statistic interval, as `speedup`'s
    compiled_speedup_high: float | None = None
    baseline: str = ""  # the group's baseline variant the speedup is measured against
    speedup: float | None = None  # median over rounds of baseline time / this time, same round (paired)
    speedup_low: float | None = None  # distribution-free interval of that median (order statistics of the rounds)
    speedup_high: float | None = None
    speedup_coverage: float | None = None  # the interval's coverage: >= 0.95 from 6 rounds, min–max below
    processes: int | None = None  # --processes k: the worker processes its timing came from (two-level interval)
    peak_mem_bytes: int | None = None  # per call, state kept between calls excluded (attnbench.measure.memory)
    state_mem_bytes: int | None = None  # kept between calls: what a fresh instance's first call leaves behind
    mem_method: str = ""
    tensor_mem_bytes: int | None = None  # CPU: the live tensors' peak alone, without kernels' scratch
    err_rel_fro: float | None = None
    err_max_abs: float | None = None
    err_row_cosine: float | None = None
    err_vs_uniform: float | None = None
    self_check: str = ""  # exact variants: "pass (max err ...)" against their own support_mask
    dropped_mass: float | None = None  # exact-pattern variants: exact attention mass outside their support
    needle_pairs: int | None = None  # input `needles`: key -> value pairs planted, each queried later
    needle_probes: int | None = None  # queries scored: batch * heads * pairs
    needle_accuracy: float | None = None  # share of them whose output is nearest (cosine) to the planted value
    input_entropy: float | None = None  # of exact attention on this cell's inputs: 1 uniform, 0 one-hot
    input_band_mass: float | None = None  # share of exact attention within |i - j| <= 64
    input_sink_mass: float | None = None  # share of exact attention on the first key
    input_head_spread: float | None = None  # std across heads of their mean entropy: how much heads differ
    flops: float | None = None  # the work the call does (its cost model)
    useful_flops: float | None = None  # the work the method needs, where less (the roofline is taken from it)
    bytes_moved: float | None = None  # decode: what one step must read and write (its state's part, q, k, v, out)
    # mode decode (the time columns are then per step, the error that of the steps' outputs)
    decode_steps: int | None = None  # tokens generated after the prompt of N (the steps checked and timed)
    prefill_s: float | None = None  # the prompt's call (its outputs and the state), timed once
    cache_bytes: int | None = None  # what the variant keeps at context N (KV cache, ring, RNN state, metadata)


Row = make_dataclass(
    "Row",
    [("cell_key", str), ("group_key", str)]
    + [(column, Any, None) for column in CELL_COLUMNS]
    + [(f.name, f.type, f.default) for f in fields(Measured)],
    slots=True,  # a misspelt column raises instead of adding an attribute
    namespace={"__doc__": "The CSV schema: the cell's key and columns (from attnbench.plan), then `Measured`."},
)


def row_for(cell: Cell, **measured: Any) -> Any:
    """A row for `cell`; `measured` sets fields of `Measured` by name (an unknown name raises TypeError)."""
    return Row(cell_key=cell.key(), group_key=cell.group_key(), **cell.columns(), **measured)


COLUMNS = [f.name for f in fields(Row)]
