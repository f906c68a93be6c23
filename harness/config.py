"""Sweep configuration: TOML presets plus CLI overrides, validated whole, expanded into cells.

Every problem in a config is collected and reported at once, before the first cell runs.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
from attnbench.inputs import validate_input
from attnbench.interface import ALL_DTYPES, VariantError, did_you_mean
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry

PRESETS_DIR = Path(__file__).resolve().parent.parent / "configs"
MODES = ("fwd", "fwd+bwd")
DEVICES = ("cpu", "cuda")


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{source} has {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class VariantSpec:
    """One variant with one point of its hyperparameter grid."""

    name: str
    hparams: tuple[tuple[str, Any], ...] = ()

    def label(self) -> str:
        if not self.hparams:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.hparams)})"


@dataclass(frozen=True)
class InputSpec:
    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def label(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params)})"


@dataclass(frozen=True)
class Cell:
    """One measurement: everything that determines a row of results.csv."""

    variant: VariantSpec
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    dtype: str
    device: str
    causal: bool
    mode: str
    input: InputSpec
    seed: int
    padding: float

    def _setting(self) -> tuple:
        """Everything but the variant, the mode and N."""
        return (self.device, self.dtype, self.causal, self.input, self.seed, self.padding,
                self.batch, self.heads, self.head_dim)  # fmt: skip

    def input_key(self) -> tuple:
        """Cells with equal input keys share Q, K, V and the exact reference."""
        return (*self._setting(), self.seq_len)

    def budget_key(self) -> tuple:
        """Cells that differ only in N: once one is over the time budget, the larger ones are skipped."""
        return (self.variant, self.mode, *self._setting())

    def key(self) -> str:
        """A stable text key for the cell (for matching runs and resuming)."""
        return json.dumps(
            [
                self.variant.name,
                dict(self.variant.hparams),
                self.seq_len,
                self.batch,
                self.heads,
                self.head_dim,
                self.dtype,
                self.device,
                self.causal,
                self.mode,
                self.input.name,
                dict(self.input.params),
                self.seed,
                self.padding,
            ],
            sort_keys=True,
        )


@dataclass
class SweepConfig:
    """A resolved config: scalars where one value applies, lists for sweep axes."""

    name: str = "custom"
    description: str = ""
    variants: list[VariantSpec] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=lambda: [256, 1024])
    batch: list[int] = field(default_factory=lambda: [1])
    heads: list[int] = field(default_factory=lambda: [8])
    head_dim: list[int] = field(default_factory=lambda: [64])
    dtype: list[str] = field(default_factory=lambda: ["float32"])
    device: list[str] = field(default_factory=lambda: ["cpu"])
    causal: list[bool] = field(default_factory=lambda: [False])
    mode: list[str] = field(default_factory=lambda: ["fwd"])
    inputs: list[InputSpec] = field(default_factory=lambda: [InputSpec("gaussian")])
    seeds: list[int] = field(default_factory=lambda: [0])
    padding: float = 0.0
    min_run_time: float = 0.2
    time_budget_s: float = 10.0
    memory_limit_gb: float | None = None
    error: bool = True
    self_check_len: int = 200
    cell_timeout_s: float = 600.0  # with --isolate: a cell's process is killed after this long

    def cells(self) -> list[Cell]:
        """Every cell, ordered so that cells sharing inputs are adjacent and N grows for each variant."""
        cells = [
            Cell(variant, n, b, h, d, dtype, device, causal, mode, inp, seed, self.padding)
            for device, dtype, causal, inp, seed, b, h, d, n, variant, mode in itertools.product(
                self.device,
                self.dtype,
                self.causal,
                self.inputs,
                self.seeds,
                self.batch,
                self.heads,
                self.head_dim,
                sorted(self.seq_lens),
                self.variants,
                self.mode,
            )
        ]
        return cells

    def to_dict(self) -> dict[str, Any]:
        out = {key: value for key, value in vars(self).items() if key not in ("variants", "inputs")}
        out["variants"] = [{"name": v.name, **dict(v.hparams)} for v in self.variants]
        out["inputs"] = [{"name": i.name, **dict(i.params)} for i in self.inputs]
        return out


LIST_AXES = {
    "seq_lens": int,
    "batch": int,
    "heads": int,
    "head_dim": int,
    "dtype": str,
    "device": str,
    "causal": bool,
    "mode": str,
    "seeds": int,
}
SCALARS = {
    "name": str,
    "description": str,
    "padding": float,
    "min_run_time": float,
    "time_budget_s": float,
    "memory_limit_gb": float,
    "error": bool,
    "self_check_len": int,
    "cell_timeout_s": float,
}
KNOWN_KEYS = set(LIST_AXES) | set(SCALARS) | {"variants", "inputs"}


def _type_ok(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _grid(params: dict[str, Any]) -> list[tuple[tuple[str, Any], ...]]:
    """{'w': [1, 2], 'x': 3} -> [(('w', 1), ('x', 3)), (('w', 2), ('x', 3))]."""
    keys = sorted(params)
    values = [_as_list(params[k]) for k in keys]
    return [tuple(zip(keys, combo)) for combo in itertools.product(*values)]


def parse_config(raw: dict[str, Any], *, source: str = "config", registry: Registry = default_registry) -> SweepConfig:
    """Validate a config dict (as read from TOML, overrides applied) and resolve it; ConfigError lists every problem."""
    problems: list[str] = []
    config = SweepConfig()
    raw = {key: value for key, value in raw.items() if value is not None}  # None: "not set" (as meta.json writes it)
    for key in raw:
        if key not in KNOWN_KEYS:
            problems.append(
                f"unknown key '{key}'.{did_you_mean(key, sorted(KNOWN_KEYS))} "
                f"Known keys: {', '.join(sorted(KNOWN_KEYS))}"
            )
    for key, kind in LIST_AXES.items():
        if key in raw:
            values = _as_list(raw[key])
            bad = [v for v in values if not _type_ok(v, kind)]
            if bad or not values:
                problems.append(
                    f"{key}: expected {kind.__name__} or a non-empty list of {kind.__name__}, got {raw[key]!r}"
                )
            else:
                setattr(config, key, values)
    for key, kind in SCALARS.items():
        if key in raw:
            if _type_ok(raw[key], kind):
                setattr(config, key, float(raw[key]) if kind is float else raw[key])
            else:
                problems.append(f"{key}: expected {kind.__name__}, got {raw[key]!r}")

    problems += [f"seq_lens: {n} must be >= 1" for n in config.seq_lens if n < 1]
    problems += [
        f"{axis}: {v} must be >= 1" for axis in ("batch", "heads", "head_dim") for v in getattr(config, axis) if v < 1
    ]
    problems += [f"dtype: unknown '{d}' (known: {', '.join(ALL_DTYPES)})" for d in config.dtype if d not in ALL_DTYPES]
    problems += [
        f"device: unknown '{d}' (known: {', '.join(DEVICES)}, or cuda:N)"
        for d in config.device
        if d not in DEVICES and not d.startswith("cuda:")
    ]
    problems += [f"mode: unknown '{m}' (known: {', '.join(MODES)})" for m in config.mode if m not in MODES]
    if not 0.0 <= config.padding < 1.0:
        problems.append(f"padding: {config.padding} must be a fraction in [0, 1)")
    for key in ("min_run_time", "time_budget_s", "cell_timeout_s"):
        if getattr(config, key) <= 0:
            problems.append(f"{key}: must be > 0, got {getattr(config, key)}")
    if config.memory_limit_gb is not None and config.memory_limit_gb <= 0:
        problems.append(f"memory_limit_gb: must be > 0, got {config.memory_limit_gb}")

    if "inputs" in raw:
        config.inputs = []
        for index, item in enumerate(_as_list(raw["inputs"])):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                problems.append(f"inputs[{index}]: expected a table with a 'name', got {item!r}")
                continue
            params = {k: v for k, v in item.items() if k != "name"}
            problems += [f"inputs[{index}]: {p}" for p in validate_input(item["name"], params)]
            config.inputs.append(InputSpec(item["name"], tuple(sorted(params.items()))))

    config.variants, variant_problems = _parse_variants(raw.get("variants"), registry)
    problems += variant_problems
    if problems:
        raise ConfigError(source, problems)
    return config


def _parse_variants(raw: Any, registry: Registry) -> tuple[list[VariantSpec], list[str]]:
    """`variants` is a list of names, or a table name -> {hyperparameter: value or list of values}."""
    if raw is None:
        return [], [
            "variants: missing; give a list of names or a [variants.NAME] table per variant (see `attnbench list`)"
        ]
    if isinstance(raw, list):  # names, or tables with a "name" (each its own grid)
        entries = [
            (item, {})
            if isinstance(item, str)
            else (item.get("name"), {k: v for k, v in item.items() if k != "name"})
            if isinstance(item, dict)
            else (None, item)
            for item in raw
        ]
    elif isinstance(raw, dict):
        entries = list(raw.items())
    else:
        entries = []
    if not entries:
        return [], [f"variants: expected a non-empty list of names or table of tables, got {raw!r}"]
    specs, problems = [], []
    for name, params in entries:
        if not isinstance(name, str) or not isinstance(params, dict):
            problems.append(f"variants.{name}: expected a table of hyperparameters, got {params!r}")
            continue
        try:
            variant_class = registry.load(name)
        except VariantError as error:
            problems.append(f"variants.{name}: {error}")
            continue
        for point in _grid(params):
            point_problems = variant_class.validate_hyperparams(dict(point))
            problems += [f"variants.{name}: {p}" for p in point_problems]
            if not point_problems:
                specs.append(VariantSpec(name, point))
    return list(dict.fromkeys(specs)), problems


def resolve_config_path(name_or_path: str) -> Path:
    """A TOML path, or the name of a preset in configs/ (quick, default, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    preset = PRESETS_DIR / f"{name_or_path}.toml"
    if preset.is_file():
        return preset
    known = sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))
    raise ConfigError(
        name_or_path,
        [
            f"no such file, and no preset of that name.{did_you_mean(name_or_path, known)} "
            f"Presets: {', '.join(known) or 'none found in ' + str(PRESETS_DIR)}"
        ],
    )


def load_config(
    name_or_path: str, overrides: dict[str, Any] | None = None, *, registry: Registry = default_registry
) -> SweepConfig:
    """Read a preset or TOML file, apply CLI overrides (same keys as the file), validate, resolve."""
    path = resolve_config_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(str(path), [f"not valid TOML: {error}"]) from None
    raw.setdefault("name", path.stem)
    for key, value in (overrides or {}).items():
        if key == "variants" and isinstance(raw.get("variants"), dict):
            # keep the file's grids for the names that stay; defaults for new ones
            value = {name: raw["variants"].get(name, {}) for name in value}
        raw[key] = value
    return parse_config(raw, source=str(path), registry=registry)
