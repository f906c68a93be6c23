"""An MQAR grid: the mixers × sequence lengths × pairs × seeds to train, from a TOML file or a shipped grid, checked
whole before any training (every problem listed at once), and each training's `TrainSpec`.

A grid file has `variants` (as a sweep's: names or tables, a list of values a grid of settings; `blind` is the mixer
that sees no other position, the chance floor), `seq_lens`, `pairs`, `seeds`, and any `TrainSpec` field (d_model,
vocab, max_steps, lr, ...) for every training. A (N, pairs) point the task cannot hold is left out and said.
Shipped grids live in configs/recall/ (`attnbench recall --list`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from attnbench.interface import did_you_mean
from attnbench.plan.cells import VariantSpec
from attnbench.plan.config import ConfigError, name_problem, parse_variants
from attnbench.plan.shipped import grid_descriptions as shipped_descriptions
from attnbench.plan.shipped import grid_files, read_grid_toml
from attnbench.recall.model import BLIND
from attnbench.recall.train import TrainSpec
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry

GRIDS = "recall"  # the folder of shipped grids inside attnbench.configs
DEFAULT_GRID = "mqar"
DESCRIPTIVE = ("name", "description", "measured_run_time")
AXES = ("variants", "seq_lens", "pairs", "seeds")
TRAINING = tuple(f.name for f in fields(TrainSpec) if f.name not in ("variant", "params", "seq_len", "pairs", "seed"))
DEFAULT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class MQARGrid:
    """What one `attnbench recall` trains: every variant × N × pairs × seed that fits, with shared training values."""

    name: str
    variants: tuple[VariantSpec, ...]
    seq_lens: tuple[int, ...]
    pairs: tuple[int, ...]
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    training: tuple[tuple[str, Any], ...] = ()  # TrainSpec fields set for every training
    left_out: tuple[str, ...] = ()  # (N, pairs) points the task cannot hold, in words
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # as read: what meta.json records

    def specs(self) -> list[TrainSpec]:
        """Every training, in the order a person reads the results: by N, pairs, variant, then seed."""
        return [
            TrainSpec(variant.name, variant.params, seq_len=n, pairs=p, seed=seed, **dict(self.training))
            for n in self.seq_lens
            for p in self.pairs
            if fits(n, p, self.training)
            for variant in self.variants
            for seed in self.seeds
        ]


def fits(seq_len: int, pairs: int, training: tuple[tuple[str, Any], ...]) -> bool:
    return _fit_problem(seq_len, pairs, training) is None


def _fit_problem(seq_len: int, pairs: int, training: tuple[tuple[str, Any], ...]) -> str | None:
    try:
        TrainSpec(seq_len=seq_len, pairs=pairs, **dict(training))
    except ValueError as error:
        return f"N={seq_len} × pairs={pairs}: {error}"
    return None


def training_key(spec: TrainSpec) -> str:
    """A stable text key of one training (resume matches trainings by it)."""
    return json.dumps([spec.variant, dict(spec.params), spec.seq_len, spec.pairs, spec.seed], sort_keys=True)


def grid_names() -> list[str]:
    return sorted(grid_files(GRIDS))


def grid_descriptions() -> dict[str, tuple[str, str]]:
    """Shipped grid name -> (its description, its measured run time)."""
    return shipped_descriptions(GRIDS)


def read_grid(name_or_path: str, registry: Registry = default_registry, **overrides: Any) -> MQARGrid:
    """A shipped grid by name or a TOML file, `overrides` (None: not given) applied, checked whole."""
    raw, source = read_grid_toml(name_or_path, GRIDS, "MQAR grid")
    raw = {**raw, **{key: value for key, value in overrides.items() if value is not None}}
    return parse_grid(raw, source, registry)


def _whole_numbers(raw: dict[str, Any], key: str, least: int) -> tuple[tuple[int, ...], list[str]]:
    values = raw.get(key)
    values = values if isinstance(values, list) else [values]
    good = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= least]
    if len(good) != len(values) or not good:
        return (), [f"{key}: expected a whole number >= {least} or a non-empty list of them, got {raw.get(key)!r}"]
    return tuple(dict.fromkeys(good)), []


def parse_grid(raw: dict[str, Any], source: str = "grid", registry: Registry = default_registry) -> MQARGrid:
    """Check a grid's keys and values (ConfigError lists every problem) and resolve it."""
    problems = []
    known = DESCRIPTIVE + AXES + TRAINING
    for key in raw:
        if key not in known:
            problems.append(f"{key}: unknown key (known: {', '.join(known)}).{did_you_mean(key, list(known))}")
    missing = [key for key in ("variants", "seq_lens", "pairs") if key not in raw]
    problems += [f"{key}: missing" for key in missing]
    seq_lens, found = _whole_numbers(raw, "seq_lens", 2) if "seq_lens" in raw else ((), [])
    problems += found
    pairs, found = _whole_numbers(raw, "pairs", 1) if "pairs" in raw else ((), [])
    problems += found
    seeds, found = _whole_numbers(raw, "seeds", 0) if "seeds" in raw else (DEFAULT_SEEDS, [])
    problems += found
    variants, variant_problems = _variants(raw.get("variants"), registry) if "variants" in raw else ((), [])
    problems += variant_problems
    training = {key: raw[key] for key in TRAINING if key in raw}
    problems += _training_problems(training)
    if "variants" in raw and not variants and not variant_problems:
        problems.append("variants: empty; name at least one mixer (see `attnbench list`; `blind` for the chance floor)")
    if (problem := name_problem(str(raw.get("name", "")))) is not None:
        problems.append(f"name: {problem}")
    left_out: list[str] = []
    if not problems:
        items = tuple(sorted(training.items()))
        left_out = [p for n in seq_lens for k in pairs if (p := _fit_problem(n, k, items)) is not None]
        if len(left_out) == len(seq_lens) * len(pairs):
            problems.append(f"no (N, pairs) point fits the task: {'; '.join(left_out)}")
    if problems:
        raise ConfigError(source, problems)
    return MQARGrid(
        str(raw["name"]), variants, seq_lens, pairs, seeds, tuple(sorted(training.items())), tuple(left_out), raw
    )


def _variants(raw: Any, registry: Registry) -> tuple[tuple[VariantSpec, ...], list[str]]:
    """The sweep's variant grammar, `blind` taken out first (it is no registered variant)."""
    items = raw if isinstance(raw, list) else [raw]
    blind = [item for item in items if item == BLIND or (isinstance(item, dict) and item.get("name") == BLIND)]
    rest = [item for item in items if item not in blind]
    problems = [f"variants.{BLIND}: takes no parameters" for item in blind if isinstance(item, dict) and len(item) > 1]
    specs: list[VariantSpec] = []
    if rest:
        specs, found = parse_variants(rest, registry)
        problems += found
        for spec in specs:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
            why = variant.unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False, n_q=64,
                                             n_k=64, backward=True)  # fmt: skip
            if why is not None:
                problems.append(f"variants: {spec.label()} cannot be an MQAR mixer (causal, trained on CPU): {why}")
    return tuple(specs) + ((VariantSpec(BLIND, ()),) if blind else ()), problems


def _training_problems(training: dict[str, Any]) -> list[str]:
    """Type and range of the TrainSpec fields a grid sets."""
    kinds = {f.name: f.type for f in fields(TrainSpec)}
    problems = []
    for key, value in training.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        whole = "int" in str(kinds[key])
        if not number or (whole and not isinstance(value, int)) or not value > 0 and key != "weight_decay":
            kind = "a whole number > 0" if whole else "a number > 0"
            problems.append(f"{key}: expected {kind}, got {value!r}")
        elif key == "weight_decay" and value < 0:
            problems.append(f"{key}: expected a number >= 0, got {value!r}")
    d_model, heads = training.get("d_model", 64), training.get("heads", 1)
    if not problems and d_model % heads:
        problems.append(f"d_model: {d_model} is not a multiple of heads ({heads}): each head takes d_model / heads")
    for key in ("stop_accuracy", "decay_fraction"):
        if not problems and key in training and training[key] > 1:
            problems.append(f"{key}: a share in (0, 1], got {training[key]!r}")
    return problems
