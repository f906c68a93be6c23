"""`attnbench capture`: per-layer, per-head Q/K/V of a local Hugging Face model on given tokens.

By default q, k, v are recorded where attention sees them: at transformers' attention function (its
`AttentionInterface`), after the model's rotary position embedding, with grouped-query K/V heads kept as the
model's K/V heads and the model's attention scaling recorded. The call itself is transformers' own SDPA, so the
model computes what it always computes; a sliding-window layer (Gemma 3's) over a whole unpadded sequence is computed
block-wise over its window instead (`band`, exact on its support), never through an n x n mask (1 GiB of booleans at
32K positions, and full attention's work in each such layer: twice the time of the whole pass at 8K). `keep` records
some layers only. `pre_rotary=True` records the q/k/v projections' outputs instead (what older captures held:
position-free attention for a rotary model). Models whose attention does not go through the
interface fall back to the projections, and the file says so. Nothing is downloaded.

b - batch, h - heads, g - key/value heads, n - sequence, d - head dim, l - layer
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "query": "q", "key": "k", "value": "v"}
RECORDING = "attnbench-capture"  # the attention implementation that records, then runs SDPA


class CaptureError(ValueError):
    """The model or the tokens cannot be used; the message says what to do."""


def require_local_model(model_dir: Path, command: str) -> None:
    """Nothing is downloaded: transformers must be installed and `model_dir` a local model folder.
    CaptureError (a ValueError) says which is missing."""
    import importlib.util

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub
    if importlib.util.find_spec("transformers") is None:
        raise CaptureError(f"{command} needs transformers: pip install -e '.[capture]' (from the attnbench checkout)")
    if not (model_dir / "config.json").is_file():
        raise CaptureError(f"{model_dir} is not a local model folder (no config.json); nothing is downloaded")


def model_config(model_dir: Path, command: str) -> object:
    """The local model's config as transformers reads it. CaptureError (before any weight is read) when the folder
    is not a local model, or its config.json is not JSON or names a model type this transformers does not know."""
    require_local_model(model_dir, command)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
    except Exception as error:  # OSError (not JSON), ValueError/KeyError (no or an unknown model_type), ...
        text = " ".join(str(error).split())
        text = text if len(text) <= 300 else text[:299] + "…"
        raise CaptureError(f"{model_dir / 'config.json'} cannot be used ({type(error).__name__}: {text})") from None


def load_base_model(model_dir: Path, command: str = "capture") -> tuple[nn.Module, object]:
    """The model without its head, float32, SDPA attention; CaptureError when it cannot be loaded."""
    config = model_config(model_dir, command)
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(
            str(model_dir), config=config, local_files_only=True, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
    except Exception as error:  # missing or damaged weights
        raise CaptureError(f"could not load {model_dir}: {type(error).__name__}: {error}") from None
    return model, model.config


def _tokens(
    model_dir: Path,
    config: object,
    *,
    text: str | None,
    token_ids: list[int] | None,
    random_tokens: int | None,
    seed: int,
) -> Tensor:
    if sum(x is not None for x in (text, token_ids, random_tokens)) != 1:
        raise CaptureError("give exactly one of --text, --token-ids, --random-tokens")
    if text is not None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as error:
            raise CaptureError(f"no tokenizer in {model_dir} ({error}); use --token-ids or --random-tokens") from None
        return tokenizer(text, return_tensors="pt").input_ids
    if token_ids is not None:
        return torch.tensor([token_ids])
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(config.vocab_size, (1, random_tokens), generator=generator)


def check_tokens(ids: Tensor, config: object, asked: int | None = None) -> None:
    """CaptureError before the model runs: no token, an id outside the vocabulary, more tokens than the model's
    positions (a rotary model would run on, past what it was trained for, and hold GBs); a note when the text gave
    fewer tokens than asked."""
    count = ids.shape[-1]
    if count == 0:
        raise CaptureError("the input gives no token")
    vocabulary = getattr(config, "vocab_size", None)
    if vocabulary and (int(ids.max()) >= vocabulary or int(ids.min()) < 0):
        raise CaptureError(f"token id {int(ids.max())} is outside the model's vocabulary of {vocabulary} ids")
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and count > limit:
        raise CaptureError(f"the input gives {count} tokens, beyond the model's {limit} positions: give --seq-len {limit} or fewer")
    if asked and count < asked:
        import sys

        print(f"attnbench: the input gives {count} token(s), fewer than --seq-len {asked}", file=sys.stderr)


def has_rotary(config: object) -> bool:
    """Whether the model turns q and k by rotary position phases inside its attention (Llama, Mistral, Qwen, …)."""
    return any(
        getattr(config, name, None) is not None for name in ("rope_theta", "rope_parameters", "rope_scaling")
    ) or getattr(config, "position_embedding_type", None) == "rotary"


# ---- recording at the attention function (post-rotary) ---------------------------------------------


@dataclass
class AttentionRecord:
    """What each self-attention call saw, in call order: q (b, h, n, d), k and v (b, g, n, d), its scaling,
    and whether it was causal."""

    q: list[Tensor] = field(default_factory=list)
    k: list[Tensor] = field(default_factory=list)
    v: list[Tensor] = field(default_factory=list)
    scaling: list[float] = field(default_factory=list)
    causal: list[bool] = field(default_factory=list)
    keep: frozenset[int] | None = None  # the self-attention calls (layers, in call order) recorded; None: all
    calls: int = 0  # self-attention calls seen

    def wants(self) -> bool:
        """Whether this self-attention call is one to record (and count it)."""
        self.calls += 1
        return self.keep is None or self.calls - 1 in self.keep


_ACTIVE: AttentionRecord | None = None


def _recording_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Any]:
    """transformers' SDPA attention (a sliding-window layer's unmasked call: `windowed_attention`), after writing
    down its inputs into the active record."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    window = kwargs.get("sliding_window")
    if window is not None and attention_mask is None and query.shape[-2] == key.shape[-2]:
        output, weights = windowed_attention(query, key, value, int(window), kwargs.get("scaling")), None
    else:
        output, weights = ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)
    record = _ACTIVE
    if record is not None and query.shape[-2] == key.shape[-2] and record.wants():  # self-attention only
        scaling = kwargs.get("scaling")
        record.q.append(query.detach().float())
        record.k.append(key.detach().float())
        record.v.append(value.detach().float())
        record.scaling.append(float(scaling) if scaling is not None else query.shape[-1] ** -0.5)
        record.causal.append(bool(kwargs.get("is_causal", getattr(module, "is_causal", False))))
    return output, weights


def windowed_attention(query: Tensor, key: Tensor, value: Tensor, window: int, scaling: float | None) -> Tensor:
    """A causal sliding-window layer's attention, as transformers computes it (a query sees the last `window` keys,
    its own included), block-wise: query (b, h, n, d), key/value (b, g, n, d) -> (b, n, h, d)."""
    from attnbench.interface import expand_kv_heads, query_group
    from attnbench.model.attention import band_window
    from attnbench.registry import registry

    if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5):
        query = query * (scaling * query.shape[-1] ** 0.5)  # band scales by 1/sqrt(d)
    group = query_group(query, key)
    band = registry.create("band", window=band_window(window))
    output = band(query, expand_kv_heads(key, group), expand_kv_heads(value, group), causal=True, key_padding_mask=None)
    return rearrange(output, "b h n d -> b n h d").contiguous()


def _recording_mask(batch_size: int, q_length: int, kv_length: int, *args: Any, **kwargs: Any) -> Tensor | None:
    """transformers' SDPA mask, but none for a sliding-window layer over a whole sequence without padding: the
    recording attention windows it itself (`windowed_attention`)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    padding = kwargs.get("attention_mask")
    whole = q_length == kv_length and not args and not kwargs.get("q_offset") and not kwargs.get("kv_offset")
    if kwargs.get("local_size") is not None and whole and (padding is None or bool(padding.all())):
        return None
    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](batch_size, q_length, kv_length, *args, **kwargs)


def _register_recording() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(RECORDING, _recording_attention)
    AttentionMaskInterface.register(RECORDING, _recording_mask)


def record_attention(model: nn.Module, ids: Tensor, keep: list[int] | None = None) -> AttentionRecord:
    """Run `model` on `ids` once and return what its attention function saw (post-rotary q/k), of the layers in
    `keep` alone when given (by call order). Empty when the model's attention does not go through transformers'
    attention interface."""
    global _ACTIVE
    _register_recording()
    previous = getattr(model.config, "_attn_implementation", "sdpa")
    record = AttentionRecord(keep=None if keep is None else frozenset(keep))
    try:
        model.set_attn_implementation(RECORDING)
    except Exception:  # an architecture that does not take attention implementations
        return record
    _ACTIVE = record
    try:
        with torch.no_grad():
            model(input_ids=ids, **({"use_cache": False} if getattr(model.config, "use_cache", None) is not None else {}))
    finally:
        _ACTIVE = None
        model.set_attn_implementation(previous)
    return record


# ---- recording at the projections (pre-rotary) ------------------------------------------------------


def record_projections(model: nn.Module, ids: Tensor, head_dim: int) -> dict[str, list[Tensor]]:
    """The q/k/v projections' outputs (b, heads, n, d) of each layer, in layer order."""
    recorded: dict[str, dict[str, Tensor]] = {}

    def hook(layer: str, role: str):
        def record(module: nn.Module, args: tuple, output: Tensor) -> None:
            recorded.setdefault(layer, {})[role] = rearrange(output.detach(), "b n (h d) -> b h n d", d=head_dim)

        return record

    handles = [
        module.register_forward_hook(hook(name.rsplit(".", 1)[0], ROLES[name.rsplit(".", 1)[-1]]))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in ROLES
    ]
    if not handles:
        raise CaptureError(f"no q/k/v projections found in {type(model).__name__} (looked for {', '.join(ROLES)})")
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    layers = [roles for roles in recorded.values() if set(roles) == {"q", "k", "v"}]
    return {role: [layer[role] for layer in layers] for role in ("q", "k", "v")}


# ---- the command ------------------------------------------------------------------------------------


def record_qkv(
    model: nn.Module, config: object, ids: Tensor, *, pre_rotary: bool = False, model_dir: Path | None = None,
    keep: list[int] | None = None,
) -> tuple[dict[str, list[Tensor]], str, bool, list[float]]:
    """Run the model once on `ids`: per role ('q', 'k', 'v') each layer's tensor (b, heads, n, d) (the layers in
    `keep` alone when given and recorded at the attention function), where they were recorded (the attention function
    after the rotary embedding, or the projections), whether the attention is causal, and each layer's scaling.
    CaptureError when the model fails on that many tokens."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotary = has_rotary(config)
    try:
        record = AttentionRecord() if pre_rotary else record_attention(model, ids, keep)
        if record.q:
            where = "attention (post-rotary)" if rotary else "attention"
            layers = {"q": record.q, "k": record.k, "v": record.v}
            causal, scaling = all(record.causal), record.scaling
        else:
            where = "projections (pre-rotary)" if rotary else "projections"
            layers = record_projections(model, ids, head_dim)
            causal = bool(getattr(config, "is_decoder", False)) or "CausalLM" in " ".join(
                getattr(config, "architectures", None) or []
            )
            scaling = [head_dim**-0.5] * len(layers["q"])
    except (IndexError, RuntimeError) as error:  # most often more tokens than its learned positions (BERT, OPT, ...)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        raise CaptureError(
            f"{model_dir or type(model).__name__} failed on {ids.shape[-1]} tokens ({type(error).__name__}: {str(error).splitlines()[0]})"
            + (f"; its config allows at most {limit} positions, some models fewer: give fewer tokens" if limit else "")
        ) from None
    return layers, where, causal, scaling


def capture_qkv(
    model_dir: Path,
    out: Path,
    *,
    text: str | None = None,
    token_ids: list[int] | None = None,
    random_tokens: int | None = None,
    seed: int = 0,
    pre_rotary: bool = False,
    seq_len: int | None = None,
    text_source: str | None = None,
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Run the model once and write q, k, v (layers, batch, heads, seq, head_dim) to `out` (.pt, .safetensors or
    .npz: whatever the `captured` input reads), with a description of what they are (`CaptureMeta`).
    Returns the tensors and that description."""
    from attnbench.inputs.captured import unknown_format, write_capture

    problem = unknown_format(out)
    if problem:  # before the model is loaded
        raise CaptureError(f"--out {problem}")
    out.parent.mkdir(parents=True, exist_ok=True)  # an OSError here is the CLI's: the path and why
    if not os.access(out.parent, os.W_OK):
        raise CaptureError(f"--out {out}: its folder cannot be written (read-only, or no permission)")
    model, config = load_base_model(model_dir)
    ids = _tokens(model_dir, config, text=text, token_ids=token_ids, random_tokens=random_tokens, seed=seed)
    ids = ids[:, :seq_len] if seq_len else ids
    check_tokens(ids, config, seq_len)
    layers, where, causal, scaling = record_qkv(model, config, ids, pre_rotary=pre_rotary, model_dir=model_dir)
    rotary = has_rotary(config)
    tensors = {role: torch.stack(values).contiguous() for role, values in layers.items()}
    meta = {
        "model": str(model_dir),
        "model_type": getattr(config, "model_type", None),
        "text": text_source or ("--token-ids" if token_ids is not None else "--random-tokens" if random_tokens else "--text"),
        "positions": int(ids.shape[-1]),
        "recorded_at": where,
        "rotary": rotary,
        "post_rotary": rotary and where.startswith("attention"),
        "causal": causal,
        "scaling": scaling,
    }
    try:
        write_capture(out, tensors, meta)
    except OSError:
        raise  # the CLI names the path and why
    except Exception as error:  # torch's and safetensors' own write errors (a /proc or /sys path, a full device)
        first = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise CaptureError(f"--out {out}: could not be written ({type(error).__name__}: {first})") from None
    return tensors, meta
