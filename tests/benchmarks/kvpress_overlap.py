"""Our ported presses against kvpress itself: on the same model, prompt and compression ratio, the share of the
positions kvpress keeps that ours keeps too, per layer and key/value head.

    make kvpress-overlap                                   # creates the kvpress venv if missing, then runs this
    python tests/benchmarks/kvpress_overlap.py [--tokens 1024] [--cases snapkv,knorm] [--venv DIR]

kvpress pins transformers < 5.3, so its side (`kvpress_side.py`) runs in a venv of its own (default
~/.cache/attnbench/kvpress-venv, made here when missing: `python -m venv`, then torch and kvpress); it prefills SmolLM2
($ATTNBENCH_MODEL_DIR, default ~/.cache/attnbench/SmolLM2-135M) over the first `--tokens` tokens of the shipped
Python tutorial under each press and ratio, and records what each layer kept and the layer's post-rotary q/k/v. Here
each of our presses builds its state from those same q/k/v (`prefill_state`, with a `PromptContext` per layer from our
own load of the model: the rotary embedding, the output projection), at kvpress's budget
(`n_kept = max(1, int(n (1 - ratio)))`, kvpress's `compute_n_kept`), and the overlap is |ours ∩ kvpress| / |kvpress|
per layer and head. The table (markdown and JSON, under results/kvpress-overlap/, printed) gives per case and ratio
the mean over layers × heads and the least, the mean kept per head on each side, and the case's note: the reason
where a press falls below 0.95 (its documented departure), or what was set to compare like with like.

The cases are data (`CASES`): our variant and hyperparameters beside kvpress's class, keyword arguments and wrapper
presses; every registered scored press naming a kvpress class (`ScoredPress.press`) with no case of its own name is
compared at both sides' defaults. kvpress's side is kept (results/kvpress-overlap/kvpress.pt) and reused case by case
while the prompt and kvpress_side.py are unchanged: a new or changed case runs alone there, a change of ours not at
all.

b - batch (1), h - query heads, g - key/value heads, n - prompt positions, d - head dim, s - kept
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).parent))

from kvpress_side import rows_matched  # noqa: E402

from attnbench.paper_names import ALIASES, KVPRESS_SNAPKV  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(__file__).with_name("kvpress_side.py")
RATIOS = (0.25, 0.5, 0.75, 0.875)
KVPRESS_SPEC = ("torch==2.13.0", "kvpress==0.5.5")  # what a new kvpress venv gets (kvpress pins its transformers)
QUESTION = "\n\nQuestion: What does the tutorial say a list comprehension is?\nAnswer:"  # question-aware presses'
SNAPKV_PRESS = ("SnapKVPress", {"window_size": 64, "kernel_size": 5})  # kvpress's defaults, written out


@dataclass(frozen=True)
class Case:
    """One comparison: our variant with its hyperparameters beside kvpress's press (class, keyword arguments, wrapper
    presses around it, outermost last), over one prompt setting."""

    label: str
    ours: str
    hparams: dict[str, Any] = field(default_factory=dict)
    press: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[tuple[str, dict[str, Any]], ...] = ()
    setting: str = "plain"  # SETTINGS: the prompt and kvpress's attention implementation
    kind: str = "positions"  # or "channels": kept key channels (ThinK), not positions
    ratio_field: str = "compression_ratio"  # the press's argument the ratio sets
    knob: str = "budget"  # KNOBS: our hyperparameter the ratio sets
    note: str = ""  # why the overlap falls short, where it does: a documented departure

    def job(self) -> dict[str, Any]:
        """What kvpress's side needs of it."""
        wrappers = [[name, kwargs] for name, kwargs in self.wrappers]  # as JSON reads it back
        return {"label": self.label, "press": self.press, "kwargs": self.kwargs, "wrappers": wrappers,
                "setting": self.setting, "kind": self.kind, "ratio_field": self.ratio_field}  # fmt: skip

    def ours_label(self) -> str:
        """Our variant as written on a command line, its ratio knob left out, e.g. snapkv(window=64, kernel=5)."""
        return f"{self.ours}({', '.join(f'{k}={v!r}' for k, v in self.hparams.items())})"

    def kvpress_label(self) -> str:
        """kvpress's press as code, e.g. AdaKVPress(SnapKVPress(window_size=64))."""
        text = f"{self.press}({', '.join(f'{k}={v!r}' for k, v in self.kwargs.items())})"
        for wrapper, kwargs in self.wrappers:
            text = f"{wrapper}({', '.join([text, *(f'{k}={v!r}' for k, v in kwargs.items())])})"
        return text


SETTINGS = {  # name -> (kvpress's attention implementation, the question appended)
    "plain": ("sdpa", False),
    "eager": ("eager", False),  # ObservedAttentionPress reads the attention weights (eager only)
    "question": ("sdpa", True),  # Finch: the question ends the prompt (kvpress: after a delimiter it removes)
}

KNOBS = {  # our hyperparameter a kvpress compression ratio sets, from the prompt's length n and the ratio
    "budget": lambda n, ratio: n_kept(n, ratio),  # positions kept per head
    # StreamingLLM (band with 4 sinks) holds its sinks and the last window + 1 positions (generation/budgets.py)
    "window": lambda n, ratio: n_kept(n, ratio) - 4 - 1,
    "key_channels": lambda n, ratio: 1 - ratio,  # ThinK: the share of key channels kept
    "head_compression_ratio": lambda n, ratio: ratio,  # DuoAttention: the share of heads made streaming heads
}

def alias(name: str) -> tuple[str, dict[str, Any]]:
    """A method a paper names (`attnbench.paper_names.ALIASES`: how `attnbench generate` runs kvpress's wrapper
    presses) as our variant and its hyperparameters."""
    setting = dict(ALIASES[name])
    return setting.pop("name"), setting


CASES = (
    Case("snapkv", "snapkv", KVPRESS_SNAPKV, *SNAPKV_PRESS),
    Case("random", "random", {}, "RandomPress", {"seed": 0},
         note="the same draw: torch.rand over (b, g, n) from a generator seeded 0 on both sides"),
    Case("observed-attention", "observed-attention", {}, "ObservedAttentionPress", setting="eager"),
    Case("streamingllm", *alias("streamingllm"), "StreamingLLMPress", {"n_sink": 4}, knob="window"),
    Case("pyramidkv", *alias("pyramidkv"), "PyramidKVPress", {"window_size": 64, "kernel_size": 5}),
    Case("adakv-snapkv", *alias("adakv-snapkv"), *SNAPKV_PRESS, wrappers=(("AdaKVPress", {}),)),
    Case("chunkkv", *alias("chunkkv"), *SNAPKV_PRESS, wrappers=(("ChunkKVPress", {"chunk_length": 20}),),
         note="kvpress keeps whole chunks, int(chunks (1 - ratio)) of them; ours `budget` positions: the same chunks "
              "and the first positions of the next"),
    Case("criticalkv", *alias("criticalkv"), *SNAPKV_PRESS, wrappers=(("CriticalKVPress", {}),)),
    Case("critical-adakv", *alias("critical-adakv"), *SNAPKV_PRESS, wrappers=(("CriticalAdaKVPress", {}),)),
    Case("adakv-expected-attention", *alias("adakv-expected-attention"), "ExpectedAttentionPress", {"epsilon": 0.01},
         wrappers=(("AdaKVPress", {}),)),
    Case("adakv-compactor", *alias("adakv-compactor"), "CompactorPress", wrappers=(("AdaKVPress", {}),)),
    Case("finch", "finch", {}, "FinchPress", {"rerotate_keys": False}, setting="question",
         note="kvpress re-rotates the keys it keeps (rerotate_keys=True): run without, the same positions are kept"),
    Case("kvzip", "kvzip", {"heads": "adaptive", "safeguard": 0.0}, "KVzipPress", {"layerwise": True},
         note="the scores agree (our repeat pass against kvpress's, within 1e-5); kvpress 0.5.5 always keeps each "
              "head's first 4 positions (compress_post raises them above every score), ours ranks them by their "
              "scores as kvpress before 0.5.5 did: a head left little more than its sinks differs. With 0.5.5's "
              "sinks on the same scores the kept sets are kvpress's exactly"),
    Case("kvzip-default", "kvzip", {}, "KVzipPress", {},
         note="kvpress's default (layerwise=False) spreads one budget over every layer and head of the model; ours "
              "keeps `budget` per head in every layer (`kvzip`'s docstring: kvpress's layerwise=True is "
              "heads='adaptive', safeguard=0, the row above)"),
    Case("think", "think", {}, "ThinKPress", kind="channels", ratio_field="key_channel_compression_ratio",
         knob="key_channels"),
    Case("duo-attention", "duo-attention", {}, "DuoAttentionPress", {"on_the_fly_scoring": True},
         ratio_field="head_compression_ratio", knob="head_compression_ratio",
         note="kvpress ranks the heads of the whole model, ours those of each layer (`streaming_count`, the same "
              "number in all); ranked over the model, our head scores pick kvpress's streaming heads exactly. A head "
              "streaming on one side only keeps 384 of the other's 1024 positions (0.375)"),
)  # fmt: skip


def all_cases(registry: Any) -> list[Case]:
    """CASES, then every registered scored press naming a kvpress class (`ScoredPress.press`) with no case of its own
    name, both sides at their defaults."""
    from attnbench.variants.press import ScoredPress

    cases, covered = list(CASES), {c.label for c in CASES}
    for name in registry.names():
        try:
            cls = registry.load(name)
        except Exception:  # a broken plugin: `attnbench list` says why
            continue
        if issubclass(cls, ScoredPress) and cls.press and name not in covered:
            cases.append(Case(name, name, {}, cls.press))
    return cases


# ---- the overlap arithmetic ---------------------------------------------------------------------------------------


def n_kept(n: int, ratio: float) -> int:
    """Positions per head kvpress keeps of n at `ratio` (kvpress/utils.py compute_n_kept)."""
    return max(1, int(n * (1 - ratio)))


def overlap(ours: Tensor, theirs: Tensor) -> float:
    """|ours ∩ theirs| / |theirs|: the share of kvpress's kept positions (or channels) that ours keeps too (1 when
    neither keeps any)."""
    if len(theirs) == 0:
        return 1.0 if len(ours) == 0 else 0.0
    return float(torch.isin(theirs, ours).sum()) / len(theirs)


@dataclass
class Overlap:
    """One press at one ratio: the overlap per layer and head, and the mean number each side kept per head."""

    table: list[list[float]]  # [layer][head]
    ours_kept: float
    theirs_kept: float

    @classmethod
    def of(cls, ours: list[list[Tensor]], theirs: list[list[Tensor]]) -> "Overlap":
        """ours, theirs: [layer][head] the positions kept (s,)."""
        table = [[overlap(o, t) for o, t in zip(mine, kvp, strict=True)]
                 for mine, kvp in zip(ours, theirs, strict=True)]  # fmt: skip
        return cls(table, mean_size(ours), mean_size(theirs))

    @property
    def mean(self) -> float:
        return sum(map(sum, self.table)) / sum(map(len, self.table))

    @property
    def least(self) -> tuple[float, int, int]:
        """The smallest overlap, its layer and head."""
        return min((value, layer, head) for layer, row in enumerate(self.table) for head, value in enumerate(row))


def mean_size(kept: list[list[Tensor]]) -> float:
    return sum(len(head) for layer in kept for head in layer) / sum(map(len, kept))


def table_markdown(rows: list[dict[str, Any]], ratios: tuple[float, ...]) -> str:
    """The table: per case our press and kvpress's, per ratio the mean overlap over layers × heads (the least after
    the slash), the mean kept per head on each side, and the case's note (its departure, where it has one)."""
    head = ["case", "ours", "kvpress", *(f"ratio {r}" for r in ratios), "kept per head, ours / kvpress", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * len(ratios) + "---|---|"]
    for row in rows:
        start = f"| {row['label']} | `{row['ours']}` | `{row['kvpress']}` | "
        if "error" in row:
            lines.append(start + " | ".join([row["error"]] + [""] * len(ratios)) + f" | {row['note']} |")
            continue
        by_ratio = {r["ratio"]: r for r in row["ratios"]}
        cells = [f"{by_ratio[r]['mean']:.3f} / {by_ratio[r]['min']:.2f}" for r in ratios]
        kept = ", ".join(f"{by_ratio[r]['ours_kept']:.4g}/{by_ratio[r]['kvpress_kept']:.4g}" for r in ratios)
        lines.append(start + " | ".join(cells) + f" | {kept} | {row['note']} |")
    return "\n".join(lines) + "\n"


# ---- kvpress's side -----------------------------------------------------------------------------------------------


def ensure_venv(venv: Path) -> Path:
    """The kvpress venv's python, the venv made first when missing (a few minutes: torch and kvpress)."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    print(f"creating the kvpress venv in {venv} ({' '.join(KVPRESS_SPEC)})", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *KVPRESS_SPEC], check=True)
    return python


def prompt_settings(model_dir: Path, tokens: int) -> dict[str, dict[str, Any]]:
    """SETTINGS as kvpress's side takes them: the prompt's ids (the first `tokens` of the shipped tutorial, the
    question after them where the setting asks), the attention implementation, the question's length."""
    from attnbench.model.texts import TUTORIAL
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    context = tokenizer.encode(TUTORIAL.read_text()[: tokens * 8], add_special_tokens=False)[:tokens]
    if len(context) < tokens:
        raise SystemExit(f"the shipped tutorial gives {len(context)} tokens, fewer than --tokens {tokens}")
    question = tokenizer.encode(QUESTION, add_special_tokens=False)
    return {
        name: {"attention": attention, "ids": context + (question if asks else []), "question": len(question) * asks}
        for name, (attention, asks) in SETTINGS.items()
    }


def kvpress_side(python: Path, prompt: dict[str, Any], cases: list[Case], out: Path) -> dict[str, Any]:
    """kvpress's kept positions and the prompts' q/k/v (kvpress_side.py's OUT.pt, its job's "prompt" and "cases" kept
    beside): out/kvpress.pt, where each case already run on the same prompt is reused, so that only new or changed
    cases run on kvpress's side."""
    pt, job_path, fresh = out / "kvpress.pt", out / "kvpress-job.json", out / "kvpress-new.pt"
    stored = torch.load(pt, weights_only=False) if pt.exists() else None
    if stored is None or stored["prompt"] != prompt:
        stored = {"prompt": prompt, "cases": {}, "settings": {}, "kept": {}, "errors": {}, "seconds": {}}
    todo = [c for c in cases if stored["cases"].get(c.label) != c.job()]
    if not todo:
        print(f"kvpress's side: every case reused from {pt}", flush=True)
        return stored
    print(f"kvpress's side: {len(todo)} case(s) to run ({len(cases) - len(todo)} reused from {pt})", flush=True)
    job_path.write_text(json.dumps({**prompt, "cases": [c.job() for c in todo]}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}  # fmt: skip
    subprocess.run([str(python), str(SIDE), str(job_path), str(fresh)], check=True, env=env)
    new = torch.load(fresh, weights_only=False)
    for key in ("kept", "errors", "seconds"):
        for case in todo:
            stored[key].pop(case.label, None)
        stored[key].update(new[key])
    stored["settings"], stored["versions"] = new["settings"], new["versions"]
    stored["cases"].update({c.label: c.job() for c in todo})
    torch.save(stored, pt)
    fresh.unlink()
    return stored


# ---- our side ---------------------------------------------------------------------------------------------------


def our_kept(state: Any, k: Tensor) -> list[Tensor]:
    """Per head of k (1, g, n, d), the keys the state was built from, the sorted positions (or key channels) our
    press's state keeps of them: a channel cache's channels (ThinK), a ragged cache's positions (head-wise budgets),
    else the keys a cache holds matched to the prompt's."""
    g = k.shape[1]
    if hasattr(state, "channels"):
        return list(state.channels[0])
    if hasattr(state, "positions") and hasattr(state, "offsets"):
        bounds = state.offsets.tolist()
        return [state.positions[start:end].sort().values for start, end in zip(bounds[:g], bounds[1 : g + 1])]
    kept = state.kept()
    if kept is None:
        raise ValueError(f"{type(state).__name__} does not say what it keeps (`kept()`)")
    return [rows_matched(kept[0][0, head], k[0, head]).sort().values for head in range(g)]


def repeat_scores_of(model: Any, model_dir: Path, prompt: dict[str, Any], ids: list[int]) -> list[Tensor]:
    """KVzip's scores of the prompt (per layer (1, g, n)) by our repeat pass over kvpress's q/k/v, as our generation
    runs it (`attnbench.generation.repeat_pass`), for `PromptContext.pass_scores`."""
    from attnbench.generation.decoder import InModelDecoder
    from attnbench.generation.layers import ExactPrompt
    from attnbench.generation.repeat_pass import RepeatPrompt, repeat_scores
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    repeat = RepeatPrompt.of(lambda text: tokenizer.encode(text, add_special_tokens=False))
    exact = ExactPrompt(layers=list(zip(prompt["q"], prompt["k"], prompt["v"])))
    return repeat_scores(InModelDecoder(model, set(), repeat=repeat).forward, exact, torch.tensor(ids), repeat)


def compare(case: Case, ratios: tuple[float, ...], kvpress: dict[str, Any], contexts: dict[str, list]) -> dict:
    """One case at every ratio: our press over kvpress's q/k/v, as the generation hands them to it (`kv_for`: k and
    v repeated for every query head for a variant that does not keep per key/value head, each query head then held
    against its key/value head's kept positions), its kept positions against kvpress's."""
    from attnbench.generation.layers import kv_for
    from attnbench.registry import registry

    row: dict[str, Any] = {"label": case.label, "ours": case.ours_label(), "kvpress": case.kvpress_label(),
                           "note": case.note, "ratios": []}  # fmt: skip
    if case.label in kvpress["errors"]:
        return {**row, "error": f"kvpress failed: {kvpress['errors'][case.label]}"}
    prompt = kvpress["settings"][case.setting]
    n = prompt["k"][0].shape[-2]
    for ratio in ratios:
        variant = registry.create(case.ours, **{case.knob: KNOBS[case.knob](n, ratio)}, **case.hparams)
        ours = []
        for layer, (q, k, v) in enumerate(zip(prompt["q"], prompt["k"], prompt["v"])):
            k, v = kv_for(variant, q, k, v)
            ours.append(our_kept(variant.for_prompt(contexts[case.setting][layer]).prefill_state(q, k, v), k))
        theirs = kvpress["kept"][case.label][str(ratio)]
        group = len(ours[0]) // len(theirs[0])
        result = Overlap.of(ours, [[head for head in layer for _ in range(group)] for layer in theirs])
        least, layer, head = result.least
        row["ratios"].append({"ratio": ratio, "mean": result.mean, "min": least, "min_at": [layer, head],
                              "ours_kept": result.ours_kept, "kvpress_kept": result.theirs_kept,
                              "per_layer_head": result.table})  # fmt: skip
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="the prompt's length (default 1024)")
    parser.add_argument("--ratios", type=lambda s: tuple(map(float, s.split(","))), default=RATIOS)
    parser.add_argument("--cases", default="", help="comma-separated case labels (default: every case)")
    parser.add_argument("--venv", type=Path, default=Path.home() / ".cache" / "attnbench" / "kvpress-venv")
    parser.add_argument("--model-dir", type=Path, default=Path(os.environ.get(
        "ATTNBENCH_MODEL_DIR", Path.home() / ".cache" / "attnbench" / "SmolLM2-135M")))  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "kvpress-overlap")
    args = parser.parse_args()
    if not (args.model_dir / "config.json").exists():
        print(f"no model in {args.model_dir}: run `make model` (or set ATTNBENCH_MODEL_DIR)")
        return 2
    from attnbench.generation.context import layer_contexts
    from attnbench.model.study import load_model
    from attnbench.registry import registry
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    started = time.perf_counter()
    cases = all_cases(registry)
    if args.cases:
        wanted = args.cases.split(",")
        unknown = sorted(set(wanted) - {c.label for c in cases})
        if unknown:
            print(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(c.label for c in cases)}")
            return 2
        cases = [c for c in cases if c.label in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    settings = prompt_settings(args.model_dir, args.tokens)
    side = hashlib.sha256(SIDE.read_bytes()).hexdigest()  # kvpress's side changed: every case runs again
    prompt = {"model_dir": str(args.model_dir), "ratios": list(args.ratios), "settings": settings, "side": side}
    kvpress = kvpress_side(ensure_venv(args.venv), prompt, cases, args.out)
    model, _ = load_model(args.model_dir)
    repeated = {c.setting for c in cases if getattr(registry.load(c.ours), "repeat_pass", False)}  # KVzip's
    contexts = {}
    for name, captured in kvpress["settings"].items():
        scores = repeat_scores_of(model, args.model_dir, captured, settings[name]["ids"]) if name in repeated else None
        contexts[name] = layer_contexts(model, len(captured["k"]), captured["question"], scores)
    rows = []
    with torch.no_grad():
        for case in cases:
            try:
                rows.append(compare(case, args.ratios, kvpress, contexts))
            except Exception as error:  # one port failing (being written, refusing the setting) is a row that says so
                rows.append({"label": case.label, "ours": case.ours_label(), "kvpress": case.kvpress_label(),
                             "note": case.note, "error": f"ours failed: {type(error).__name__}: {error}"})  # fmt: skip
    seconds = time.perf_counter() - started
    table = table_markdown(rows, args.ratios)
    n = len(settings["plain"]["ids"])
    header = (f"kvpress {kvpress['versions']} against attnbench on {args.model_dir.name}, a prompt of {n} tokens "
              f"(the shipped Python tutorial), float32 on both sides; mean overlap over layers × key/value heads / "
              f"the least; {seconds:.0f} s\n\n")  # fmt: skip
    (args.out / "overlap.md").write_text(header + table)
    (args.out / "overlap.json").write_text(json.dumps({"tokens": n, "versions": kvpress["versions"],
                                                       "seconds": seconds, "rows": rows}, indent=1))  # fmt: skip
    print(header + table + f"written to {args.out}/overlap.md and overlap.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
