"""`attnbench capture`: per-layer, per-head Q/K/V of a local Hugging Face model on given tokens.

The projections' outputs are recorded by forward hooks on the q/k/v linear layers (`q_proj`/`k_proj`/
`v_proj`, as in Llama, Mistral, Qwen, OPT; or `query`/`key`/`value`, as in BERT), reshaped to
(layers, batch, heads, seq, head_dim), and written in the layout the `captured` input reads. Values are
taken before any rotary position embedding the model applies inside its attention, so for such models
the captured Q/K carry no positions. Nothing is downloaded: the model is read from a local folder only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from einops import rearrange
from torch import Tensor, nn

ROLES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "query": "q", "key": "k", "value": "v"}


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


def _load(model_dir: Path) -> tuple[nn.Module, object]:
    config = model_config(model_dir, "capture")
    from transformers import AutoModel

    try:
        model = AutoModel.from_pretrained(str(model_dir), config=config, local_files_only=True).eval()
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


def capture_qkv(
    model_dir: Path,
    out: Path,
    *,
    text: str | None = None,
    token_ids: list[int] | None = None,
    random_tokens: int | None = None,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Run the model once and write q, k, v (layers, batch, heads, seq, head_dim) to `out` (.pt, .safetensors or
    .npz: whatever the `captured` input reads)."""
    from attnbench.inputs.captured import unknown_format, write_tensors

    problem = unknown_format(out)
    if problem:  # before the model is loaded
        raise CaptureError(f"--out {problem}")
    out.parent.mkdir(parents=True, exist_ok=True)  # an OSError here is the CLI's: the path and why
    if not os.access(out.parent, os.W_OK):
        raise CaptureError(f"--out {out}: its folder cannot be written (read-only, or no permission)")
    model, config = _load(model_dir)
    ids = _tokens(model_dir, config, text=text, token_ids=token_ids, random_tokens=random_tokens, seed=seed)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
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
    except (IndexError, RuntimeError) as error:  # most often more tokens than its learned positions (BERT, OPT, ...)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        raise CaptureError(
            f"{model_dir} failed on {ids.shape[-1]} tokens ({type(error).__name__}: {str(error).splitlines()[0]})"
            + (f"; its config allows at most {limit} positions, some models fewer: give fewer tokens" if limit else "")
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    layers = [roles for roles in recorded.values() if set(roles) == {"q", "k", "v"}]
    tensors = {role: torch.stack([layer[role] for layer in layers]).contiguous() for role in ("q", "k", "v")}
    write_tensors(out, tensors)
    return tensors
