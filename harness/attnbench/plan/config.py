"""Sweep configuration: TOML presets plus CLI overrides, validated whole into a plan of cells.

Every problem in a config is collected and reported at once, before the first cell runs. The sweep axes
and their keys come from `attnbench.plan`; the other keys are the measurement `Settings`.
"""

from __future__ import annotations

import difflib

from collections import Counter

import itertools
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence, get_type_hints

import tomllib

from attnbench.paper_names import ALIASES as PAPER_NAMES
from attnbench.paper_names import download_refusal
from attnbench.inputs.captured import captured_fit_problems
from attnbench.inputs.heads_cache import uncaptured_heads
from attnbench.inputs.catalogue import DISTRIBUTIONS, split_needle_params, validate_input
from attnbench.interface import ALL_DTYPES, VariantError, did_you_mean
from attnbench.plan.also import ALSO, differing, further_sweeps, narrowed, union
from attnbench.plan.budget import DEFAULT_MAX_ERROR, budget_problems
from attnbench.plan.cells import AXES, InputSpec, Plan, Spec, VariantSpec, compiled_label, expand, groups_of
from attnbench.plan.devices import by_devices, causal_forms
from attnbench.plan.fit import causal_only_input, heads_head_dims, input_unfit
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry

PRESETS = "attnbench.configs"  # configs/ in the source tree, package data in a wheel
MODES = ("fwd", "fwd+bwd", "decode")
DEVICES = ("cpu", "cuda")
ALIASES = {  # common spellings of an enumerated value -> the one attnbench takes (suggested, never replaced)
    "dtype": {"fp16": "float16", "half": "float16", "f16": "float16", "bf16": "bfloat16", "fp32": "float32",
              "f32": "float32", "float": "float32", "single": "float32", "fp64": "float64", "f64": "float64",
              "double": "float64"},
    "mode": {"forward": "fwd", "bwd": "fwd+bwd", "backward": "fwd+bwd", "train": "fwd+bwd", "generate": "decode",
             "generation": "decode", "step": "decode"},
    "device": {"gpu": "cuda"},
}  # fmt: skip


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem, those of command-line flags apart from the
    file's (a flag's problem begins with its name, `--variants: ...`)."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        flagged = [p for p in problems if p.startswith("--")]
        own = [p for p in problems if not p.startswith("--")]
        parts = [(what, listed) for what, listed in (("the command line", flagged), (source, own)) if listed]
        super().__init__(
            "\n".join(
                f"{what} has {len(listed)} problem(s):\n" + "\n".join(f"  - {p}" for p in listed)
                for what, listed in parts
            )
        )


@dataclass(frozen=True)
class Settings:
    """How cells are measured: everything in a config that is not a sweep axis."""

    min_run_time: float = 0.2  # seconds of timing per cell, at least (in turns with its group)
    min_rounds: int = 9  # rounds of turns at least, paired with the baseline: 9 gives a 96% order-statistic
    # interval of the median speedup without its two extremes (5 could only give min–max, 93.8%)
    baseline: str = "full"  # the variant every speedup in a group is measured against, round by round
    threads: int = 0  # torch threads; 0: fitted to the idle cores before each timed group (recorded in every row)
    time_budget_s: float = 10.0  # median seconds per call above which larger N are skipped
    memory_limit_gb: float | None = None  # default: 80% of available memory
    error: bool = True  # error against float64 exact attention
    time_every_input: bool = False  # False: each setting timed on its first input, error measured on every input
    self_check_len: int = 200
    cell_timeout_s: float = 600.0  # with --isolate: a step with no progress for this long is killed
    processes: int = 1  # each group measured in this many fresh worker processes, merged (attnbench.run.processes)
    max_error: float = DEFAULT_MAX_ERROR  # the verdict's accuracy budget on error vs uniform (attnbench.plan.budget)
    min_speedup: float | None = None  # the verdict also answers: the least error among variants at least this × faster
    min_recall: float | None = None  # the verdict leaves out variants retrieving fewer of the needles (input `needles`)
    decode_steps: int = 16  # mode decode: tokens generated after each prompt of N (the steps timed and checked)
    tune: bool = False  # after the sweep, search each family's key knob for the fastest setting within the budget


SETTING_KINDS: dict[str, type] = {  # key -> type, read from the declaration (`float | None` -> float)
    name: next(t for t in getattr(hint, "__args__", (hint,)) if t is not type(None))
    for name, hint in get_type_hints(Settings).items()
}


@dataclass
class SweepConfig:
    """A resolved config: each axis's values (cell field -> list) and the measurement settings."""

    name: str = "custom"
    description: str = ""
    axes: dict[str, list[Any]] = field(default_factory=lambda: {name: list(d) for name, _, d in AXES.values()})
    settings: Settings = field(default_factory=Settings)
    overrides: dict[str, Any] = field(default_factory=dict)  # what the command line changed in the file or preset
    notes: list[str] = field(default_factory=list)  # what was left out and why, said as the run starts
    # with [[also]] tables (attnbench.plan.also): each sweep's own axes, the file's first; `axes` is then their union
    sweeps: list[dict[str, list[Any]]] = field(default_factory=list)

    @property
    def variants(self) -> list[VariantSpec]:
        return self.axes["variant"]

    @property
    def seq_lens(self) -> list[int]:
        return self.axes["seq_len"]

    def plan(self) -> Plan:
        """The cells and comparison groups, expanded once: a run takes this and hands it along. Each sweep is its
        own cross product (a cell two sweeps list runs once); the cells of a causal decoder's heads are planned for
        causal cells only, and a sweep with causal cells says how many of its non-causal ones that leaves out."""
        sweeps = self.sweeps or [self.axes]
        listed = sum(math.prod(len(values) for values in axes.values()) for axes in sweeps)
        expanded = [expand(axes) for axes in sweeps]
        duplicates = listed - sum(len(cells) for cells in expanded)  # listed twice within one sweep
        said = {cell for cells in expanded if any(cell.causal for cell in cells) for cell in cells
                if not cell.causal and causal_only_input(cell.input)}  # fmt: skip
        notes = [f"input {label} is drawn from a causal decoder's heads: for the causal cells only ({count} "
                 "non-causal cells not planned)"
                 for label, count in Counter(cell.input.label() for cell in said).items()]  # fmt: skip
        cells = list(dict.fromkeys(itertools.chain.from_iterable(expanded)))
        cells = [cell for cell in cells if cell.causal or not causal_only_input(cell.input)]
        every = self.settings.time_every_input or not self.settings.error  # without error, every input is timed
        drawable = [cell for cell in cells if input_unfit(cell, self.settings.decode_steps) is None]
        groups = groups_of(cells, time_every_input=every, drawable=set(drawable))
        return Plan(cells, groups, duplicates=duplicates, notes=notes)

    def to_dict(self) -> dict[str, Any]:
        """The config as a TOML-like dict that `parse_config` reads back to the same config: the file's sweep,
        its settings, and each further sweep as the `also` table of the axes it changes."""
        base, *further = self.sweeps or [self.axes]
        out: dict[str, Any] = {"name": self.name, "description": self.description, **_axes_dict(base)}
        out.update(asdict(self.settings))
        if further:
            out[ALSO] = [_axes_dict(differing(base, axes)) for axes in further]
        return out

    def to_toml(self) -> str:
        """The resolved config as a TOML file that `attnbench run FILE` runs again (overrides applied)."""
        values = self.to_dict()
        lines = [
            f"# {self.name}" + (f" with {overrides_text(self.overrides)}" if self.overrides else "") + ", resolved"
        ]
        further = values.pop(ALSO, [])
        lines += _toml_tables(values)
        for sweep in further:
            lines += ["", f"[[{ALSO}]]"] + _toml_tables(sweep, f"{ALSO}.")
        return "\n".join(lines) + "\n"


def _axes_dict(axes: dict[str, list[Any]]) -> dict[str, Any]:
    """Axes (cell field -> values) as config keys, specs as tables: `variants = [{name = "band", window = 64}]`."""
    out: dict[str, Any] = {}
    for key, (name, kind, _) in AXES.items():
        if name in axes:
            values = axes[name]
            out[key] = [{"name": s.name, **dict(s.params)} for s in values] if kind is Spec else list(values)
    return out


def _toml_tables(values: dict[str, Any], prefix: str = "") -> list[str]:
    """TOML lines for a config's keys: plain values first, then its inputs and variants as arrays of tables."""
    tables = {key: values.pop(key) for key in ("inputs", "variants") if key in values}
    lines = [f"{key} = {toml_value(value)}" for key, value in values.items() if value is not None]
    for key, entries in tables.items():
        for entry in entries:
            lines += ["", f"[[{prefix}{key}]]"] + [f"{k} = {toml_value(v)}" for k, v in entry.items() if v is not None]
    return lines


def suggest(value: Any, known: Sequence[str], aliases: dict[str, str] | None = None) -> str:
    """' Did you mean: float16?' for a misspelt, differently cased or aliased value (cdua, CUDA, fp16), else ''."""
    if not isinstance(value, str):
        return ""
    word = value.strip().lower().removeprefix("torch.")
    alias = (aliases or {}).get(word, word if word in known else None)
    return f" Did you mean: {alias}?" if alias else did_you_mean(word, list(known))


def overrides_text(overrides: dict[str, Any]) -> str:
    """'seq_lens = [512], causal = [true]': what the command line changed, in the config's own words."""
    return ", ".join(f"{key} = {toml_value(value)}" for key, value in overrides.items())


def toml_value(value: Any) -> str:
    """A TOML literal for a value of a config (strings, numbers, booleans, lists and tables of them)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if value == value and abs(value) != float("inf") else ("nan" if value != value else "inf")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


DESCRIPTIVE_KEYS = ("name", "description", "measured_run_time")  # words about a config, not how it runs
KNOWN_KEYS = set(AXES) | set(SETTING_KINDS) | set(DESCRIPTIVE_KEYS) | {ALSO}  # [[also]]: attnbench.plan.also


MAX_NAME_LENGTH = 100  # run folders are named <time>-<name>: file systems allow 255 bytes a name


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a run folder (None when it can): a plain file name, no path, not too long."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or any(ord(c) < 32 for c in name):
        return (
            f"{name!r} must be a plain file name (it names the run folder): no '/', no '..', no control characters "
            "(a newline), not empty"
        )
    if len(name.encode()) > MAX_NAME_LENGTH:
        return f"{len(name.encode())} bytes long; at most {MAX_NAME_LENGTH} (it names the run folder)"
    return None


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


def parse_config(
    raw: dict[str, Any],
    *,
    source: str = "config",
    registry: Registry = default_registry,
    cluster: bool = False,
    flags: dict[str, str] | None = None,
) -> SweepConfig:
    """Validate a config dict (as read from TOML, overrides applied) and resolve it; ConfigError lists every problem.
    With `cluster` (a Ray run) CUDA is not required here, but `cuda:N` is refused: Ray hands each task one GPU.
    `flags` maps the keys the command line set to their flags as typed (`seq_lens` -> `--seq-lens 4096`): their
    problems name the flag, not the file; a problem of several keys names every flag among them."""
    flags = flags or {}

    def at(key: str) -> str:  # one key's problem: the flag's name (`--seq-lens`), else the key
        return flags[key].split(" ", 1)[0] if key in flags else key

    by = Blame(flags)

    problems: list[str] = []
    config = SweepConfig()
    raw = {key: value for key, value in raw.items() if value is not None}  # None: "not set" (as meta.json writes it)
    for key in raw:
        if key not in KNOWN_KEYS:
            problems.append(
                f"unknown key '{key}'.{did_you_mean(key, sorted(KNOWN_KEYS))} "
                f"Known keys: {', '.join(sorted(KNOWN_KEYS))}"
            )
    for key in DESCRIPTIVE_KEYS:
        if key in raw and not isinstance(raw[key], str):
            problems.append(f"{key}: expected str, got {raw[key]!r}")
        elif key in ("name", "description") and key in raw:
            setattr(config, key, raw[key])
    if isinstance(raw.get("name"), str) and (problem := name_problem(raw["name"])):
        problems.append(f"name: {problem}")
    for key, (name, kind, _) in AXES.items():
        if key not in raw or kind in (VariantSpec, InputSpec):
            continue
        values = _as_list(raw[key])
        if not values or any(not _type_ok(v, kind) for v in values):
            problems.append(
                f"{at(key)}: expected {kind.__name__} or a non-empty list of {kind.__name__}, got {raw[key]!r}"
            )
        else:
            config.axes[name] = [float(v) if kind is float else v for v in values]
    settings = {}
    for key, kind in SETTING_KINDS.items():
        if key in raw:
            if _type_ok(raw[key], kind):
                settings[key] = float(raw[key]) if kind is float else raw[key]
            else:
                problems.append(f"{at(key)}: expected {kind.__name__}, got {raw[key]!r}")
    config.settings = Settings(**settings)
    problems += _axis_problems(config.axes, at, by) + _setting_problems(config.settings, at)

    dropped: list[tuple[str, str, dict[str, Any]]] = []  # inputs of heads never captured here

    def input_at(index: int, spec: InputSpec) -> str:
        """`inputs[1]` in a file; `--inputs: heads(text=code)` on the command line."""
        return f"{at('inputs')}: {spec.label()}" if "inputs" in flags else f"inputs[{index}]"

    if "inputs" in raw:
        config.axes["input"] = []
        for index, item in enumerate(_as_list(raw["inputs"])):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                problems.append(f"inputs[{index}]: expected a table with a 'name', got {item!r}")
                continue
            params = {k: v for k, v in item.items() if k != "name"}
            spec = InputSpec(item["name"], tuple(sorted(params.items())))
            if note := uncaptured_heads(item["name"], params):  # the default model's heads, not captured here
                if note not in config.notes and True in config.axes["causal"]:  # a non-causal run never draws them
                    config.notes.append(note)
                dropped.append((input_at(index, spec), item["name"], params))
                continue
            problems += [f"{input_at(index, spec)}: {p}" for p in validate_input(item["name"], params)]
            config.axes["input"].append(spec)

    if ("inputs" in flags or "head_dim" not in raw) and "head_dim" not in flags:  # real heads fix the head_dim
        config.notes += _heads_head_dim(config.axes, heads_head_dims(config.axes["input"]), "inputs" in flags)
    config.axes["variant"], variant_problems = parse_variants(raw.get("variants"), registry, at("variants"))
    problems += variant_problems
    on_devices = by_devices(config.axes["variant"], config.axes["device"], registry,  # no `unsupported` rows
                            flag=at("variants") if "variants" in flags else None)  # fmt: skip
    config.axes["variant"], problems = on_devices.kept, problems + on_devices.problems
    config.notes += [on_devices.note] if on_devices.note else []
    if "variants" not in flags:  # named on the command line: each cell says why it cannot run
        causal_only = causal_forms(config.axes["variant"], config.axes["causal"], registry)
        config.axes["variant"] = causal_only.kept
        config.notes += [causal_only.note] if causal_only.note else []
    compiled = list(dict.fromkeys(config.axes["compiled"]))
    labels = [compiled_label(spec.label(), c) for spec in config.axes["variant"] for c in compiled]
    if "baseline" not in raw and False not in compiled:  # compiled alone: speedups against the compiled baseline
        config.settings = replace(config.settings, baseline=compiled_label(config.settings.baseline, True))
    # the default baseline may be absent (no speedups then); one asked for by name must be there
    defaults = (Settings().baseline, compiled_label(Settings().baseline, True))
    if config.settings.baseline not in defaults and config.settings.baseline not in labels and labels:
        problems.append(
            f"{by('baseline', 'variants', 'compile')}: '{config.settings.baseline}' is not one of this run's variant "
            f"settings ({', '.join(labels)}); speedups are measured against it, so name one of them."
            + did_you_mean(config.settings.baseline, labels)
        )
    if "inputs" in raw and not config.axes["input"] and dropped:  # nothing left to run on: say why, not "empty"
        problems += [f"{where}: {p}" for where, name, params in dropped for p in validate_input(name, params)]
    elif "inputs" in raw and not config.axes["input"]:
        problems.append("inputs: an empty list gives no cell; give at least one [[inputs]] table")
    if config.axes["input"] and config.axes["seq_len"] and config.axes["kv_len"]:
        problems += _machine_problems(config.axes, cluster, at, config.settings.decode_steps, by)  # all at once
    if config.settings.min_recall is not None and not any(s.name == "needles" for s in config.axes["input"]):
        add = ("name needles in --inputs (e.g. --inputs 'realistic,needles(pairs=16)')" if "inputs" in flags
               else 'add [[inputs]] name = "needles"')  # fmt: skip
        problems.append(f"{by('min_recall', 'inputs')}: recall is measured on the input `needles`: {add}")
    problems += _decode_only_problems(config.axes, registry, by)  # refused now, not as unsupported cells
    if ALSO in raw:  # further sweeps, each parsed as the file with its table's axes replaced
        def parse(table: dict[str, Any]) -> SweepConfig:
            return parse_config(table, source=source, registry=registry, cluster=cluster, flags=flags)

        sweeps, notes, also_problems = further_sweeps(raw, flags, parse, problems)
        config.sweeps = [config.axes]
        config.sweeps += [axes for index, axes in enumerate(sweeps) if axes not in [config.axes, *sweeps[:index]]]
        config.axes, problems = union(config.sweeps), problems + also_problems
        config.notes += [note for note in notes if note not in config.notes]
    if problems:
        raise ConfigError(source, problems)
    return config


def _heads_head_dim(axes: dict[str, list[Any]], dims: dict[int, list[str]], flagged: bool) -> list[str]:
    """A run drawing a model's captured heads (`--inputs 'heads(model=Gemma-3-270M)'`, or a config that sets no
    head_dim) takes that model's head_dim for every cell: the config's is the synthetic inputs' shape, and a head of
    another width is not the model's. The note that says so, when it changes the config's."""
    if not dims or sorted(dims) == sorted(axes["head_dim"]):
        return []
    was, axes["head_dim"] = axes["head_dim"], sorted(dims)
    whose = "; ".join(f"{dim} for {', '.join(labels)}" for dim, labels in sorted(dims.items()))
    given = "--inputs" if flagged else "the config sets no head_dim"
    return [f"head_dim {', '.join(map(str, sorted(dims)))} (was {', '.join(map(str, was))}): the real heads the run "
            f"draws have it ({whose}; {given}), and every input of the run is drawn at it"]  # fmt: skip


def _axis_problems(axes: dict[str, list[Any]], at: Callable[[str], str], by: Blame) -> list[str]:
    problems = [f"{at('seq_lens')}: {n} must be >= 1" for n in axes["seq_len"] if n < 1]
    problems += [f"{at('kv_lens')}: {n} must be >= 0 (0: equal to N)" for n in axes["kv_len"] if n < 0]
    problems += [f"{at('value_dim')}: {n} must be >= 0 (0: equal to head_dim)" for n in axes["value_dim"] if n < 0]
    problems += [
        f"{at(axis)}: {v} must be >= 1" for axis in ("batch", "heads", "head_dim") for v in axes[axis] if v < 1
    ]
    problems += [_unknown(at("dtype"), d, ALL_DTYPES, ALIASES["dtype"]) for d in axes["dtype"] if d not in ALL_DTYPES]
    problems += [
        _unknown(at("device"), d, DEVICES, ALIASES["device"], ", or cuda:N")
        for d in axes["device"]
        if d not in DEVICES and not re.fullmatch(r"cuda:\d+", d)
    ]
    problems += [_unknown(at("mode"), m, MODES, ALIASES["mode"]) for m in axes["mode"] if m not in MODES]
    if "decode" in axes["mode"] and False in axes["causal"]:
        fix = "use --causal true" if by.flagged("mode", "causal") else "set causal = true"
        problems.append(f"{by('mode', 'causal')}: decode is generation, causal only: {fix} (a sweep with "
                        "non-causal cells too runs decode in a run of its own)")  # fmt: skip
    if "decode" in axes["mode"] and any(p > 0 for p in axes["padding"]):
        problems.append(f"{by('mode', 'padding')}: decode generates one sequence per batch row: leave padding at 0")
    if "decode" in axes["mode"] and any(n for n in axes["kv_len"]):
        problems.append(f"{by('mode', 'kv_lens')}: decode attends over the context itself: leave kv_lens at 0")
    problems += [f"{at('padding')}: {p} must be a fraction in [0, 1)" for p in axes["padding"] if not 0.0 <= p < 1.0]
    problems += [
        f"{at('seeds')}: must be between 0 and 2^63 - 1 (torch's generator seeds), got {seed}"
        for seed in axes["seed"]
        if not 0 <= seed < 2**63
    ]
    return problems


@dataclass(frozen=True)
class Blame:
    """Who set the keys a problem is about, for its message: every command-line flag among them as typed
    (`--causal false`), or, when the file set them all, the first key (`mode`)."""

    flags: dict[str, str]  # key -> the flag that set it, as typed

    def flagged(self, *keys: str) -> bool:
        return any(key in self.flags for key in keys)

    def __call__(self, *keys: str) -> str:
        typed = [self.flags[key] for key in keys if key in self.flags]
        return ", ".join(dict.fromkeys(typed)) if typed else keys[0]


def _unknown(where: str, value: str, known: Sequence[str], aliases: dict[str, str], more: str = "") -> str:
    """`dtype: unknown 'fp16' (known: float64, ...). Did you mean: float16?`"""
    hint = suggest(value, known, aliases)
    return f"{where}: unknown '{value}' (known: {', '.join(known)}{more})" + (f".{hint}" if hint else "")


MAX_PROCESSES = 16  # --processes: worker processes per group
MAX_RUN_TIME_S = 86400.0  # min_run_time beyond a day per cell is a typo, not a plan
MAX_THREADS_PER_CORE = 4  # torch threads beyond this many per core only oversubscribe (and 10^5 crash torch)


def _setting_problems(s: Settings, at: Callable[[str], str]) -> list[str]:
    positive = ("min_run_time", "time_budget_s", "cell_timeout_s")
    problems = [
        f"{at(key)}: must be a finite number > 0, got {getattr(s, key)}"
        for key in positive
        if not 0 < getattr(s, key) < math.inf  # NaN fails too: a budget or timing length that never ends is refused
    ]
    if 0 < s.min_run_time < math.inf and s.min_run_time > MAX_RUN_TIME_S:  # 1e308 is finite and never ends
        limit = f"must be at most {MAX_RUN_TIME_S:g} s per cell (a day)"
        problems.append(f"{at('min_run_time')}: {limit}, got {s.min_run_time:g}")
    if s.decode_steps < 1:
        problems.append(f"{at('decode_steps')}: must be >= 1 (tokens generated after each prompt), got {s.decode_steps}")
    if s.min_rounds < 2:
        problems.append(f"{at('min_rounds')}: must be >= 2 (a spread needs samples), got {s.min_rounds}")
    most = MAX_THREADS_PER_CORE * (os.cpu_count() or 1)
    if not 0 <= s.threads <= most:
        problems.append(
            f"{at('threads')}: must be between 0 (fitted to the idle cores) and {most} ({MAX_THREADS_PER_CORE} per core of "
            f"this machine), got {s.threads}"
        )
    if s.memory_limit_gb is not None and not 0 < s.memory_limit_gb < math.inf:
        problems.append(f"{at('memory_limit_gb')}: must be a finite number > 0, got {s.memory_limit_gb}")
    if not 1 <= s.processes <= MAX_PROCESSES:
        problems.append(f"{at('processes')}: must be between 1 and {MAX_PROCESSES}, got {s.processes}")
    if s.self_check_len < 2:
        problems.append(f"{at('self_check_len')}: must be >= 2 (the self-check needs a sequence), got {s.self_check_len}")
    return problems + budget_problems(s.max_error, s.min_speedup, at, s.min_recall)


def paper_name_hint(name: str) -> str:
    """' quest is a paper's name …' where an unknown variant is (or is near) a paper's name that `attnbench generate`
    takes (`attnbench.paper_names`): here the variant's own setting is given instead; '' otherwise."""
    if (refusal := download_refusal(name)) is not None:
        return f" ({refusal.split(': ', 1)[1]})"
    near = name if name in PAPER_NAMES else next(iter(difflib.get_close_matches(name, list(PAPER_NAMES), n=1)), None)
    if near is None:
        return ""
    setting = ", ".join(f"{k}={v}" for k, v in PAPER_NAMES[near].items() if k not in ("name", "dense_layers"))
    said = f"did you mean {near}? It is" if near != name else f"{near} is"
    return f" ({said} a paper's name that `attnbench generate` takes; here give its variant: {PAPER_NAMES[near]['name']}({setting}))"


def parse_variants(raw: Any, registry: Registry, where: str = "variants") -> tuple[list[VariantSpec], list[str]]:
    """`variants` is a list of names, or a table name -> {hyperparameter: value or list of values}. `where` is
    how problems name it: `variants` (a problem then names `variants.NAME`) or the flag that set it."""
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
        return [], [f"{where}: expected a non-empty list of names or table of tables, got {raw!r}"]

    def named(name: Any, point: tuple[tuple[str, Any], ...] | None = None) -> str:
        """`variants.band` in a file; `--variants: band(window=-1)` on the command line."""
        if where == "variants":
            return f"variants.{name}"
        return where if point is None else f"{where}: {VariantSpec(name, point).label()}"

    specs, problems = [], []
    for index, (name, params) in enumerate(entries):
        if isinstance(raw, list) and isinstance(raw[index], dict) and not isinstance(name, str):
            problems.append(f"{where}[{index}]: a [[variants]] table needs a `name` (the variant), got {raw[index]!r}")
            continue
        if not isinstance(name, str) or not isinstance(params, dict):
            problems.append(f"{named(name)}: expected a table of hyperparameters, got {params!r}")
            continue
        try:
            variant_class = registry.load(name)
        except VariantError as error:
            problems.append(f"{named(name)}: {error}{paper_name_hint(name)}")
            continue
        empty = [key for key, value in params.items() if value == []]
        if empty:  # reported, and the rest of the table still checked
            problems.append(f"{named(name)}: {', '.join(empty)} = [] gives no setting; give a value or drop the key")
            params = {key: value for key, value in params.items() if key not in empty}
        for point in _grid(params):
            point_problems = variant_class.validate_hyperparams(dict(point))
            if not point_problems:
                try:  # a constructor that raises is found now, not in every cell
                    variant_class(seed=0, **dict(point))
                except Exception as error:
                    point_problems = [
                        f"could not build {VariantSpec(name, point).label()}: {type(error).__name__}: {error}"
                    ]
            problems += [f"{named(name, point)}: {p}" for p in point_problems]
            if not point_problems:
                specs.append(VariantSpec(name, point))
    return list(dict.fromkeys(specs)), problems


FIT_KEYS = {  # a captured file's fit problem (attnbench.inputs.captured.captured_fit_problems) -> the keys it is about
    "holds batch": ("inputs", "batch", "heads"),
    "head_dim": ("inputs", "head_dim"),
    "has ": ("inputs", "seq_lens", "kv_lens", "mode", "decode_steps"),  # positions: N, or N + decode_steps
}


def _machine_problems(
    axes: dict[str, list[Any]], cluster: bool, at: Callable[[str], str], decode_steps: int, by: Blame
) -> list[str]:
    """What this machine cannot run: CUDA devices without CUDA, captured inputs smaller than the cells (named by
    the flags that asked for more than the file holds). On a cluster the devices are the workers': only `cuda:N` is
    refused (each task sees the one GPU Ray gives it)."""
    import torch

    problems = []
    cuda = [d for d in axes["device"] if d.startswith("cuda")]
    if cluster:
        problems += [f"{at('device')}: {d}: with --executor ray name the device `cuda` (Ray gives each task one GPU)"
                     for d in cuda if ":" in d]  # fmt: skip
    elif cuda and not torch.cuda.is_available():
        problems.append(f"{at('device')}: {', '.join(cuda)} asked for, but CUDA is not available on this machine")
    elif cuda:
        count = torch.cuda.device_count()
        problems += [f"{at('device')}: {d} does not exist (this machine has {count} CUDA devices)" for d in cuda
                     if re.fullmatch(r"cuda:\d+", d) and int(d.split(":")[1]) >= count]  # fmt: skip
    length = max(max(axes["seq_len"]), max(axes["kv_len"]))
    if "decode" in axes["mode"]:
        length = max(length, max(axes["seq_len"]) + decode_steps)  # a decode cell draws its prompt and its steps
    for spec in axes["input"]:
        params = dict(spec.params)
        if validate_input(spec.name, params):
            continue  # listed already
        where = "captured"
        if spec.name == "needles":  # planted in a captured model's attention, perhaps
            _, background, params = split_needle_params(params)
            where = f"needles (background {background})"
        else:
            background = spec.name
        if background == "captured":
            decoding = " (a decode cell draws N + decode_steps positions)" if "decode" in axes["mode"] else ""
            problems += [
                f"{by(*next((keys for start, keys in FIT_KEYS.items() if p.startswith(start)), ('inputs',)))}: "
                f"{where} {params.get('path')}: {p}{decoding}"
                for p in captured_fit_problems(
                    params, max(axes["batch"]), max(axes["heads"]), length, set(axes["head_dim"])
                )
            ]
    return problems


def _decode_only_problems(axes: dict[str, list[Any]], registry: Registry, by: Blame) -> list[str]:
    """A variant setting that runs only in decode (a KV-cache method: h2o, snapkv; full(kv_cache=false)) in a run
    without decode cells: every one of its cells would be unsupported, so the run is refused before any folder is
    made, with the flag that makes it run."""
    devices = [d for d in axes["device"] if d in DEVICES or re.fullmatch(r"cuda:\d+", d)]  # others: refused already
    dtypes = [d for d in axes["dtype"] if d in ALL_DTYPES]
    if "decode" in axes["mode"] or not devices or not dtypes:
        return []
    modes = ", ".join(dict.fromkeys(axes["mode"]))
    fix = "--mode decode" + (" --causal true" if False in axes["causal"] else "")
    problems = []
    for spec in axes["variant"]:
        if reason := decode_only(registry.create(spec.name, **dict(spec.params)), devices, dtypes):
            problems.append(
                f"{by('variants', 'mode')}: {spec.label()} runs only in decode: {reason}. This run has no decode "
                f"cells (mode {modes}): run it with {fix} (e.g. attnbench run decode --variants '{spec.label()}'), or "
                "leave it out"
            )
    return problems


def decode_only(variant: Any, devices: Sequence[str], dtypes: Sequence[str]) -> str | None:
    """Why `variant` has no full-sequence call where it can decode (its refusal), or None: it has one on some device
    and dtype of the run, or it cannot decode there either (its cells then say why)."""
    if not variant.decodes():
        return None
    reasons = []
    for device, dtype in itertools.product(devices, dtypes):
        options = dict(device=device, dtype=dtype, padded=False, n_q=8, n_k=8)
        if variant.unsupported_reason(causal=True, decode=True, **options) is not None:
            continue
        refused = [variant.unsupported_reason(causal=causal, **options) for causal in (False, True)]
        if not all(refused):
            return None
        reasons.append(refused[0])
    return reasons[0] if reasons else None


def _preset_files() -> dict[str, Any]:
    """Preset name -> its resource (a file in configs/, or in the installed package)."""
    return {
        entry.name.removesuffix(".toml"): entry
        for entry in resources.files(PRESETS).iterdir()
        if entry.name.endswith(".toml")
    }


def preset_names() -> list[str]:
    return sorted(_preset_files())


def preset_descriptions() -> dict[str, tuple[str, str]]:
    """Preset name -> (its `description`, its `measured_run_time`: how long it took, and where)."""
    out = {}
    for name, entry in sorted(_preset_files().items()):
        try:
            raw = tomllib.loads(entry.read_text())
            out[name] = (str(raw.get("description", "")), str(raw.get("measured_run_time", "not measured")))
        except tomllib.TOMLDecodeError as error:
            out[name] = (f"(not valid TOML: {error})", "")
    return out


def read_config_text(name_or_path: str) -> tuple[str, str]:
    """(source, TOML text) of a TOML path or of a preset's name (quick, default, ...)."""
    path = Path(name_or_path)
    if path.is_file():
        try:
            return str(path), path.read_text(encoding="utf-8-sig")  # a leading BOM (some editors) is no statement
        except UnicodeDecodeError as error:
            raise ConfigError(str(path), [f"not UTF-8 text ({error.reason} at byte {error.start}): save it as UTF-8"])
    presets = _preset_files()
    if name_or_path in presets:
        return f"preset '{name_or_path}'", presets[name_or_path].read_text()
    known = sorted(presets)
    raise ConfigError(
        name_or_path,
        [
            f"no such file, and no preset of that name.{did_you_mean(name_or_path, known)} "
            f"Presets: {', '.join(known) or 'none found in ' + PRESETS}"
        ],
    )


def load_config(
    name_or_path: str,
    overrides: dict[str, Any] | None = None,
    *,
    registry: Registry = default_registry,
    cluster: bool = False,
    flags: dict[str, str] | None = None,
) -> SweepConfig:
    """Read a preset or TOML file, apply CLI overrides (same keys as the file), validate, resolve. The problems
    an override causes name its flag as typed (`--seq-lens 4096`): `flags` gives it where it is not `--key value`
    (`--no-error`), `flag_text` writes the others. `variants` is `--variants` text or a list of specs (or of such
    text): a setting as written, a plain name with the file's grid for it. `inputs` is `--inputs` text in the same
    syntax (or a list of specs): it replaces the file's [[inputs]] list."""
    source, text = read_config_text(name_or_path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, [f"not valid TOML: {error}"]) from None
    raw.setdefault("name", Path(name_or_path).stem)
    if Path(name_or_path).is_file():  # a captured file named relative to the config, wherever `run` starts
        for item in raw.get("inputs", []) if isinstance(raw.get("inputs"), list) else []:
            if isinstance(item, dict) and isinstance(item.get("path"), str) and not Path(item["path"]).is_absolute():
                item["path"] = str((Path(name_or_path).resolve().parent / item["path"]))
    overrides = dict(overrides or {})
    flags = {key: (flags or {}).get(key) or flag_text(key, value) for key, value in overrides.items()}
    problems: list[str] = []
    if "inputs" in overrides:
        try:
            inputs = _as_specs(overrides["inputs"], lists=True)
        except ValueError as error:  # the file's inputs are checked instead, so every other problem is listed
            problems.append(f"{flags.pop('inputs')}: {error}; write NAME or NAME(key=value, ...), e.g. "
                            f"'realistic,needles(pairs=16)' (inputs: {', '.join(DISTRIBUTIONS)})")  # fmt: skip
            del overrides["inputs"]
        else:
            inputs = [Spec(spec.name, _resolved(spec.params)) for spec in inputs]  # they replace the file's
            raw["inputs"] = [{"name": spec.name, **dict(spec.params)} for spec in inputs]
            overrides["inputs"] = [spec.label() for spec in inputs]  # as meta.json and the report repeat them
    if "variants" in overrides:
        try:
            specs = _as_specs(overrides["variants"])
        except ValueError as error:  # the file's variants are checked instead, so every other problem is listed
            problems.append(f"{flags.pop('variants')}: {error}")
            del overrides["variants"]
        else:
            raw["variants"] = _variant_tables(specs, raw.get("variants"))
            if ALSO in raw:  # each further sweep keeps the named among its own variants
                raw[ALSO] = narrowed(raw[ALSO], specs, _variant_tables)
            overrides["variants"] = [spec.label() for spec in specs]  # as meta.json and the report repeat them
    raw.update({key: value for key, value in overrides.items() if key not in ("variants", "inputs")})
    try:
        config = parse_config(raw, source=source, registry=registry, cluster=cluster, flags=flags)
    except ConfigError as error:
        raise ConfigError(source, problems + error.problems) from None
    if problems:
        raise ConfigError(source, problems)
    config.overrides = overrides
    return config


def _as_specs(value: str | list[str | VariantSpec], lists: bool = False) -> list[VariantSpec]:
    """`--variants` (or, with `lists`, `--inputs`) text, or a list of specs and such text, as specs (ValueError: what
    cannot be read)."""
    items = [value] if isinstance(value, str) else list(value)
    if lists and not any(isinstance(item, Spec) or item.strip() for item in items):
        raise ValueError("empty; give at least one input")
    return [
        spec for item in items for spec in ([item] if isinstance(item, VariantSpec) else Spec.parse(item, lists=lists))
    ]


def _resolved(params: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """An input's parameters with a relative `path` (a captured file named on the command line) made absolute: the
    run's stored config reads the same file from wherever it is resumed or compared."""
    return tuple(
        (key, str(Path(value).resolve()) if key == "path" and isinstance(value, str) and value else value)
        for key, value in params
    )


def flag_text(key: str, value: Any) -> str:
    """The flag that set `key`, as typed, for the problems it causes: `--seq-lens 512,4096`, `--causal false`
    (`both` for both values); `--variants` and `--inputs` by name alone, as each of their problems names its
    setting."""
    flag = "--" + key.replace("_", "-")
    if key in ("variants", "inputs"):
        return flag
    values = value if isinstance(value, (list, tuple)) else [value]
    if sorted(values) == [False, True] and all(isinstance(v, bool) for v in values):
        return f"{flag} both"
    return f"{flag} " + ",".join(toml_value(v) if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)
                                 for v in values)  # fmt: skip


def _variant_tables(specs: list[VariantSpec], variants: Any) -> list[Any]:
    """`variants` for the settings a command line named: each setting as written; a plain name with the file's
    grid for it (its table, or each of its tables), else with its defaults."""
    tables: list[Any] = []
    for spec in specs:
        if spec.params:
            tables.append({"name": spec.name, **dict(spec.params)})
        elif isinstance(variants, dict) and isinstance(variants.get(spec.name), dict):
            tables.append({"name": spec.name, **variants[spec.name]})
        else:
            listed = variants if isinstance(variants, list) else []
            tables += [item for item in listed if isinstance(item, dict) and item.get("name") == spec.name] or [
                {"name": spec.name}
            ]
    return tables
