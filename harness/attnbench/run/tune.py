"""`--tune`: each family's key knob searched at each N for the fastest setting within the accuracy budget.

A run answers about the settings it was given; a user asks "which window (which top_k, which budget) may I use".
For each variant setting of the run whose family has a key knob (`KNOBS`: the smaller, the faster and the less
accurate), the knob is searched by bisection over a ladder of powers of two, each probe's error measured on the
inputs the verdict follows (the real heads where the run has them, else `realistic`, else the first input; the
worse of them), the other hyperparameters kept (band(sinks=4) stays with its sinks). The smallest value within the
budget is the family's pick; the picks are then timed in turns with the baseline at that N, as any group is. Every
probe is a row of `tuning.csv` (the knob's curve in the report); the answer is "Use band(sinks=4, window=W): S× at
error E". Bisection assumes error does not grow with the knob: a probe that breaks it is kept and shown, not hidden.

Its own module: orchestration beside `run.plan_runner`, measuring through `measure.dispatch.measure_group`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

from attnbench.plan.cells import Cell, Group, InputSpec, VariantSpec
from attnbench.plan.config import SweepConfig
from attnbench.plan.fit import input_unfit


@dataclass(frozen=True)
class Knob:
    """A family's key knob: its hyperparameter, the ladder's smallest value, and its largest at length n."""

    name: str
    smallest: int
    largest: Callable[[int], int]


KNOBS: dict[str, Knob] = {  # variant name -> the knob that trades its speed for accuracy
    "band": Knob("window", 16, lambda n: n // 2),
    "topk": Knob("top_k", 1, lambda n: max(1, n // 128)),  # blocks of 64: up to half the keys
    "h2o": Knob("budget", 32, lambda n: n // 2),
    "snapkv": Knob("budget", 64, lambda n: n // 2),  # above its observation window (32)
    "lsh": Knob("bucket_size", 16, lambda n: n // 4),
    "performer": Knob("features", 16, lambda n: 1024),
    "nystromformer": Knob("landmarks", 8, lambda n: n // 4),
    "linformer": Knob("k", 16, lambda n: n // 2),
}


def ladder(knob: Knob, n: int) -> list[int]:
    """The knob's values tried at length n: powers of two from its smallest to its largest."""
    values, value = [], knob.smallest
    while value <= max(knob.smallest, knob.largest(n)):
        values.append(value)
        value *= 2
    return values


def tuned_settings(config: SweepConfig) -> list[tuple[VariantSpec, Knob]]:
    """The run's settings whose family has a knob, one per setting without its knob (band(window=256) and
    band(window=64) are one search; band(sinks=4, window=256) another)."""
    found: dict[VariantSpec, Knob] = {}
    for spec in config.variants:
        if (knob := KNOBS.get(spec.name)) is not None:
            found.setdefault(VariantSpec(spec.name, tuple(p for p in spec.params if p[0] != knob.name)), knob)
    return list(found.items())


def judging_inputs(config: SweepConfig, cell: Cell) -> list[InputSpec]:
    """The inputs the verdict follows for this cell's setting: the real heads that can be drawn here, else
    `realistic`, else the run's first input."""
    inputs = config.axes["input"]
    real = [s for s in inputs if s.name == "heads" and input_unfit(replace(cell, input=s), config.settings.decode_steps) is None]
    if real:
        return real
    return [s for s in inputs if s.name == "realistic"][:1] or inputs[:1]


def with_knob(spec: VariantSpec, knob: Knob, value: int) -> VariantSpec:
    return VariantSpec(spec.name, tuple(sorted((*spec.params, (knob.name, value)))))


@dataclass
class Search:
    """One setting's bisection at one N: the ladder, the bounds still open, every probe's worst error."""

    spec: VariantSpec
    knob: Knob
    values: list[int]
    low: int = 0
    high: int = -1
    errors: dict[int, float] | None = None

    def __post_init__(self) -> None:
        self.high = len(self.values) - 1
        self.errors = {}

    def next_value(self) -> int | None:
        """The value to probe next (None when the search is done): the largest first (is any within?), then
        the middle of the open range."""
        assert self.errors is not None
        if self.values[-1] not in self.errors:
            return self.values[-1]
        if self.low >= self.high:
            return None
        return self.values[(self.low + self.high) // 2]

    def record(self, value: int, error: float, budget: float) -> None:
        assert self.errors is not None
        self.errors[value] = error
        index = self.values.index(value)
        if value == self.values[-1] and not error <= budget:
            self.low = self.high = index  # nothing on the ladder is within: done
            self.high = -1
            return
        if error <= budget:
            self.high = index
        else:
            self.low = index + 1

    @property
    def pick(self) -> int | None:
        """The smallest value within the budget (None when none is)."""
        assert self.errors is not None
        return self.values[self.high] if self.high >= 0 and self.values[self.high] in self.errors else None


def tune(
    config: SweepConfig,
    cells: list[Cell],
    budget: float,
    measure: Callable[[Group], Any],
    say: Callable[[str], None] = lambda line: print(f"attnbench: {line}", file=sys.stderr, flush=True),
    keep: Callable[[list[dict[str, Any]]], Any] = lambda rows: None,
) -> list[dict[str, Any]]:
    """Every probe and pick as rows of tuning.csv (see the module's docstring). `measure` runs one group and gives
    its `GroupResult`; `cells` are the run's, whose settings (one per setting and N, causal or not) are tuned; `keep`
    is handed every row so far after each step (tuning.csv kept as it grows: a stopped tuning keeps its probes)."""
    from attnbench.stats import paired_speedup

    settings = tuned_settings(config)
    rows: list[dict[str, Any]] = []
    if not settings:
        return rows
    seen: set[tuple] = set()
    bases = []
    for cell in cells:  # one base cell per setting and N: the shape, device, mode the probes share
        key = (cell.timing_key(), cell.seq_len)
        if key not in seen and cell.mode in ("fwd", "decode", "fwd+bwd"):
            seen.add(key)
            bases.append(cell)
    for base in bases:
        inputs = judging_inputs(config, base)
        n = base.seq_len
        searches = [Search(spec, knob, ladder(knob, n)) for spec, knob in settings]
        searches = [s for s in searches if s.values]
        evidence = ", ".join(s.label() for s in inputs)
        unsupported: set[str] = set()
        say(f"tuning at N={n} ({base.mode}{', causal' if base.causal else ''}) on {evidence}: "
            + ", ".join(f"{s.spec.label()} by {s.knob.name}" for s in searches))  # fmt: skip
        while True:
            probes = {id(s): v for s in searches if (v := s.next_value()) is not None}
            if not probes:
                break
            worst: dict[str, float] = {}
            for spec_input in inputs:
                group_cells = tuple(
                    replace(base, input=spec_input, variant=with_knob(s.spec, s.knob, probes[id(s)]), compiled=False)
                    for s in searches if id(s) in probes
                )  # fmt: skip
                for row in measure(Group(group_cells, timed=False)).rows:
                    if row.status == "unsupported":  # no form for this cell (a causal one, say): not searched
                        unsupported.add(row.label)
                    error = row.err_vs_uniform if row.status == "ok" else float("nan")
                    worst[row.label] = max(worst.get(row.label, float("-inf")), error) if error == error else float("nan")
            said = []
            for s in [s for s in searches if id(s) in probes]:
                label = with_knob(s.spec, s.knob, probes[id(s)]).label()
                if label in unsupported:
                    searches.remove(s)
                    say(f"N={n}: {s.spec.label()} has no form for these cells ({base.mode}"
                        f"{', causal' if base.causal else ''}): not searched")  # fmt: skip
                    continue
                error = worst.get(label, float("nan"))
                s.record(probes[id(s)], error, budget)
                rows.append(_row(base, s, probes[id(s)], label, error, evidence, budget))
                said.append(f"{label} {error:.3g}")
            if said:
                say(f"N={n}: error vs uniform " + ", ".join(said))  # progress: each bisection step's probes
            keep(rows)
        picks = [(s, with_knob(s.spec, s.knob, s.pick)) for s in searches if s.pick is not None]
        if not picks:
            say(f"N={n}: no knob value brings a setting within the error budget {budget:g}")
            continue
        baseline = VariantSpec.parse(config.settings.baseline.removesuffix(" compiled"))[0]  # the picks run eager
        say(f"N={n}: timing {', '.join(spec.label() for _, spec in picks)} in turns with {baseline.label()}")
        timed_cells = (replace(base, input=inputs[0], variant=baseline, compiled=False),) + tuple(
            replace(base, input=inputs[0], variant=spec, compiled=False) for _, spec in picks
        )
        result = measure(Group(tuple(dict.fromkeys(timed_cells)), timed=True))
        by_cell = {}
        for key, _, seconds in result.samples:
            by_cell.setdefault(key, []).append(seconds)
        base_key = timed_cells[0].key()
        for s, spec in picks:
            key = replace(base, input=inputs[0], variant=spec, compiled=False).key()
            speed = paired_speedup(by_cell.get(base_key, []), by_cell.get(key, [])) if key in by_cell else None
            row = next(r for r in rows[::-1] if r["label"] == spec.label() and r["seq_len"] == n)
            row.update(pick=True, speedup=speed.estimate if speed else float("nan"),
                       speedup_low=speed.low if speed else float("nan"),
                       speedup_high=speed.high if speed else float("nan"))  # fmt: skip
        keep(rows)
    return rows


def _row(base: Cell, search: Search, value: int, label: str, error: float, evidence: str, budget: float) -> dict[str, Any]:
    return {
        "seq_len": base.seq_len, "mode": base.mode, "causal": base.causal, "setting": search.spec.label(),
        "knob": search.knob.name, "value": value, "label": label, "err_vs_uniform": error,
        "within": bool(error <= budget), "budget": budget, "evidence": evidence, "pick": False,
        "speedup": float("nan"), "speedup_low": float("nan"), "speedup_high": float("nan"),
    }  # fmt: skip

