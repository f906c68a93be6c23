"""Captured Q/K/V: the file format (`.pt`, `.safetensors`, `.npz`), its layout checks, and the `captured` input
that reads one layer, or several layers' heads side by side, of a file (e.g. written by `attnbench capture`).

A file written by `attnbench capture` also holds a description of what it is (`meta`: the model, the text, the
positions, where q/k were recorded — after the rotary embedding or before it —, causal, the attention scaling),
stored as a uint8 tensor of UTF-8 JSON so the three formats carry it alike. A file without one, or one recorded
before the rotary embedding of a rotary model, is read with a warning: its attention is position-free, not what
the model computes.

b - batch, h - heads, n - sequence, d - head dim, l - layer
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from attnbench.atomic import write_atomic
from attnbench.inputs.synthetic import Shape4

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


META_KEY = "meta"  # the description, as a uint8 tensor of UTF-8 JSON


class CapturedFileWarning(UserWarning):
    """A captured file whose attention may not be the model's (the CLI prints each once, as one line)."""


def write_capture(path: Path, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """q, k, v and their description (`META_KEY`) to `path`, as `write_tensors` does."""
    encoded = torch.tensor(list(json.dumps(meta, sort_keys=True).encode("utf-8")), dtype=torch.uint8)
    write_tensors(path, {**tensors, META_KEY: encoded})


def capture_meta(data: dict[str, Any]) -> dict[str, Any] | None:
    """The description a captured file holds (None for a file without one: an older capture, or another tool's)."""
    encoded = data.get(META_KEY)
    if not isinstance(encoded, Tensor) or encoded.dtype != torch.uint8 or encoded.dim() != 1:
        return None
    try:
        meta = json.loads(bytes(encoded.tolist()).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None


def position_warning(path: str | Path, meta: dict[str, Any] | None) -> str | None:
    """Why the file's attention may not be the model's (None when it says it is)."""
    if meta is None:
        return (
            f"captured file {path} does not say what it holds (made by an older `attnbench capture`, or another "
            "tool): if it came from a rotary model (Llama, Mistral, Qwen, ...) its q/k are before the rotary "
            "embedding and its attention is position-free; capture it again"
        )
    if meta.get("rotary") and not meta.get("post_rotary"):
        return (
            f"captured file {path} holds q/k from before {meta.get('model_type') or 'the model'}'s rotary embedding "
            "(--pre-rotary): position-free attention, not what the model computes"
        )
    return None


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


def layer_list(layer: int | Sequence[int]) -> list[int]:
    """`layer` as a list: one layer, or several whose heads a cell takes side by side."""
    return [layer] if isinstance(layer, int) else list(layer)


def layer_problem(layer: Any) -> str | None:
    """Why `layer` is not an integer >= 0 or a non-empty list of them (None when it is)."""
    items = [layer] if not isinstance(layer, (list, tuple)) else list(layer)
    if not items or any(not isinstance(x, int) or isinstance(x, bool) or x < 0 for x in items):
        return f"layer must be an integer >= 0 or a non-empty list of them, got {layer!r}"
    return None


def captured_layout_problems(data: dict[str, Any], layer: int | Sequence[int]) -> list[str]:
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
    outside = [x for x in layer_list(layer) if q.dim() == 5 and not 0 <= x < q.shape[0]]
    if outside:
        problems.append(f"layer {', '.join(map(str, outside))} is out of range: the file has {q.shape[0]} layers")
    elif q.dim() == 4 and layer_list(layer) != [0]:
        problems.append("the file holds one layer (4-D tensors): layer must be 0")
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


def load_captured(path: str | Path, layer: int | Sequence[int] = 0) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (batch, heads, seq, head_dim) from a captured file, grouped-query k/v heads repeated; with a list
    of layers, their heads side by side in the order given (layer-major). q is scaled so that the variants' 1/sqrt(d)
    gives the model's own attention scaling, when the file records one."""
    data = read_tensors(Path(path))
    problems = captured_layout_problems(data, layer)
    if problems:
        raise ValueError(f"captured file {path}: " + "; ".join(problems))
    meta = capture_meta(data)
    warning = position_warning(path, meta)
    if warning:
        warnings.warn(warning, CapturedFileWarning, stacklevel=2)
    q, k, v = (data[name].float() for name in ("q", "k", "v"))
    layers = layer_list(layer)
    if q.dim() == 4:
        q, k, v = q[None], k[None], v[None]
    scaling = (meta or {}).get("scaling")
    repeat = q.shape[2] // k.shape[2]
    parts = []
    for index in layers:
        layer_q = q[index]
        if isinstance(scaling, list) and index < len(scaling) and scaling[index]:
            layer_q = layer_q * (float(scaling[index]) * q.shape[-1] ** 0.5)  # variants scale by 1/sqrt(d)
        parts.append((layer_q, k[index].repeat_interleave(repeat, dim=1), v[index].repeat_interleave(repeat, dim=1)))
    q, k, v = (torch.cat(tensors, dim=1) for tensors in zip(*parts))  # (b, heads of every layer, n, d)
    return q, k, v


def captured(
    generator: torch.Generator,
    shape: Shape4,
    path: str = "",
    layer: int | Sequence[int] = 0,
    beyond: str = "error",
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
