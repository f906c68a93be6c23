"""What a method costs per generated token inside the model: its layer step timed alone, on the main thread, in turns
with the exact model's step, as the decode mode times variants.

A generation steps its rows together (batched caches, one forward pass for every method), so the time of a forward
pass says little about one method. Here each row's state at one layer (the middle one: past the first layers that
Quest keeps exact; in a hybrid model a global one, and the model's own window step once beside it) is copied after the answer, and the rows take single-row steps in turns, round after round, in a
shuffled order, each from a fresh copy (copied outside the clock): a slow stretch of the machine falls on all of
them alike, and a method's ratio to the exact step is taken within each round. Its time inside attention per token
is that step times its compressed layers, plus the exact step times the layers it keeps exact, plus the window step
times the sliding layers that keep their window. The steps run in the form a generation runs them (`step_form`):
fused (one C call a step where the method has one, `attnbench.kernels`: float32 on the CPU), else eager PyTorch; on
one thread (a one-token step gains nothing from more, and on a busy machine they are
noise); on the rows' device and in their dtype (`placement.Placement`), a GPU's queued work waited for before each
clock read.

b - rows, h - query heads, g - key/value heads, d - head dim, e - value dim
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from attnbench.generation.kept import attend_batched
from attnbench.generation.layers import MethodRows, layer_step
from attnbench.generation.placement import Placement
from attnbench.interface import DecodeState
from attnbench.kernels import unavailable_reason
from attnbench.stats import median_interval

def step_form(placement: Placement) -> str:
    """How the steps run on this placement: "fused" (attnbench.kernels' C steps: float32 on the CPU, where built),
    else "eager" (PyTorch operations one by one)."""
    fused = placement.device == "cpu" and placement.dtype == "float32" and unavailable_reason() is None
    return "fused" if fused else "eager"

ROUNDS = 15
STEPS = 4  # consecutive steps timed together from one copy (a step's time is their mean)


@dataclass(frozen=True)
class StepTime:
    """One row's attention cost per token: its layer step (median over rounds), all layers' estimate, and its ratio
    to the exact model's per token within each round (median and the order-statistic interval)."""

    step_s: float
    attention_s: float
    ratio: float
    low: float
    high: float
    form: str = "eager"  # how the steps ran (`step_form`)


def row_step(rows: MethodRows, layer: int, row: int) -> Callable[[], Callable[[Tensor, Tensor, Tensor], Tensor]]:
    """A maker of fresh single-row steppers of `row` at `layer`: each call copies its state (outside any clock) and
    returns the function that steps the copy through one token q (1, h, 1, d), k, v (1, g, 1, d|e)."""
    state, index = rows.row_states(layer, row)
    if index is not None:  # a row of a batched cache (plain or quantized): its own copy, stepped as the batch steps

        def fresh_batched() -> Callable[[Tensor, Tensor, Tensor], Tensor]:
            mine = state.select_rows([index])
            return lambda q, k, v: attend_batched(mine, q, k, v)

        return fresh_batched
    variant, own = rows.variant_at(row, layer), rows.own_decode(row, layer)

    def fresh_own() -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        mine: list[DecodeState] = [state.clone()]

        def step(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            out, mine[0] = layer_step(variant, mine[0], q, k, v, own)
            return out

        return step

    return fresh_own


def time_rows(rows: MethodRows, exact_row: int, layers: int, shapes: tuple[int, int, int, int],
              rounds: int = ROUNDS, seed: int = 0, placement: Placement = Placement()) -> list[StepTime]:  # fmt: skip
    """Every row's StepTime (in `rows`' order), timed in turns with `exact_row`'s: shapes = (query heads, key/value
    heads, head dim, value dim); `layers` the model's self-attention layers; the steps' inputs on the placement's
    device, in its dtype (the rows' states')."""
    heads, kv_heads, d, e = shapes
    windows = (list(rows.windows) + [None] * layers)[:layers]  # each layer's own window (None: global)
    sliding = [i for i, window in enumerate(windows) if window is not None]  # a hybrid model's own windows
    layer = timed_layer(windows, max(m.dense_layers for m in rows.methods))
    makers = [row_step(rows, layer, row) for row in range(len(rows.methods))]
    if sliding:  # the model's window step, once: every row that keeps the windows pays it in each sliding layer
        makers.append(row_step(rows, sliding[0], exact_row))
    generator = torch.Generator().manual_seed(seed)
    inputs = [tuple(torch.randn(1, h, 1, width, generator=generator).to(placement.device, placement.torch_dtype)
                    for h, width in ((heads, d), (kv_heads, d), (kv_heads, e))) for _ in range(STEPS)]  # fmt: skip
    shuffle = random.Random(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a one-token step gains nothing from threads, and a busy machine's cores make them noise
    try:
        samples = timed_rounds(makers, inputs, rounds, shuffle, placement.synchronize)
    finally:
        torch.set_num_threads(threads)
    exact = samples[exact_row]
    window = samples[-1] if sliding else [0.0] * len(exact)

    def per_token(row: int) -> list[float]:  # each layer's step: the window's, an exact one (dense), or the method's
        kinds = ["window" if rows.keeps_window(row, i) else "exact" if i < rows.methods[row].dense_layers else "mine"
                 for i in range(layers)]  # fmt: skip
        return [kinds.count("window") * w + kinds.count("exact") * full + kinds.count("mine") * mine
                for mine, full, w in zip(samples[row], exact, window)]  # fmt: skip

    reference = per_token(exact_row)
    out = []
    for row in range(len(rows.methods)):
        mine = per_token(row)
        ratios = [cost / base for cost, base in zip(mine, reference)]
        interval = median_interval(ratios)
        out.append(StepTime(statistics.median(samples[row]), statistics.median(mine), interval.estimate,
                            interval.low, interval.high, step_form(placement)))  # fmt: skip
    return out


def timed_layer(windows: list[int | None], dense: int) -> int:
    """The layer whose steps are timed: the middle one, past the layers some method keeps exact (Quest's first two);
    in a hybrid model the first global layer from there (a sliding layer runs the model's window in every row), else
    the last global one."""
    layers = len(windows)
    layer = min(layers - 1, max(layers // 2, dense))
    found = [i for i, window in enumerate(windows) if window is None]
    later = [i for i in found if i >= layer]
    return later[0] if later else (found[-1] if found else layer)


def timed_rounds(makers: list, inputs: list, rounds: int, shuffle: random.Random,
                 synchronize: Callable[[], None] = lambda: None) -> list[list[float]]:  # fmt: skip
    """Each maker's seconds per step, a sample a round (the warm-up round dropped), in a shuffled order each round;
    `synchronize` waits for a device's queued work before each clock read (the copy's, then the steps')."""
    order, samples = list(range(len(makers))), [[] for _ in makers]  # type: list[int], list[list[float]]
    with torch.no_grad():
        for _ in range(rounds + 1):  # the first round warms up and is dropped
            shuffle.shuffle(order)
            for row in order:
                step = makers[row]()
                synchronize()
                started = time.perf_counter()
                for q, k, v in inputs:
                    step(q, k, v)
                synchronize()
                samples[row].append((time.perf_counter() - started) / STEPS)
    return [s[1:] for s in samples]
