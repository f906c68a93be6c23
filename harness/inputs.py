"""Input distributions: seeded, deterministic Q/K/V (and a key padding mask) for one cell.

An approximation error means something only on inputs whose attention has the structure a variant
relies on, so there are several, each with the statistic it claims (tests check them):
- `gaussian`: iid N(0, 1), logits with std 1/temperature. Near-uniform attention at temperature 1.
- `clustered`: queries and keys near a few shared centroids (what LSH is built for): low entropy.
- `local`: rotary position phases at Gaussian-drawn frequencies: attention mass decays with distance (band's case).
- `lowrank`: Q and K inside a `rank`-dimensional subspace (what Linformer argues for).
- `realistic`: heads that mix position, content and a sink on the first token, each head its own mix,
  calibrated to the attention statistics of a real pretrained encoder (see `realistic`): the default.
- `captured`: Q/K/V read from a file (see `load_captured` for the layout), e.g. from `attnbench capture`.

b - batch, h - heads, n - sequence, d - head dim, c - cluster, r - rank
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from attnbench.atomic import write_atomic
from attnbench.interface import did_you_mean
from torch import Tensor

Shape4 = tuple[int, int, int, int]


@dataclass
class Inputs:
    q: Tensor  # (b, h, n, d)
    k: Tensor  # (b, h, n, d)
    v: Tensor  # (b, h, n, d)
    key_padding_mask: Tensor | None  # (b, n) bool, True = padding


def gaussian(generator: torch.Generator, shape: Shape4, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """iid N(0, 1); Q divided by `temperature`, so the logits q.k/sqrt(d) have std 1/temperature."""
    q = torch.randn(shape, generator=generator) / temperature
    return q, torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


def _norm_for_logit(d: int, temperature: float) -> float:
    """The length |q| = |k| that makes the logit of two aligned vectors, |q| |k| / sqrt(d), equal 1/temperature."""
    return (math.sqrt(d) / temperature) ** 0.5


def clustered(
    generator: torch.Generator, shape: Shape4, clusters: int = 8, spread: float = 0.3, temperature: float = 0.1
) -> tuple[Tensor, Tensor, Tensor]:
    """Q and K = one of `clusters` shared unit-norm centroids (per head) plus noise of relative size `spread`.

    Logits within a cluster are about 1/temperature, across clusters near 0: peaked attention.
    """
    b, h, n, d = shape
    centroids = torch.nn.functional.normalize(torch.randn(h, clusters, d, generator=generator), dim=-1)

    def near_centroids() -> Tensor:
        members = torch.randint(clusters, (b, h, n), generator=generator)
        picked = torch.gather(centroids[None].expand(b, -1, -1, -1), 2, members[..., None].expand(-1, -1, -1, d))
        return (picked + spread * torch.randn(shape, generator=generator) / math.sqrt(d)) * _norm_for_logit(
            d, temperature
        )

    return near_centroids(), near_centroids(), torch.randn(shape, generator=generator)


def rotate(x: Tensor, frequencies: Tensor) -> Tensor:
    """Rotary position phases: pair (2p, 2p+1) of position i turned by angle i * frequencies[..., p].

    frequencies: (d/2,) shared by every head, or (h, d/2) one set per head of x (b, h, n, d).
    """
    n = x.shape[-2]
    angles = torch.arange(n, dtype=x.dtype)[:, None] * frequencies[..., None, :]  # (n, d/2) or (h, n, d/2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def local(
    generator: torch.Generator, shape: Shape4, length: float = 64.0, temperature: float = 0.1, noise: float = 0.5
) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K share one direction per head, turned by rotary phases whose frequencies are drawn from a Gaussian.

    q_i . k_j is then a sum of cos((i - j) * frequency) over the d/2 rotary pairs: random Fourier features of
    a Gaussian kernel of width `length` / 4 positions (a logit of about 1/temperature at i = j, decayed by
    |i - j| = `length`). Drawn frequencies do not line up again at large distances as evenly spaced ones do,
    so the mass stays near the diagonal at any N (about 96 % within 64 positions at N=4096, 87 % at 16384).
    """
    b, h, n, d = shape
    if d % 2:
        raise ValueError("the `local` input needs an even head_dim (rotary pairs)")
    frequencies = (torch.randn(d // 2, generator=generator) * 4 / length).abs()
    angle = torch.rand(h, d // 2, generator=generator) * 2 * math.pi  # each pair weighs the same in the sum
    direction = torch.stack([angle.cos(), angle.sin()], dim=-1).flatten(-2) / math.sqrt(d // 2)
    direction = direction[None, :, None, :]  # (1, h, 1, d), unit length
    scale = _norm_for_logit(d, temperature)

    def with_phases() -> Tensor:
        base = direction + noise * torch.randn(shape, generator=generator) / math.sqrt(d)
        return rotate(base * scale, frequencies)

    return with_phases(), with_phases(), torch.randn(shape, generator=generator)


def lowrank(
    generator: torch.Generator, shape: Shape4, rank: int = 8, temperature: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """Q = A_q B, K = A_k B with B (rank x d) per head: Q and K live in a rank-dimensional subspace."""
    b, h, n, d = shape
    basis = torch.linalg.qr(torch.randn(h, d, min(rank, d), generator=generator)).Q.transpose(-1, -2)  # (h, r, d)
    scale = (d / min(rank, d)) ** 0.5  # logits keep std 1/temperature
    q = torch.einsum("bhnr,hrd->bhnd", torch.randn(b, h, n, min(rank, d), generator=generator), basis) * scale
    k = torch.einsum("bhnr,hrd->bhnd", torch.randn(b, h, n, min(rank, d), generator=generator), basis) * scale
    return q / temperature, k, torch.randn(shape, generator=generator)


def _log_uniform(generator: torch.Generator, count: int, low: float, high: float) -> Tensor:
    return torch.exp(math.log(low) + torch.rand(count, generator=generator) * (math.log(high) - math.log(low)))


@dataclass(frozen=True)
class HeadMix:
    """The ranges each head of `realistic` draws its mix from (log-uniform, the sink uniform).

    Calibrated against all 72 heads of MiniLM-L6-H384 (a 6-layer BERT-style sentence encoder) on 512 tokens
    of English prose; `CALIBRATION` holds what those heads showed and what this input gives, and a test
    keeps the input within its tolerances.
    """

    width: tuple[float, float] = (8.0, 256.0)  # positions over which a head's positional logit decays
    position: tuple[float, float] = (1.0, 10.0)  # positional logit of a token with itself
    temperature: tuple[float, float] = (0.3, 3.0)  # content logits have std 1 / temperature
    sink: tuple[float, float] = (-4.5, 0.5)  # first key's logit = log(N) + this: its mass does not fade with N


@dataclass(frozen=True)
class Target:
    """One statistic of real attention heads: its mean over heads, its spread across heads, and how close
    the synthetic input must stay (absolute)."""

    mean: float
    spread: float  # standard deviation across heads
    tolerance: float


CALIBRATION = {  # MiniLM-L6-H384 (sentence-transformers all-MiniLM-L6-v2), 6 layers x 12 heads, head_dim 32,
    # N=512 tokens of English prose, non-causal. `realistic` at the same shape (3 seeds x 24 heads) gives
    # entropy 0.69 (spread 0.17), within +-64 0.51 (0.23), first token 0.10 (0.10).
    "entropy": Target(mean=0.69, spread=0.19, tolerance=0.05),  # H(p) / log N, mean over rows
    "local_mass": Target(mean=0.51, spread=0.20, tolerance=0.07),  # mass within |i - j| <= 64
    "sink_mass": Target(mean=0.094, spread=0.075, tolerance=0.04),  # mass on the first token
}


def realistic(generator: torch.Generator, shape: Shape4, temperature: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
    """Attention that looks like a pretrained model's: per head, a mix of three logit sources drawn from `HeadMix`.

    - position: rotary phases at Gaussian-drawn frequencies of a per-head width (as `local`), a logit of
      `position` at i = j decaying with |i - j|;
    - content: iid Gaussian parts with per-head temperature (broad heads and sharp ones);
    - a sink: every query has a logit of log(N) + `sink` on the first key (attention sinks, [CLS]).
    Each part lives in its own coordinates of the head dim, so their logits add. `temperature` scales every
    logit (1: the calibrated input). V is iid N(0, 1).
    """
    b, h, n, d = shape
    mix = HeadMix()
    pairs = (d - 1) // 4  # rotary pairs for position; one coordinate for the sink; the rest for content
    content_dims = d - 1 - 2 * pairs
    width = _log_uniform(generator, h, *mix.width)
    position = _log_uniform(generator, h, *mix.position)
    content_temperature = _log_uniform(generator, h, *mix.temperature)
    sink = mix.sink[0] + torch.rand(h, generator=generator) * (mix.sink[1] - mix.sink[0])
    parts_q, parts_k = [], []
    if pairs:
        frequencies = (torch.randn(h, pairs, generator=generator) * 4 / width[:, None]).abs()  # (h, p)
        angle = torch.rand(h, pairs, generator=generator) * 2 * math.pi
        direction = torch.stack([angle.cos(), angle.sin()], dim=-1).flatten(-2) / math.sqrt(pairs)  # (h, 2p) unit
        base = (direction * position.sqrt()[:, None])[None, :, None, :].expand(b, h, n, 2 * pairs)
        positional = rotate(base, frequencies)  # q_i . k_j = position * mean_p cos((i - j) f_p)
        parts_q.append(positional)
        parts_k.append(positional)
    if content_dims:
        # q.k has std 1 / temperature, its scale split evenly between q and k (neither norm outgrows the other)
        scale = (content_temperature * math.sqrt(content_dims)) ** -0.5  # (h,)
        parts_q.append(torch.randn(b, h, n, content_dims, generator=generator) * scale[None, :, None, None])
        parts_k.append(torch.randn(b, h, n, content_dims, generator=generator) * scale[None, :, None, None])
    sink_logit = math.log(n) + sink  # (h,): split evenly between q and k, as a learned sink would be
    split = sink_logit.clamp(min=1.0).sqrt()
    parts_q.append(split[None, :, None, None].expand(b, h, n, 1))
    sink_key = torch.zeros(b, h, n, 1)
    sink_key[:, :, 0, 0] = sink_logit / split
    parts_k.append(sink_key)
    to_logit = d**0.25 / math.sqrt(temperature)  # q.k / sqrt(d) is then the sum of the parts' logits / temperature
    q, k = torch.cat(parts_q, dim=-1) * to_logit, torch.cat(parts_k, dim=-1) * to_logit
    return q, k, torch.randn(shape, generator=generator)


# ---- captured Q/K/V from a file ------------------------------------------------------------------

CAPTURE_LAYOUT = (
    "a mapping with tensors 'q', 'k', 'v', each (batch, heads, seq, head_dim) or "
    "(layers, batch, heads, seq, head_dim); k and v may have fewer heads than q (grouped-query), "
    "a divisor of q's"
)


CAPTURE_FORMATS = (".pt", ".safetensors", ".npz")  # what `read_tensors` reads and `write_tensors` writes


def unknown_format(path: Path) -> str | None:
    """Why `path` cannot hold captured tensors by its suffix (None when it can)."""
    if path.suffix.lower() in CAPTURE_FORMATS:
        return None
    return f"{path}: unknown format '{path.suffix}' (use {', '.join(CAPTURE_FORMATS)})"


def write_tensors(path: Path, tensors: dict[str, Tensor]) -> None:
    """`tensors` by name to a file `read_tensors` reads back, in the format its suffix names (written whole or not
    at all: `attnbench.atomic`)."""
    problem = unknown_format(path)
    if problem:
        raise ValueError(problem)
    suffix = path.suffix.lower()

    def write(temporary: Path) -> None:
        if suffix == ".pt":
            torch.save(tensors, temporary)
        elif suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file(tensors, str(temporary))
        else:
            import numpy as np

            with temporary.open("wb") as file:  # a file object: np.savez would add a second .npz to a name
                np.savez(file, **{name: tensor.numpy() for name, tensor in tensors.items()})

    write_atomic(path, write)


def read_tensors(path: Path) -> dict[str, Tensor]:
    """The tensors of a .pt, .safetensors or .npz file, by name."""
    if not path.exists():
        raise ValueError(f"captured file {path} does not exist")
    if not path.is_file():
        raise ValueError(f"captured file {path} is not a regular file (a folder or a device)")
    suffix = path.suffix.lower()
    try:
        if suffix == ".pt":
            data = torch.load(path, map_location="cpu", weights_only=True)
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            data = load_file(str(path))
        elif suffix == ".npz":
            import numpy as np

            with np.load(path) as archive:
                data = {name: torch.from_numpy(archive[name]) for name in archive.files}
        else:
            raise ValueError(f"captured file {unknown_format(path)}")
    except ImportError as error:
        raise ValueError(
            f"captured file {path}: reading {suffix} needs {error.name} (pip install {error.name})"
        ) from None
    except ValueError:
        raise
    except Exception as error:  # a corrupt or foreign file: say which, and what was expected
        raise ValueError(
            f"captured file {path} could not be read ({type(error).__name__}: {error}); expected {CAPTURE_LAYOUT}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"captured file {path} holds a {type(data).__name__}; expected {CAPTURE_LAYOUT}")
    return data


def captured_layout_problems(data: dict[str, Any], layer: int) -> list[str]:
    """What is wrong with a captured file's tensors, if anything."""
    missing = [name for name in ("q", "k", "v") if not isinstance(data.get(name), Tensor)]
    if missing:
        return [f"missing tensor(s) {', '.join(missing)}; expected {CAPTURE_LAYOUT}"]
    q, k, v = data["q"], data["k"], data["v"]
    odd = [
        f"{name} is a {tensor.layout} tensor on {tensor.device.type}; expected a dense (strided) tensor with values"
        for name, tensor in (("q", q), ("k", k), ("v", v))
        if tensor.layout != torch.strided or tensor.device.type == "meta"
    ]
    if odd:  # sparse or meta tensors: nothing below could read their values
        return odd
    if not (q.dim() == k.dim() == v.dim() and q.dim() in (4, 5)):
        return [f"q, k, v have {q.dim()}, {k.dim()}, {v.dim()} dimensions; expected {CAPTURE_LAYOUT}"]
    problems = []
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not (tensor.is_floating_point() and not tensor.is_complex()):
            problems.append(f"{name} is {str(tensor.dtype).removeprefix('torch.')}; expected real floating point")
        elif not (finite := torch.isfinite(tensor)).all():
            where = tuple(int(i) for i in (~finite).nonzero()[0])
            problems.append(
                f"{name} has {int((~finite).sum()):,} NaN or Inf value(s), the first at index {where}: refused, "
                "every error figure on it would be meaningless"
            )
    if q.dim() == 5 and not 0 <= layer < q.shape[0]:
        problems.append(f"layer {layer} is out of range: the file has {q.shape[0]} layers")
    if k.shape != v.shape[:-1] + (k.shape[-1],) or q.shape[-2] != k.shape[-2] or q.shape[-1] != k.shape[-1]:
        problems.append(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    elif q.shape[-3] % k.shape[-3]:
        problems.append(f"q has {q.shape[-3]} heads, k and v {k.shape[-3]}: not a divisor")
    return problems


def captured_fit_problems(
    params: dict[str, Any], batch: int, heads: int, length: int, head_dims: set[int]
) -> list[str]:
    """Why a captured file cannot serve cells of this size (checked when the config is validated)."""
    try:
        q, _, _ = load_captured(params.get("path", ""), params.get("layer", 0))
    except ValueError as error:
        return [str(error)]
    problems = []
    if q.shape[0] < batch or q.shape[1] < heads:
        problems.append(
            f"holds batch {q.shape[0]} and {q.shape[1]} heads; the config asks batch {batch}, heads {heads}"
        )
    if head_dims != {q.shape[-1]}:
        problems.append(f"head_dim is {q.shape[-1]}; the config asks {', '.join(map(str, sorted(head_dims)))}")
    if length > q.shape[-2] and params.get("beyond", "error") != "tile":
        problems.append(
            f"has {q.shape[-2]} positions and N={length} is asked; sweep N up to {q.shape[-2]}, "
            'or set beyond = "tile" to repeat the sequence'
        )
    return problems


def load_captured(path: str | Path, layer: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (batch, heads, seq, head_dim) from a captured file, grouped-query k/v heads repeated."""
    data = read_tensors(Path(path))
    problems = captured_layout_problems(data, layer)
    if problems:
        raise ValueError(f"captured file {path}: " + "; ".join(problems))
    q, k, v = (data[name].float() for name in ("q", "k", "v"))
    if q.dim() == 5:
        q, k, v = q[layer], k[layer], v[layer]
    repeat = q.shape[1] // k.shape[1]
    return q, k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)


def captured(
    generator: torch.Generator, shape: Shape4, path: str = "", layer: int = 0, beyond: str = "error"
) -> tuple[Tensor, Tensor, Tensor]:
    """The first batch/heads/N of a captured file. N beyond its length: an error, or with beyond="tile"
    the sequence repeated (the report states it in the input's label)."""
    b, h, n, d = shape
    q, k, v = load_captured(path, layer)
    if q.shape[0] < b or q.shape[1] < h or q.shape[-1] != d:
        raise ValueError(
            f"captured file {path} holds batch {q.shape[0]}, heads {q.shape[1]}, head_dim {q.shape[-1]}; "
            f"the cell asks batch {b}, heads {h}, head_dim {d} (set batch/heads/head_dim to fit)"
        )
    length = q.shape[-2]
    if n > length:
        if beyond != "tile":
            raise ValueError(
                f"captured file {path} has {length} positions and N={n} was asked; "
                'sweep N up to the captured length, or set beyond = "tile" to repeat the sequence'
            )
        index = torch.arange(n) % length
        q, k, v = (t[..., index, :] for t in (q, k, v))
    return tuple(t[:b, :h, :n].contiguous() for t in (q, k, v))


# ---- the registry of distributions ---------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    make: Callable[..., tuple[Tensor, Tensor, Tensor]]
    defaults: dict[str, Any]
    positive: tuple[str, ...]  # numeric parameters that must be > 0


DISTRIBUTIONS: dict[str, Distribution] = {
    "gaussian": Distribution(gaussian, {"temperature": 1.0}, ("temperature",)),
    "clustered": Distribution(
        clustered, {"clusters": 8, "spread": 0.3, "temperature": 0.1}, ("clusters", "spread", "temperature")
    ),
    "local": Distribution(
        local, {"length": 64.0, "temperature": 0.1, "noise": 0.5}, ("length", "temperature", "noise")
    ),
    "lowrank": Distribution(lowrank, {"rank": 8, "temperature": 1.0}, ("rank", "temperature")),
    "realistic": Distribution(realistic, {"temperature": 1.0}, ("temperature",)),
    "captured": Distribution(captured, {"path": "", "layer": 0, "beyond": "error"}, ()),
}


def validate_input(name: str, params: dict[str, Any]) -> list[str]:
    """Problems with an input spec: unknown distribution or parameter, bad values, an unreadable captured file."""
    if name not in DISTRIBUTIONS:
        return [f"unknown input distribution '{name}' (known: {', '.join(DISTRIBUTIONS)}){_hint(name, DISTRIBUTIONS)}"]
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
    return problems


def _hint(word: Any, known: Any) -> str:
    """'. Did you mean: gaussian?' when `word` is a near miss of one of `known`, else ''."""
    hint = did_you_mean(word, list(known)) if isinstance(word, str) else ""
    return f".{hint}" if hint else ""


def _captured_problems(params: dict[str, Any]) -> list[str]:
    path, layer, beyond = params.get("path", ""), params.get("layer", 0), params.get("beyond", "error")
    if beyond not in ("error", "tile"):
        return [f'input \'captured\': beyond must be "error" or "tile", got {beyond!r}{_hint(beyond, ("error", "tile"))}']
    if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
        return [f"input 'captured': layer must be an integer >= 0, got {layer!r}"]
    if not isinstance(path, str) or not path:
        return ["input 'captured': give path = \"file.pt|.safetensors|.npz\" (see `attnbench capture`)"]
    try:
        problems = captured_layout_problems(read_tensors(Path(path)), layer)
    except ValueError as error:
        return [f"input 'captured': {error}"]
    return [f"input 'captured': {path}: {p}" for p in problems]


def padding_mask(batch: int, n: int, fraction: float) -> Tensor | None:
    """Right padding as in a real batch: element b has round(fraction * n * (b + 1) / batch) padded keys at the end.

    At least one key per element stays real. None when `fraction` is 0.
    """
    if fraction <= 0:
        return None
    padded = [min(n - 1, round(fraction * n * (index + 1) / batch)) for index in range(batch)]
    lengths = torch.tensor([n - p for p in padded])
    return torch.arange(n)[None, :] >= lengths[:, None]


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
) -> Inputs:
    """Q, K, V for one cell: drawn on the CPU in float32 from `seed`, then cast and moved (same on every device).

    Cross-attention (kv_len != seq_len) takes the first seq_len queries and the first kv_len keys of a
    sequence drawn at the longer length; a value_dim other than head_dim draws V as iid N(0, 1) of that width.
    """
    generator = torch.Generator().manual_seed(seed)
    spec = DISTRIBUTIONS[name]
    n_k = kv_len or seq_len
    length = max(seq_len, n_k)
    q, k, v = spec.make(generator, (batch, heads, length, head_dim), **{**spec.defaults, **params})
    if value_dim and value_dim != head_dim:
        v = torch.randn(batch, heads, length, value_dim, generator=generator)
    q, k, v = q[:, :, :seq_len], k[:, :, :n_k], v[:, :, :n_k]
    mask = padding_mask(batch, n_k, padding)
    return Inputs(
        q=q.to(device=device, dtype=dtype).contiguous(),
        k=k.to(device=device, dtype=dtype).contiguous(),
        v=v.to(device=device, dtype=dtype).contiguous(),
        key_padding_mask=None if mask is None else mask.to(device),
    )
