"""Texts attnbench ships for real-model runs (see README.md here for source and licence)."""

from pathlib import Path

TUTORIAL = Path(__file__).with_name("python_tutorial.txt")  # licence-clean English prose, ~41k SmolLM2 tokens
ARGPARSE = Path(__file__).with_name("python_argparse.txt")  # licence-clean Python source, ~37k SmolLM2 tokens
HEADS_TEXTS = {"prose": TUTORIAL, "code": ARGPARSE}  # what `attnbench heads` captures a model's heads on
