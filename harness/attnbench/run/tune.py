"""`--tune`: each family's key knob searched at each N for the fastest setting within the accuracy budget.

A run answers about the settings it was given; a user asks "which window (which top_k, which budget) may I use".
For each variant setting of the run whose family has a key knob (`KNOBS`: the smaller, the faster and the less
accurate), the knob is searched by bisection over a ladder of powers of two, each probe's error measured on the
inputs the verdict follows (the real heads where the run has them, else `realistic`, else the first input; the
worse of them), the other hyperparameters kept (band(sinks=4) stays with its sinks). The smallest value within the
budget is the family's pick; the picks are then timed in turns with the baseline at that N, as any group is. Every
probe is a row of `tuning.csv` (the knob's curve in the report); the answer is "Use band(sinks=4, window=W): S× at
error E". Bisection assumes error does not grow with the knob: a probe that breaks it is kept and shown, not hidden.

The same rule as the verdict's (`attnbench.report.verdict.with_retrieval`): where the run plants needles that fit the
cell, a second search per setting asks needle recall too (at least `--min-recall`, else `RETRIEVAL_RECALL`: the
retrieval answer, beside the continuation answer of error alone; with `--min-recall` given, that search alone).
Recall grows with the knob as error falls, so one bisection serves.

Its own module: orchestration beside `run.plan_runner`, measuring through `measure.dispatch.measure_group`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Callable

from attnbench.plan.budget import RETRIEVAL_RECALL
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


def needle_inputs(config: SweepConfig, cell: Cell) -> list[InputSpec]:
    """The run's `needles` inputs that can be drawn for this cell (its recall: the least over them)."""
    return [s for s in config.axes["input"] if s.name == "needles"
            and input_unfit(replace(cell, input=s), config.settings.decode_steps) is None]  # fmt: skip


RULES = ("continuation", "retrieval")  # error alone; error and needle recall (the verdict's two answers)


def search_rules(config: SweepConfig, cell: Cell) -> list[tuple[str, float | None]]:
    """The rules the knob is searched under at this cell, each with the needle recall it asks (None: none): error
    alone, and error with recall where needles fit; with `--min-recall` given, only the latter (the verdict's one
    answer then)."""
    if not needle_inputs(config, cell):
        return [(RULES[0], None)]
    asked = config.settings.min_recall
    return [(RULES[1], asked)] if asked is not None else [(RULES[0], None), (RULES[1], RETRIEVAL_RECALL)]


def with_knob(spec: VariantSpec, knob: Knob, value: int) -> VariantSpec:
    return VariantSpec(spec.name, tuple(sorted((*spec.params, (knob.name, value)))))


@dataclass
class Search:
    """One setting's bisection at one N: the ladder, the bounds still open, every probe's worst error."""

    spec: VariantSpec
    knob: Knob
    values: list[int]
    rule: str = RULES[0]
    min_recall: float | None = None  # the needle recall a value needs (the retrieval rule), with the error budget
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

    def within(self, error: float, recall: float, budget: float) -> bool:
        """A probe meets this search's rule: its error within the budget, and its recall where the rule asks one."""
        return error <= budget and (self.min_recall is None or recall >= self.min_recall)

    def record(self, value: int, error: float, budget: float, recall: float = float("nan")) -> None:
        assert self.errors is not None
        self.errors[value] = error
        index = self.values.index(value)
        within = self.within(error, recall, budget)
        if value == self.values[-1] and not within:
            self.low = self.high = index  # nothing on the ladder is within: done
            self.high = -1
            return
        if within:
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
        needles = needle_inputs(config, base)
        n = base.seq_len
        searches = [Search(spec, knob, ladder(knob, n), rule, recall) for spec, knob in settings
                    for rule, recall in search_rules(config, base)]  # fmt: skip
        searches = [s for s in searches if s.values]
        evidence = ", ".join(s.label() for s in inputs)
        unsupported: set[str] = set()
        rules = " and ".join(dict.fromkeys(s.rule for s in searches))
        say(f"tuning at N={n} ({base.mode}{', causal' if base.causal else ''}) on {evidence}, for {rules}: "
            + ", ".join(dict.fromkeys(f"{s.spec.label()} by {s.knob.name}" for s in searches)))  # fmt: skip
        while True:
            probes = {id(s): v for s in searches if (v := s.next_value()) is not None}
            if not probes:
                break
            variants = list(dict.fromkeys(with_knob(s.spec, s.knob, probes[id(s)]) for s in searches if id(s) in probes))
            worst: dict[str, float] = {}
            recall: dict[str, float] = {}
            for spec_input in inputs + needles:  # every probe's recall where needles fit: said beside each pick
                group_cells = tuple(replace(base, input=spec_input, variant=v, compiled=False) for v in variants)
                for row in measure(Group(group_cells, timed=False)).rows:
                    if row.status == "unsupported":  # no form for this cell (a causal one, say): not searched
                        unsupported.add(row.label)
                    if spec_input in needles:  # the least recall over the needle inputs
                        value = row.needle_accuracy if row.status == "ok" and row.needle_accuracy is not None else float("nan")
                        recall[row.label] = min(recall.get(row.label, float("inf")), value) if value == value else float("nan")
                        continue
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
                error, got = worst.get(label, float("nan")), recall.get(label, float("nan"))
                s.record(probes[id(s)], error, budget, got)
                rows.append(_row(base, s, probes[id(s)], label, error, evidence, budget, got))
                said.append(f"{label} {error:.3g}" + (f" (recall {got:.0%})" if got == got else ""))
            if said:
                say(f"N={n}: error vs uniform " + ", ".join(dict.fromkeys(said)))  # progress: each bisection step
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
            row = next(r for r in rows[::-1] if r["label"] == spec.label() and r["seq_len"] == n and r["rule"] == s.rule)
            row.update(pick=True, speedup=speed.estimate if speed else float("nan"),
                       speedup_low=speed.low if speed else float("nan"),
                       speedup_high=speed.high if speed else float("nan"))  # fmt: skip
        keep(rows)
    return rows


def _row(base: Cell, search: Search, value: int, label: str, error: float, evidence: str, budget: float,
         recall: float = float("nan")) -> dict[str, Any]:  # fmt: skip
    return {
        "seq_len": base.seq_len, "mode": base.mode, "causal": base.causal, "setting": search.spec.label(),
        "knob": search.knob.name, "value": value, "label": label, "err_vs_uniform": error,
        "within": search.within(error, recall, budget), "budget": budget, "evidence": evidence, "pick": False,
        "speedup": float("nan"), "speedup_low": float("nan"), "speedup_high": float("nan"), "rule": search.rule,
        "recall": recall, "min_recall": search.min_recall,
    }  # fmt: skip

