"""Helpers the tests share (importable from every test folder: tests/ is on the path)."""

from __future__ import annotations

import csv
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import torch
from attnbench.plan.config import parse_config, toml_value
from attnbench.registry import GROUP
from attnbench.runfolder.results import ResultsWriter
from attnbench.runfolder.rows import row_for
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SOURCES = {"attnbench": ROOT / "harness" / "attnbench", "attnbench.variants": ROOT / "variants"}


def source_modules() -> dict[str, Path]:
    """Every module of the package in the checkout, by dotted name -> its file."""
    found = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            name = ".".join((package, *path.relative_to(folder).with_suffix("").parts))
            found[name.removesuffix(".__init__")] = path
    return found


def resolves(dotted: str) -> bool:
    """Whether `attnbench.x.y` names something: the longest importable prefix, then attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


DOTTED = r"\battnbench(?:\.[A-Za-z_]\w*)+"  # attnbench.report.verdict.pareto_set, in prose or code


# ---- plugins -------------------------------------------------------------------------------------


def write_plugin(root: Path, dist: str, entries: dict[str, str], modules: dict[str, str]) -> Path:
    """Write an installed-looking distribution under `root`: modules plus `<dist>-0.1.dist-info`."""
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"[{GROUP}]"] + [f"{name} = {target}" for name, target in entries.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return root


# ---- the command line, as a user runs it ---------------------------------------------------------


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 300, **kwargs: Any):
    """`attnbench ARGS` in a fresh interpreter, its output captured as text (the one CLI runner of the tests)."""
    return subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *args],
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        cwd=cwd,
        timeout=timeout,
        **kwargs,
    )


def answer_ctrl_c() -> None:
    """In a child about to start: SIGINT handled as a terminal's Ctrl-C is, even where these tests run as a
    background job (whose shell hands its children SIGINT ignored, and Python then installs no handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def only_run(out: Path) -> Path:
    """The one run folder under `out`."""
    [run] = [p for p in out.iterdir() if p.is_dir()]
    return run


# ---- tiny configs --------------------------------------------------------------------------------

TINY = {"variants": ["full"], "seq_lens": [16], "heads": 1, "head_dim": 8, "min_run_time": 0.01, "min_rounds": 2}


def tiny(**overrides: Any) -> dict[str, Any]:
    """The smallest config that measures something (full at N=16, one head of 8), with `overrides` (the one
    tiny-config builder of the tests: as a dict for `parse_config`, as a file with `write_tiny`)."""
    return {**TINY, **overrides}


def write_tiny(path: Path, text: str = "", **overrides: Any) -> Path:
    """`tiny(**overrides)` as a TOML file at `path`, with `text` appended (more TOML: a key it sets replaces the
    tiny default, and tables)."""
    own = set(re.findall(r"^(\w+)\s*=", text.split("\n[", 1)[0], flags=re.M))  # keys `text` sets before a table
    own |= set(re.findall(r"^\[+\s*(\w+)", text, flags=re.M))  # and its tables ([variants.full], [[inputs]])
    lines = [f"{key} = {toml_value(value)}" for key, value in tiny(**overrides).items() if key not in own]
    path.write_text("\n".join(lines) + "\n" + text)
    return path


# ---- run folders written through the real writer -------------------------------------------------

CURVES = {"full": (1e-8, 2.0, 100.0, 1.0), "band": (1e-5, 1.0, 50.0, 1.0), "strided": (1e-6, 1.5, 400.0, 1.0)}
ERRORS = {"full": 1e-7, "band": 0.3, "strided": 0.1}  # error vs uniform of each


def synthetic_run(folder: Path, scale: dict[str, float] | None = None, iqr: float = 0.01, cpu: str = "cpu A") -> Path:
    """A run folder written through the real writer: three variants, four N, one error and one skipped cell."""
    folder.mkdir(parents=True)
    config = parse_config({"variants": list(CURVES), "seq_lens": [256, 512, 1024, 2048]})
    samples = []
    with ResultsWriter(folder / "results.csv") as writer:
        for cell in config.plan().cells:
            name, n = cell.variant.name, cell.seq_len
            row = row_for(cell, family="exact" if name == "full" else name, exact=True)
            if name == "strided" and n == 2048:
                row.status, row.reason = "skipped", "larger N skipped: over time_budget_s"
            elif name == "band" and n == 256:
                row.status, row.reason = "error", "RuntimeError: constructed failure"
            else:
                a, slope, m, memory_slope = CURVES[name]
                row.time_median_s = a * n**slope * (scale or {}).get(name, 1.0)
                full_time = CURVES["full"][0] * n ** CURVES["full"][1] * (scale or {}).get("full", 1.0)
                row.baseline, row.speedup = "full", full_time / row.time_median_s
                row.speedup_low, row.speedup_high = 0.95 * row.speedup, 1.05 * row.speedup
                row.time_iqr_s = iqr * row.time_median_s
                row.noisy = f"IQR {100 * iqr:.0f}% of the median" if iqr > 0.1 else ""
                samples += [(row.cell_key, i, row.time_median_s * (1 + iqr * (i - 5) / 5)) for i in range(11)]
                row.time_repeats = 5
                row.peak_mem_bytes = int(m * n**memory_slope)
                row.err_vs_uniform = ERRORS[name]
                row.err_rel_fro, row.err_row_cosine, row.err_max_abs = 0.2, 0.9, 0.5
                row.input_entropy, row.input_band_mass, row.input_sink_mass, row.input_head_spread = 0.7, 0.5, 0.1, 0.2
                row.flops = 4 * n * n * 64  # compute-bound at the peaks below: its roofline is flops / 1e11
                row.bytes_moved = 16 * n * 64
            writer.append(row)
    meta = {
        "config": {**config.to_dict(), "name": "synthetic"},
        "machine": {"cpu": cpu, "versions": {"torch": "2.13.0"}},
        "peaks": {"cpu/float32": {"matmul_flops_per_s": 1e11, "copy_bytes_per_s": 1e10}},
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    lines = ["cell_key,round,seconds"] + [f'"{k.replace(chr(34), chr(34) * 2)}",{i},{t!r}' for k, i, t in samples]
    (folder / "samples.csv").write_text("\n".join(lines) + "\n")
    return folder


def edit_rows(run: Path, edit) -> None:
    """Rewrite a run's results.csv with `edit(rows) -> rows` applied (rows as dicts of text)."""

    rows = list(csv.DictReader((run / "results.csv").open()))
    fields = list(rows[0])
    with (run / "results.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(edit(rows))


def empty_run(folder: Path, like: Path) -> Path:
    """A run folder whose results.csv has the header of `like` and no row."""
    folder.mkdir()
    (folder / "results.csv").write_text((like / "results.csv").read_text().splitlines()[0] + "\n")
    return folder


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operator returns (a sub-quadratic variant never builds N x N)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.numel = max([self.numel, *sizes])
        return result


def needle_attention_ranks(inputs, causal: bool = True, context=None):
    """(h, p) where each needle's key ranks among all keys by the attention the other queries pay it (each key's
    exact-softmax column sum, over queries that see it and are no needle's probe, per query that sees it): 0 the
    most attended, 1 the least. With `context` (the same inputs before planting: the background at the same seed),
    the ranks of the keys at the needles' positions there: what the needles would rank if planting changed nothing
    (early keys rank high in causal attention, and needles' keys lie early)."""
    import math

    import torch

    source = inputs if context is None else context
    q, k = source.q[0].double(), source.k[0].double()  # (h, n, d)
    n = q.shape[1]
    logits = torch.einsum("hid,hjd->hij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    probes = torch.zeros(n, dtype=torch.bool)
    probes[inputs.needles.query_positions[0]] = True
    paid = logits.softmax(-1)[:, ~probes].sum(1)  # (h, n)
    seen_by = ((n - torch.arange(n)) if causal else torch.full((n,), n)).double()
    seen_by -= (probes.flip(0).cumsum(0).flip(0) if causal else probes.sum()).double()  # probes at i >= j do not count
    order = (paid / seen_by.clamp(min=1)).argsort(-1, descending=True).argsort(-1)  # (h, n): rank of each key
    return order[:, inputs.needles.key_positions[0]].double() / n


def write_fake_heads(
    root: Path,
    model: str = "SmolLM2-135M",
    layers: int = 4,
    heads: int = 6,
    kv_heads: int = 2,
    positions: int = 300,
    head_dim: int = 16,
    texts: tuple[str, ...] = ("prose", "code"),
    local: float = 0.0,
    scaling: float = 0.3,
) -> Path:
    """A heads cache as `attnbench heads` writes it (manifest last), of random q/k/v: each layer's q scaled so that
    the model's `scaling` differs from 1/sqrt(d); with `local` > 0 each query is nearly its own key times `local`, so
    that attention sits on the diagonal and a short window is nearly exact on them. Returns the model's folder."""
    import json

    import torch
    from attnbench.inputs.captured import write_capture

    folder = root / model
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(len(model))
    for index, text in enumerate(texts):
        q = torch.randn(layers, 1, heads, positions, head_dim, generator=generator)
        k = torch.randn(layers, 1, kv_heads, positions, head_dim, generator=generator)
        v = torch.randn(layers, 1, kv_heads, positions, head_dim, generator=generator)
        if local:  # each query nearly its own key: attention on the diagonal, what a short window keeps
            q = local * k.repeat_interleave(heads // kv_heads, dim=2) + 0.1 * q
        write_capture(folder / f"{text}.pt", {"q": q.half(), "k": k.half(), "v": v.half()},
                      {"text": text, "post_rotary": True, "causal": True, "scaling": [scaling] * layers})  # fmt: skip
    manifest = {"model": model, "positions": positions, "trained_positions": positions, "layers": list(range(layers)),
                "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "scaling": [scaling] * layers,
                "texts": {text: {"file": f"{text}.pt", "source": f"{text}.txt", "tokens": positions} for text in texts}}  # fmt: skip
    (folder / "heads.json").write_text(json.dumps(manifest))
    return folder
