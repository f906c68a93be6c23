"""`attnbench heads MODEL_DIR`: a causal decoder's own heads on the shipped texts, kept where the `heads` input finds
them (`attnbench.inputs.heads_cache`). `make model` runs it for SmolLM2-135M; any local causal decoder works the same
way (nothing is downloaded).

Per text (prose and code, `attnbench.model.texts.HEADS_TEXTS`) the model runs once on its first P tokens, P the
model's own positions (at most `MAX_POSITIONS`; each text to its own length, said, where it is shorter in the
model's tokenizer: the manifest gives each text's positions, and `positions` the fewest) and
`DECODE_HEADROOM` more (a decode cell's steps after a prompt of the model's full length: 0.8% past its trained
positions at 8K, said in the manifest), and the post-rotary q/k/v of `DEPTHS` layers spread over its depth are
written in float16 (the file the `captured` input reads too, with its description). A hybrid model (Gemma 3: five
sliding-window layers of each six) keeps its global layers alone, the ones whose attention spans the whole sequence,
and its manifest says so. The manifest is written last, into a folder beside the model's that replaces it whole: a
capture that fails or is stopped half-way leaves the previous one as it was.

l - layer, b - batch, h - heads, g - key/value heads, n - positions, d - head dim
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from attnbench.inputs.heads_cache import MANIFEST, heads_root

DEPTHS = 10  # layers kept, spread over the depth (every third of SmolLM2's 30): held-out splits keep 5 and 5
MAX_POSITIONS = 32768  # the most a capture takes by default (a model's own positions, capped): Gemma-3-270M's 32K
DECODE_HEADROOM = 64  # positions past that: the steps a decode cell generates after a prompt of the full length


def depth_layers(count: int, keep: int = DEPTHS) -> list[int]:
    """`keep` layers of `count` spread evenly over the depth (all of them when there are fewer)."""
    if count <= keep:
        return list(range(count))
    return sorted({min(count - 1, int((i + 0.5) * count / keep)) for i in range(keep)})


def kept_layers(config: object) -> tuple[list[int], str]:
    """The layers captured, spread over the depth (`depth_layers`): of a hybrid model its global layers alone (a
    sliding-window layer's attention is its window, not the sequence); and what the manifest says of them."""
    from attnbench.model.layer_kinds import global_layers, layer_windows

    windows = layer_windows(config)
    count = int(getattr(config, "num_hidden_layers", len(windows)))
    pool = global_layers(config) or list(range(count))  # every layer sliding (Mistral's): each its window
    kept = [pool[i] for i in depth_layers(len(pool))]
    sizes = sorted({w for w in windows if w is not None})
    if len(pool) == count:
        return kept, f"every layer slides over {sizes[0]} keys" if sizes else "every layer's attention is global"
    return kept, (f"global layers only: {len(pool)} of {count} attend over the whole sequence; the other "
                  f"{count - len(pool)} slide over {', '.join(map(str, sizes))} keys and are left out")  # fmt: skip


def capture_heads(
    model_dir: Path, *, positions: int | None = None, say: Callable[[str], None] | None = None
) -> Path:
    """Capture `model_dir`'s heads on each shipped text into heads_root()/<folder name>/; the folder written."""
    from transformers import AutoTokenizer

    from attnbench.model.capture import CaptureError, model_config
    from attnbench.model.texts import HEADS_TEXTS, heads_text

    say = say or (lambda line: print(f"attnbench: {line}", file=sys.stderr, flush=True))
    config = model_config(model_dir, "attnbench heads")
    limit = getattr(config, "max_position_embeddings", None) or MAX_POSITIONS
    prompt = positions or min(MAX_POSITIONS, limit)
    if prompt > limit:
        raise CaptureError(f"--positions {prompt} is beyond the model's {limit} positions (what it was trained on)")
    asked, positions = positions, prompt + DECODE_HEADROOM
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokens = {name: tokenizer(heads_text(name), return_tensors="pt").input_ids for name in HEADS_TEXTS}
    given = {name: int(ids.shape[-1]) for name, ids in tokens.items()}
    if asked is None:  # the default: each text as far as it goes, up to the model's positions and the headroom
        limited = {name: f"the shipped {HEADS_TEXTS[name][0].name} gives {count} tokens with this tokenizer"
                   for name, count in given.items() if count < positions}  # fmt: skip
        for name in limited:
            say(f"note: the shipped {HEADS_TEXTS[name][0].name} gives {given[name]} tokens with {model_dir.name}'s "
                f"tokenizer, fewer than {prompt} positions and {DECODE_HEADROOM} for decode steps: the {name} is "
                f"captured at {given[name]} (no cell needing more is drawn from it; a longer shipped text would reach "
                "the rest)")  # fmt: skip
    else:
        limited = {}
        short = [f"{HEADS_TEXTS[name][0].name} gives {count}" for name, count in given.items() if count < positions]
        if short:
            raise CaptureError(f"{', '.join(short)} tokens with this tokenizer, fewer than the {positions} asked "
                               f"({prompt} and {DECODE_HEADROOM} for decode steps): give a smaller --positions")  # fmt: skip
    if tiny := [HEADS_TEXTS[name][0].name for name, count in given.items() if count <= DECODE_HEADROOM]:
        raise CaptureError(f"{', '.join(tiny)}: {DECODE_HEADROOM} tokens or fewer with this tokenizer: too short")
    tokens = {name: ids[:, :positions] for name, ids in tokens.items()}  # (1, n): each text to its own length
    folder = heads_root() / model_dir.name
    try:  # written beside the folder and swapped in whole: a failed or stopped capture leaves the old one
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=folder.parent))
    except OSError as error:
        raise CaptureError(f"{folder.parent}: cannot be written ({error.strerror or error}); set ATTNBENCH_HEADS to "
                           "a folder that can") from None  # fmt: skip
    try:
        return _capture_into(partial, folder, model_dir, tokens, limit, say, limited)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _capture_into(
    partial: Path, folder: Path, model_dir: Path, tokens: dict[str, Any], limit: int, say: Callable[[str], None],
    limited: dict[str, str] | None = None,
) -> Path:
    """Run the model on each text's tokens, write its files and manifest into `partial`, then make it `folder`.
    `limited`: the texts that gave fewer tokens than the model's positions, and why (their manifest entries say)."""
    import json

    from attnbench.atomic import write_text_atomic
    from attnbench.inputs.captured import write_capture
    from attnbench.model.capture import CaptureError, load_base_model, record_qkv
    from attnbench.model.texts import HEADS_TEXTS, heads_text

    model, config = load_base_model(model_dir, "attnbench heads")
    kept, attention = kept_layers(config)
    texts: dict[str, Any] = {}
    scaling: list[float] = []
    for name, ids in tokens.items():
        source = " + ".join(path.name for path in HEADS_TEXTS[name])
        started = time.perf_counter()
        layers, where, causal, scaling = record_qkv(model, config, ids, model_dir=model_dir, keep=kept)
        if not causal or not where.startswith("attention") or len(layers["q"]) != len(kept):
            raise CaptureError(f"{model_dir}: its attention was recorded at the {where}, causal={causal}, "
                               f"{len(layers['q'])} of layers {kept}; the heads input needs a causal decoder whose "
                               "attention goes through transformers' interface")  # fmt: skip
        tensors = {role: torch.stack(values).contiguous() for role, values in layers.items()}
        half = {role: tensor.half() for role, tensor in tensors.items()}
        if all(torch.isfinite(t).all() for t in half.values()):  # float16 halves the disk; kept float32 otherwise
            tensors = half
        meta = {"model": str(model_dir), "model_type": getattr(config, "model_type", None), "text": source,
                "positions": int(ids.shape[-1]), "recorded_at": where, "rotary": "rotary" in where,
                "post_rotary": "post-rotary" in where, "causal": True, "scaling": scaling, "layers": kept}  # fmt: skip
        write_capture(partial / f"{name}.pt", tensors, meta)
        texts[name] = {"file": f"{name}.pt", "source": source, "tokens": int(ids.shape[-1])}
        if limited and name in limited:  # this text ran out before the model's positions
            texts[name]["limited_by"] = limited[name]
        say(f"{model_dir.name}: {len(kept)} layers' heads on the {name} ({source}, {ids.shape[-1]} tokens) in "
            f"{time.perf_counter() - started:.0f} s")  # fmt: skip
        del layers, tensors, half
    q_heads = int(getattr(config, "num_attention_heads"))
    manifest = {
        "model": model_dir.name,
        "model_dir": str(model_dir),
        "positions": min(entry["tokens"] for entry in texts.values()),  # what every text serves; each its "tokens"
        "trained_positions": int(limit),  # the model's own; positions past it are a decode cell's headroom
        "layers": kept,
        "of_layers": int(getattr(config, "num_hidden_layers", len(kept))),
        "attention": attention,  # which layers' attention: a hybrid model's global ones alone
        "heads": q_heads,
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or q_heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // q_heads),
        "scaling": scaling,
        "texts": texts,
        "recorded_at": "attention function, post-rotary q/k, causal",
        "made": time.strftime("%Y-%m-%d"),
    }
    if limited:  # fewer positions than the model's in some text: what stopped them (each text's entry says its own)
        manifest["limited_by"] = "; ".join(limited.values())
    write_text_atomic(partial / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder
