"""The catalogue of inputs: each distribution's name, defaults and positive parameters, their validation, the key
padding rule, and `make_inputs`, which draws one cell's Q/K/V (and mask) on the CPU and moves them.

The distributions themselves are in `attnbench.inputs.synthetic` and `attnbench.inputs.captured`.

b - batch, h - heads, n - sequence, d - head dim
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from attnbench.inputs.captured import captured, captured_layout_problems, layer_problem, read_tensors
from attnbench.inputs.heads import real_heads
from attnbench.inputs.heads_cache import DEFAULT_HEADS_MODEL, heads_problems
from attnbench.inputs.needles import MAX_MARGIN, NEEDLE_DEFAULTS, Needles, plant_needles
from attnbench.inputs.statistics import LOCALITY_WINDOW  # noqa: F401  (the report names it from here)
from attnbench.inputs.synthetic import clustered, gaussian, local, lowrank, realistic
from attnbench.interface import did_you_mean
from attnbench.ops import padding_mask


@dataclass
class Inputs:
    q: Tensor  # (b, h, n, d)
    k: Tensor  # (b, h, n, d)
    v: Tensor  # (b, h, n, d)
    key_padding_mask: Tensor | None  # (b, n) bool, True = padding
    needles: Needles | None = None  # input `needles`: where its key -> value pairs and their queries are


# ---- captured Q/K/V from a file ------------------------------------------------------------------


# ---- the registry of distributions ---------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    make: Callable[..., tuple[Tensor, Tensor, Tensor]]
    defaults: dict[str, Any]
    positive: tuple[str, ...]  # numeric parameters that must be > 0
    by_mask: bool = False  # draws differently for causal cells (`causal=` passed): calibrated per attention mask


DISTRIBUTIONS: dict[str, Distribution] = {
    "gaussian": Distribution(gaussian, {"temperature": 1.0, "scale": 1.0}, ("temperature", "scale")),
    "clustered": Distribution(
        clustered, {"clusters": 8, "spread": 0.3, "temperature": 0.1}, ("clusters", "spread", "temperature")
    ),
    "local": Distribution(
        local, {"length": 64.0, "temperature": 0.1, "noise": 0.5}, ("length", "temperature", "noise")
    ),
    "lowrank": Distribution(lowrank, {"rank": 8, "temperature": 1.0}, ("rank", "temperature")),
    "realistic": Distribution(realistic, {"temperature": 1.0}, ("temperature",), by_mask=True),
    "captured": Distribution(captured, {"path": "", "layer": 0, "beyond": "error"}, ()),
    "heads": Distribution(real_heads, {"model": DEFAULT_HEADS_MODEL, "text": "prose"}, (), by_mask=True),
}
BACKGROUNDS = tuple(DISTRIBUTIONS)  # what needles may be planted in: any distribution, a captured model's too


def split_needle_params(params: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """A needles input's parameters as (its own, the background's name, the background's): any parameter not the
    needles' own (`pairs`, `margin`) is the background's, e.g. `path` and `layer` of a captured background."""
    own = {key: value for key, value in params.items() if key in NEEDLE_DEFAULTS and key != "background"}
    background = params.get("background", NEEDLE_DEFAULTS["background"])
    rest = {key: value for key, value in params.items() if key not in NEEDLE_DEFAULTS}
    return own, background, rest


def needle_background(
    generator: torch.Generator, shape: tuple[int, int, int, int], *, causal: bool = False, **params: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """The context needles are planted in (`make_inputs` plants them): the background distribution with the
    parameters given for it (its defaults for the rest)."""
    _, background, given = split_needle_params(params)
    spec = DISTRIBUTIONS[background]
    return spec.make(generator, shape, **{**spec.defaults, **given}, **({"causal": causal} if spec.by_mask else {}))


DISTRIBUTIONS["needles"] = Distribution(needle_background, NEEDLE_DEFAULTS, ("pairs", "margin"), by_mask=True)


def validate_input(name: str, params: dict[str, Any]) -> list[str]:
    """Problems with an input spec: unknown distribution or parameter, bad values, an unreadable captured file."""
    if name not in DISTRIBUTIONS:
        return [f"unknown input distribution '{name}' (known: {', '.join(DISTRIBUTIONS)}){_hint(name, DISTRIBUTIONS)}"]
    if name == "needles":
        return _needle_problems(params)
    spec = DISTRIBUTIONS[name]
    problems = [
        f"input '{name}': unknown parameter '{key}' (known: {', '.join(spec.defaults)}){_hint(key, spec.defaults)}"
        for key in params
        if key not in spec.defaults
    ]
    problems += [
        f"input '{name}': {key} must be a finite positive number, got {value!r}"
        for key, value in params.items()
        if key in spec.positive
        and (not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf)
    ]
    if name == "captured":
        problems += _captured_problems(params)
    if name == "heads" and not problems:
        problems += heads_problems(params)
    return problems


def _needle_problems(params: dict[str, Any]) -> list[str]:
    """The needles' own parameters checked here; the others are the background's, checked as that input's."""
    own, background, given = split_needle_params(params)
    pairs, margin = own.get("pairs", 1), own.get("margin", 1.0)
    problems = [
        f"input 'needles': {key} must be a finite positive number, got {value!r}"
        for key, value in own.items()
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf
    ]
    if isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin > MAX_MARGIN:
        problems.append(f"input 'needles': margin must be at most {MAX_MARGIN:g} nats (float32 sees no difference "
                        f"beyond, and the probes only grow), got {margin!r}")  # fmt: skip
    if isinstance(pairs, float):  # other types: the positive check names them
        problems.append(f"input 'needles': pairs must be a whole number of key -> value pairs, got {pairs!r}")
    if background not in BACKGROUNDS:
        return problems + [f"input 'needles': background must be one of {', '.join(BACKGROUNDS)}, got "
                           f"{background!r}{_hint(background, BACKGROUNDS)}"]  # fmt: skip
    known = [*NEEDLE_DEFAULTS, *DISTRIBUTIONS[background].defaults]
    problems += [
        f"input 'needles': unknown parameter '{key}' (known with background {background}: {', '.join(known)})"
        f"{_hint(key, known)}"
        for key in given
        if key not in DISTRIBUTIONS[background].defaults
    ]
    ours = {key: value for key, value in given.items() if key in DISTRIBUTIONS[background].defaults}
    for problem in validate_input(background, ours):  # `input 'captured': ...` named as the needles' background
        problems.append(problem.replace(f"input '{background}'", f"input 'needles' (background {background})", 1))
    return problems


def _hint(word: Any, known: Any) -> str:
    """'. Did you mean: gaussian?' when `word` is a near miss of one of `known`, else ''."""
    hint = did_you_mean(word, list(known)) if isinstance(word, str) else ""
    return f".{hint}" if hint else ""


def _captured_problems(params: dict[str, Any]) -> list[str]:
    path, layer, beyond = params.get("path", ""), params.get("layer", 0), params.get("beyond", "error")
    if beyond not in ("error", "tile"):
        return [f'input \'captured\': beyond must be "error" or "tile", got {beyond!r}{_hint(beyond, ("error", "tile"))}']
    if problem := layer_problem(layer):
        return [f"input 'captured': {problem}"]
    if not isinstance(path, str) or not path:
        return ["input 'captured': give path = \"file.pt|.safetensors|.npz\" (see `attnbench capture`)"]
    try:
        problems = captured_layout_problems(read_tensors(Path(path)), layer)
    except ValueError as error:
        return [f"input 'captured': {error}"]
    return [f"input 'captured': {path}: {p}" for p in problems]


def make_inputs(
    name: str,
    params: dict[str, Any],
    *,
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    padding: float = 0.0,
    kv_len: int | None = None,
    value_dim: int | None = None,
    causal: bool = False,
    queries_from: int = 0,
) -> Inputs:
    """Q, K, V for one cell: drawn on the CPU in float32 from `seed`, then cast and moved (same on every device).

    Cross-attention (kv_len != seq_len) takes the first seq_len queries and the first kv_len keys of a
    sequence drawn at the longer length; a value_dim other than head_dim draws V as iid N(0, 1) of that width.
    `causal` reaches the distributions calibrated per mask (`realistic`: a decoder's heads when causal).
    `needles` are planted last (in V as drawn), their queries at positions >= `queries_from` (decode: the steps).
    """
    generator = torch.Generator().manual_seed(seed)
    spec = DISTRIBUTIONS[name]
    n_k = kv_len or seq_len
    length = max(seq_len, n_k)
    per_mask = {"causal": causal} if spec.by_mask else {}
    q, k, v = spec.make(generator, (batch, heads, length, head_dim), **{**spec.defaults, **params}, **per_mask)
    if value_dim and value_dim != head_dim:
        v = torch.randn(batch, heads, length, value_dim, generator=generator)
    q, k, v = q[:, :, :seq_len], k[:, :, :n_k], v[:, :, :n_k]
    mask = padding_mask(batch, n_k, padding)
    needles = None
    if name == "needles":
        if seq_len != n_k:
            raise ValueError(f"needles: queries ask for keys of the same sequence: kv_len must equal N, got {n_k} vs {seq_len}")
        lengths = None if mask is None else (~mask).sum(dim=1).tolist()
        settings = {**spec.defaults, **params}
        q, k, v, needles = plant_needles(
            q, k, v, generator, pairs=settings["pairs"], margin=settings["margin"], causal=causal,
            lengths=lengths, queries_from=queries_from,
        )  # fmt: skip
    if needles is not None and not torch.isfinite(q.to(dtype)).all():
        raise ValueError(f"needles: a probe query needs entries beyond {dtype}'s range (the background's keys are "
                         "tiny against the margin): use a wider dtype, a smaller margin or a larger background scale")
    return Inputs(
        q=q.to(device=device, dtype=dtype).contiguous(),
        k=k.to(device=device, dtype=dtype).contiguous(),
        v=v.to(device=device, dtype=dtype).contiguous(),
        key_padding_mask=None if mask is None else mask.to(device),
        needles=needles,
    )

