"""The plan of a run: its axes declared once, the cells they span, and the comparison groups. No torch here.

A sweep axis is one field of `Cell`, with its config key in the field's metadata. Everything else is
derived from that declaration: the config's list keys (`AXES`), the cross product (`expand`), a cell's
stable key, the CSV columns that describe a cell (`CELL_COLUMNS`), and the group columns (`GROUP_AXES`):
cells that differ only in their variant setting form one comparison group, measured together, in turns.
Adding an axis is adding one field here.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any

import tomllib


def spec_label(name: str, params: tuple[tuple[str, Any], ...]) -> str:
    """`band(window=64)`: a name with its non-default parameters, as tables and plots show it."""
    return f"{name}({', '.join(f'{k}={v}' for k, v in params)})" if params else name


def _frozen(value: Any) -> Any:
    return tuple(_frozen(item) for item in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Spec:
    """A name with one point of its parameters: a variant with its hyperparameters, or an input distribution with
    its parameters. Written as a label (`band(window=64)`), and read back from one by `parse`."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        """A list value (a captured input's `layer = [0, 5]`, or one read back from JSON) becomes a tuple: cells are
        hashed and compared by their specs."""
        object.__setattr__(self, "params", tuple((key, _frozen(value)) for key, value in self.params))

    def label(self) -> str:
        return spec_label(self.name, self.params)

    @staticmethod
    def parse(text: str, *, lists: bool = False) -> list[Spec]:
        """'band(window=64),band(window=128),lsh' -> one spec per setting, in order (see `_parse_specs`). With
        `lists`, a list is one value (an input's `captured(layer=[4,16])`), not several settings."""
        return _parse_specs(text, lists=lists)


VariantSpec = Spec  # a variant with one point of its hyperparameter grid
InputSpec = Spec  # an input distribution with its parameters


def axis(config_key: str, kind: type, default: Any) -> Any:
    """A sweep axis: its key in a config (a value or a list of values), its type and default values."""
    return field(metadata={"config": config_key, "kind": kind, "default": default})


@dataclass(frozen=True)
class Cell:
    """One measurement, one row of results.csv. Every field but `variant` and `compiled` is a group axis: eager and
    compiled calls of a setting are timed in one group, in turns, and compared round by round."""

    variant: VariantSpec = axis("variants", VariantSpec, [])
    device: str = axis("device", str, ["cpu"])
    dtype: str = axis("dtype", str, ["float32"])
    mode: str = axis("mode", str, ["fwd"])
    causal: bool = axis("causal", bool, [False])
    input: InputSpec = axis("inputs", InputSpec, [InputSpec("gaussian")])
    seed: int = axis("seeds", int, [0])
    padding: float = axis("padding", float, [0.0])
    batch: int = axis("batch", int, [1])
    heads: int = axis("heads", int, [8])
    head_dim: int = axis("head_dim", int, [64])
    value_dim: int = axis("value_dim", int, [0])  # 0: equal to head_dim
    kv_len: int = axis("kv_lens", int, [0])  # 0: equal to seq_len (self-attention)
    seq_len: int = axis("seq_lens", int, [256, 1024])  # N grows fastest within a setting (see `expand`)
    # axes added after run folders existed: last, and left out of a cell's key at their default (`LATER_AXES`)
    compiled: bool = axis("compile", bool, [False])  # the variant's call wrapped in torch.compile

    @property
    def n_k(self) -> int:
        return self.kv_len or self.seq_len

    @property
    def v_dim(self) -> int:
        return self.value_dim or self.head_dim

    def label(self) -> str:
        """The variant setting as tables and plots name it: `band(window=64)`, or `band(window=64) compiled`."""
        return compiled_label(self.variant.label(), self.compiled)

    def key(self) -> str:
        """A stable text key (matching runs, resuming): every axis, the specs spelled out; an axis added later
        (`LATER_AXES`) only away from its default, so a cell keeps the key a run written before it existed gave
        it (resume and compare still match those runs)."""
        names = [n for n in AXIS_NAMES if n not in LATER_AXES or getattr(self, n) != AXES_DEFAULTS[n]]
        return json.dumps([_plain(getattr(self, name)) for name in names], sort_keys=True)

    @classmethod
    def from_key(cls, key: str) -> "Cell":
        """The cell whose `key()` this is (how a group travels to an isolated worker)."""
        later = {name: AXES_DEFAULTS[name] for name in LATER_AXES}  # left out of the key: at their defaults
        values = later | dict(zip(AXIS_NAMES, json.loads(key)))
        for name, spec in (("variant", VariantSpec), ("input", InputSpec)):
            spec_name, params = values[name]
            values[name] = spec(spec_name, tuple(sorted(params.items())))
        return cls(**values)

    def group_key(self) -> str:
        """Cells with equal group keys share inputs and reference and are timed together, in turns."""
        return json.dumps([_plain(getattr(self, name)) for name in GROUP_AXES], sort_keys=True)

    def timing_key(self) -> str:
        """Groups with equal timing keys differ only in their input: one timing serves them all."""
        return json.dumps([_plain(getattr(self, name)) for name in GROUP_AXES if name != "input"], sort_keys=True)

    def series_key(self) -> str:
        """Cells that differ only in N (and input, on which time barely depends): once one is over the time
        budget, the larger ones are skipped."""
        return json.dumps(
            [_plain(getattr(self, name)) for name in AXIS_NAMES if name not in ("seq_len", "input")], sort_keys=True
        )

    def columns(self) -> dict[str, Any]:
        """The cell's own CSV columns: one per axis, specs as name + JSON parameters."""
        out: dict[str, Any] = {}
        for name in AXIS_NAMES:
            value = getattr(self, name)
            if name == "variant":
                out.update(variant=value.name, label=self.label(), hparams=json.dumps(dict(value.params)))
            elif isinstance(value, Spec):
                out[name] = value.label()
            else:
                out[name] = value
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, Spec):
        return [value.name, dict(value.params)]
    return value


COMPILED_SUFFIX = " compiled"


def compiled_label(label: str, compiled: bool) -> str:
    """A variant setting's label, compiled or not: `band(window=64)` -> `band(window=64) compiled`."""
    return label + COMPILED_SUFFIX if compiled else label


def label_variant(label: str) -> str:
    """The variant setting of a label (`compiled_label`'s inverse): `band(window=64) compiled` -> `band(window=64)`."""
    return label.removesuffix(COMPILED_SUFFIX)


AXIS_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Cell))
LATER_AXES: tuple[str, ...] = ("compiled",)  # the last fields of Cell: in a key only away from their default
AXES_DEFAULTS: dict[str, Any] = {f.name: f.metadata["default"][0] for f in fields(Cell) if f.metadata["default"]}
assert AXIS_NAMES[-len(LATER_AXES) :] == LATER_AXES, "later axes come last: keys are read by position"
VARIANT_AXES: tuple[str, ...] = ("variant", "compiled")  # what differs between the cells of one group
AXES: dict[str, tuple[str, type, Any]] = {  # config key -> (cell field, kind, default values)
    f.metadata["config"]: (f.name, f.metadata["kind"], f.metadata["default"]) for f in fields(Cell)
}
GROUP_AXES: tuple[str, ...] = tuple(name for name in AXIS_NAMES if name not in VARIANT_AXES)
CELL_COLUMNS: tuple[str, ...] = tuple(
    Cell(
        **{name: kind("x") if kind in (VariantSpec, InputSpec) else kind() for name, kind, _ in AXES.values()}
    ).columns()
)
GROUP_COLUMNS: tuple[str, ...] = tuple(c for c in CELL_COLUMNS if c not in ("variant", "label", "hparams", "compiled"))


@dataclass(frozen=True)
class Group:
    """Cells that differ only in variant setting: one set of inputs, one reference, timed in turns
    (or, when not `timed`, only their error measured)."""

    cells: tuple[Cell, ...]
    timed: bool = True

    @property
    def setting(self) -> Cell:
        """The shared axes (read any field but `variant` and `compiled` from it)."""
        return self.cells[0]

    def key(self) -> str:
        return self.setting.group_key()

    def without(self, keys: set[str]) -> "Group":
        return Group(tuple(c for c in self.cells if c.key() not in keys), self.timed)

    def eager_twins(self) -> dict[str, str]:
        """Each compiled cell's key -> the key of the same setting run eager in this group (where there is one)."""
        eager = {c.variant: c.key() for c in self.cells if not c.compiled}
        return {c.key(): eager[c.variant] for c in self.cells if c.compiled and c.variant in eager}


@dataclass(frozen=True)
class Plan:
    """A config's cells (duplicates removed: cells of one group adjacent, N growing within a setting) and its
    comparison groups, expanded once per run and handed to whatever needs them."""

    cells: list[Cell]
    groups: list[Group]
    duplicates: int = 0  # cells the config listed more than once (`seq_lens = [128, 128]`)
    notes: list[str] = field(default_factory=list)  # cells not planned and why (a causal decoder's heads, non-causal)


def expand(values: dict[str, list[Any]]) -> list[Cell]:
    """Every combination of the axes' values (cell field -> values), in declaration order: cells of one group
    adjacent, N growing within a setting. Duplicates are removed (first kept)."""
    names = list(AXIS_NAMES)
    order = [n for n in names if n not in ("seq_len", *VARIANT_AXES)] + ["seq_len", *VARIANT_AXES]
    combos = itertools.product(*(sorted(values[name]) if name == "seq_len" else values[name] for name in order))
    cells = [Cell(**dict(zip(order, combo))) for combo in combos]
    return list(dict.fromkeys(cells))


def groups_of(
    cells: list[Cell], *, time_every_input: bool = True, drawable: set[Cell] | None = None
) -> list[Group]:
    """Cells gathered into comparison groups, in the order their first cell appears. Unless `time_every_input`,
    only the first input of each setting is timed, the first whose cells' input can be drawn (`drawable`, default
    all: needles that do not fit a cell are skipped there); the groups of the other inputs measure error alone."""
    gathered: dict[str, list[Cell]] = {}
    for cell in cells:
        gathered.setdefault(cell.group_key(), []).append(cell)
    groups, timed_settings = [], set()
    for members in gathered.values():
        setting = members[0].timing_key()
        drawn = drawable is None or any(cell in drawable for cell in members)
        groups.append(Group(tuple(members), time_every_input or (drawn and setting not in timed_settings)))
        if drawn:
            timed_settings.add(setting)
    return groups


# ---- reading specs from text -------------------------------------------------------------------


def parse_params(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs (hyperparameters on a command line), each value read as TOML (64, 0.5, true, "flex"), as
    a boolean when spelt as a label prints it (True, False), or else as a plain string; ValueError names a pair
    without "=" or a key given twice."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or not key:
            raise ValueError(f"{pair.strip()!r}: expected KEY=VALUE")
        if key in params:
            raise ValueError(f"{key} is given twice")
        try:
            params[key] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            params[key] = {"True": True, "False": False}.get(value, value)
    return params


def _split_top(text: str) -> list[str] | None:
    """`text` cut at the commas outside parentheses, brackets and quotes; None when those do not balance."""
    parts, depth, quote, start = [], 0, "", 0
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
            if depth < 0:
                return None
        elif char == "," and depth == 0:
            parts.append(text[start:index].strip())
            start = index + 1
    return None if depth or quote else [*parts, text[start:].strip()]


def _parse_specs(text: str, *, lists: bool = False) -> list[Spec]:
    """'band(window=64),band(window=128),lsh' -> one spec per setting, in order: the syntax of every
    `--variants` (run and model), of `run --inputs` and of the labels reports print. Values are read as
    `parse_params` reads them, one per key (several settings are several specs; with `lists` a list is one value, as
    an input's `layer=[4,16]`). ValueError says what cannot be read; names are not checked here."""
    parts = _split_top(text)
    if parts is None:
        raise ValueError(f"unbalanced parentheses or quotes in {text!r}")
    if len(parts) > 1 and not all(part.strip() for part in parts):
        raise ValueError(f"an empty item in {text!r} (two commas in a row, or one at an end?)")
    specs = []
    for part in filter(None, parts):
        match = re.fullmatch(r"([\w.-]+)\s*(?:\((.*)\))?", part, flags=re.DOTALL)
        pairs = _split_top(match.group(2) or "") if match else None  # None: `band(window=1)(x)` and the like
        if pairs is None:
            raise ValueError(f"cannot read {part!r}; write NAME or NAME(key=value, ...)")
        name = match.group(1)
        try:
            params = parse_params([pair for pair in pairs if pair])
        except ValueError as error:
            raise ValueError(f"{part!r}: {error}") from None
        for key, value in params.items():
            if isinstance(value, dict) or (isinstance(value, list) and not lists):
                raise ValueError(
                    f"{part!r}: {key} takes one value here; for several settings write each, "
                    f"e.g. {name}({key}=1),{name}({key}=2)"
                )
        specs.append(Spec(name, tuple(sorted(params.items()))))
    if not specs:
        raise ValueError("give at least one variant, e.g. band,lsh or band(window=64),full")
    return specs
