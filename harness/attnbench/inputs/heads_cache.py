"""Where a real model's captured heads live, what their manifest says, and which cells they can serve (no torch:
the plan reads this before any tensor exists).

`attnbench heads MODEL_DIR` (run by `make model` for SmolLM2-135M) records a causal decoder's post-rotary q/k/v on
the shipped texts (prose and code) at up to its own positions, from layers across depth, into
`$ATTNBENCH_HEADS/<model folder name>/` (default `~/.cache/attnbench/heads/`): one file per text and `heads.json`,
the manifest below. The `heads` input (`attnbench.inputs.heads`) reads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DEFAULT_HEADS_MODEL = "SmolLM2-135M"  # the decoder `make model` converts and `make model` captures
MANIFEST = "heads.json"
HEADS_COMMAND = "make model (or: attnbench heads MODEL_DIR)"  # what gets real heads, as the messages say it


def heads_root() -> Path:
    """The folder every model's captured heads are kept in: $ATTNBENCH_HEADS, else ~/.cache/attnbench/heads."""
    return Path(os.environ.get("ATTNBENCH_HEADS") or Path.home() / ".cache" / "attnbench" / "heads")


def heads_folder(model: str) -> Path:
    """One model's heads: a name under `heads_root()`, or a folder given by its path."""
    given = Path(model).expanduser()
    return given if given.is_absolute() or os.sep in model else heads_root() / model


def read_manifest(model: str) -> dict[str, Any] | None:
    """The model's manifest (None when its heads were never captured, or the capture did not finish)."""
    path = heads_folder(model) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("texts"), dict) else None


def captured_models() -> list[str]:
    """The models whose heads are in `heads_root()`."""
    root = heads_root()
    return sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []


def heads_problems(params: dict[str, Any]) -> list[str]:
    """Why a `heads` input's parameters cannot be read (the model named has no captured heads, an unknown text)."""
    model, text = params.get("model", DEFAULT_HEADS_MODEL), params.get("text", "prose")
    if not isinstance(model, str) or not model:
        return [f"input 'heads': model must be a model's name or a heads folder, got {model!r}"]
    manifest = read_manifest(model)
    if manifest is None:
        known = captured_models()
        return [f"input 'heads': no captured heads of {model!r} in {heads_folder(model)} "
                f"({'captured: ' + ', '.join(known) if known else 'none captured yet'}); {HEADS_COMMAND} records them"]  # fmt: skip
    if text not in manifest["texts"]:
        return [f"input 'heads': text must be one of {', '.join(manifest['texts'])} (what {model} was captured on), "
                f"got {text!r}"]  # fmt: skip
    return []


def held_positions(manifest: dict[str, Any], text: str) -> tuple[int, str | None]:
    """The positions `text` was captured at (each text to its own length: a shorter one in the model's tokenizer
    stops sooner), and what stopped it short of the model's, if anything."""
    entry = manifest["texts"].get(text) or {}
    held = int(entry.get("tokens", manifest["positions"]))
    return held, entry.get("limited_by") or (manifest.get("limited_by") if held == int(manifest["positions"]) else None)


def heads_head_dim(params: dict[str, Any]) -> int | None:
    """The head_dim of the model whose heads a `heads` input (or needles planted in them) reads; None when they were
    never captured (the config's validation says so)."""
    manifest = read_manifest(params.get("model", DEFAULT_HEADS_MODEL))
    return int(manifest["head_dim"]) if manifest is not None else None


def heads_unfit(params: dict[str, Any], *, causal: bool, positions: int, head_dim: int) -> str | None:
    """Why a cell cannot be drawn from a model's captured heads (None when it can): they are a causal decoder's, so
    causal cells only; no more positions than its text was captured at (the model's own, at most: beyond them a rotary
    model was never trained, and a tiled sequence is not its attention); the model's head_dim."""
    model = params.get("model", DEFAULT_HEADS_MODEL)
    manifest = read_manifest(model)
    if manifest is None:
        return None  # said by the config's validation
    name = manifest.get("model", model)
    if not causal:
        return f"{name}'s heads are a causal decoder's: they judge causal cells only"
    text = params.get("text", "prose")
    held, limited_by = held_positions(manifest, text)
    if positions > held:
        trained = int(manifest.get("trained_positions", manifest["positions"]))
        if limited_by:  # the shipped text ran out before the model's positions
            return (f"{name}'s heads on the {text} were captured at {held} positions ({limited_by}; the model was "
                    f"trained on {trained}); this cell needs {positions}")  # fmt: skip
        if held < trained:  # a short capture (`--positions`): capture again
            return (f"{name}'s heads were captured at {held} positions (attnbench heads --positions); this cell "
                    f"needs {positions}: capture them again without --positions")  # fmt: skip
        return (f"{name}'s heads were captured at {held} positions (the model was trained on {trained}: beyond, its "
                f"attention is not what it learned); this cell needs {positions}")  # fmt: skip
    if head_dim != int(manifest["head_dim"]):
        return (f"{name}'s heads have head_dim {manifest['head_dim']}, this cell asks {head_dim}: set head_dim = "
                f"{manifest['head_dim']} in the config (naming the heads in --inputs sets it)")  # fmt: skip
    return None


def uncaptured_heads(name: str, params: dict[str, Any]) -> str | None:
    """The note that drops an input of the default model's heads (or needles planted in them) when they were never
    captured here: a preset lists them beside `realistic`, and runs on `realistic` alone until they exist. None for
    any other input, and for a model named explicitly (its absence is the config's error)."""
    if name == "needles":
        if params.get("background") != "heads":
            return None
        params = {key: value for key, value in params.items() if key in ("model", "text")}
    elif name != "heads":
        return None
    if "model" in params or read_manifest(DEFAULT_HEADS_MODEL) is not None:
        return None
    return (f"{DEFAULT_HEADS_MODEL}'s real heads are not captured here ({heads_folder(DEFAULT_HEADS_MODEL)}): "
            f"accuracy is judged on `realistic`, a synthetic stand-in; {HEADS_COMMAND} captures them")  # fmt: skip
