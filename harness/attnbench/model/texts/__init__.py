"""Texts attnbench ships for real-model runs (see README.md here for source and licence).

The generation tasks and `calibrate` read the tutorial's prose and argparse's code as they first shipped; `attnbench
heads` reads each followed by its continuation (`*_more.txt`: more of Python's documentation and source), so that a
model of 32K positions (Gemma-3-270M) finds as many tokens while the first tokens, and every draw the tasks make,
stay what they were."""

from pathlib import Path

TUTORIAL = Path(__file__).with_name("python_tutorial.txt")  # licence-clean English prose, ~32k SmolLM2 tokens
ARGPARSE = Path(__file__).with_name("python_argparse.txt")  # licence-clean Python source, ~22k SmolLM2 tokens
TUTORIAL_MORE = Path(__file__).with_name("python_tutorial_more.txt")  # two HOWTOs' prose, ~9k more
ARGPARSE_MORE = Path(__file__).with_name("python_argparse_more.txt")  # functools.py, contextlib.py: ~15k more
HEADS_TEXTS = {"prose": (TUTORIAL, TUTORIAL_MORE), "code": (ARGPARSE, ARGPARSE_MORE)}  # what `attnbench heads` reads


def heads_text(name: str) -> str:
    """One of `HEADS_TEXTS` whole: its first file, then the continuation appended (byte for byte)."""
    return "".join(path.read_text(encoding="utf-8") for path in HEADS_TEXTS[name])
