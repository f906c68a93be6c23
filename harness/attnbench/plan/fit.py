"""Whether a cell's input can be drawn at the cell's shape: needles that do not fit its N (after padding), head_dim,
value width, decode steps or a cross-attention kv_len. Such a cell is skipped with the reason, before any work, and the rest of
the run goes on; the plan times each setting on its first input that can be drawn."""

from __future__ import annotations

from attnbench.inputs.heads_cache import heads_head_dim, heads_unfit
from attnbench.inputs.needles import NEEDLE_DEFAULTS, needle_cell_problems
from attnbench.plan.cells import Cell, InputSpec


def causal_only_input(spec: InputSpec) -> bool:
    """Whether an input is a causal decoder's own heads (or needles planted in them): causal cells only."""
    return spec.name == "heads" or (spec.name == "needles" and dict(spec.params).get("background") == "heads")


def heads_head_dims(specs: list[InputSpec]) -> dict[int, list[str]]:
    """head_dim -> the inputs drawn from a model's captured heads that have it (those of models captured here): the
    head_dim their cells must have (`heads_unfit`), which a run naming them in --inputs takes (`plan.config`)."""
    dims: dict[int, list[str]] = {}
    for spec in specs:
        own = {key: value for key, value in spec.params if key not in NEEDLE_DEFAULTS}
        if causal_only_input(spec) and (dim := heads_head_dim(own)) is not None:
            dims.setdefault(dim, []).append(spec.label())
    return dims


def input_unfit(cell: Cell, decode_steps: int) -> str | None:
    """Why the cell's input cannot be drawn at its shape (decode cells generating `decode_steps`), or None."""
    params = dict(cell.input.params)
    if causal_only_input(cell.input):
        own = {key: value for key, value in params.items() if key not in NEEDLE_DEFAULTS}
        positions = max(cell.seq_len, cell.n_k) + (decode_steps if cell.mode == "decode" else 0)
        if why := heads_unfit(own, causal=cell.causal, positions=positions, head_dim=cell.head_dim):
            return why
    if cell.input.name != "needles":
        return None
    unfit = needle_cell_problems(
        dict(cell.input.params), seq_len=cell.seq_len, n_k=cell.n_k, padding=cell.padding, head_dim=cell.head_dim,
        value_dim=cell.value_dim, decode_steps=decode_steps if cell.mode == "decode" else None,
    )  # fmt: skip
    return "; ".join(unfit) or None


def unfit_input_lines(cells: list[Cell], decode_steps: int) -> list[str]:
    """One line per input and reason its cells are skipped for, with the cells' shapes: said as a run starts, so a
    preset run at a small N knows why its needles are missing."""
    found: dict[tuple[str, str], list[str]] = {}
    for cell in cells:
        if why := input_unfit(cell, decode_steps):
            where = f"N={cell.seq_len}" + (f" padding={cell.padding:g}" if cell.padding else "")
            where += f" kv_len={cell.kv_len}" if cell.kv_len else ""
            where += f" head_dim={cell.head_dim}" if "head_dim" in why else ""
            shapes = found.setdefault((cell.input.label(), why), [])
            if where not in shapes:
                shapes.append(where)
    return [f"input {label} is not drawn at {', '.join(shapes)} (those cells are skipped): {why}"
            for (label, why), shapes in found.items()]  # fmt: skip
