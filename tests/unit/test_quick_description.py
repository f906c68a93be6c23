"""`attnbench presets` says what quick runs: every built-in variant it sweeps is named before "Not in it:", every one it
leaves out after it (it once said "all built-in variants" without the gated, H2O and SnapKV ones)."""

from __future__ import annotations

import re

from attnbench.plan.config import load_config, preset_descriptions
from attnbench.registry import registry


def named(name: str, text: str) -> bool:
    """Whether `text` names the variant as a word (not `full` in `full-math`, nor `deltanet` in `gated-deltanet`)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_quick_names_what_it_runs_and_what_it_leaves_out() -> None:
    description, run_time = preset_descriptions()["quick"]
    runs, _, left_out = description.partition("Not in it:")
    assert left_out, description
    swept = {spec.name for spec in load_config("quick", {"device": ["cuda"]}, cluster=True).variants}  # a GPU's
    assert "full-xformers" in swept and "topk" in swept
    built_in = {name for name in registry.names() if registry.load(name).__module__.startswith("attnbench.")}
    for name in sorted(built_in):
        assert named(name, runs) == (name in swept), (name, runs)
        assert named(name, left_out) == (name not in swept), (name, left_out)
    assert "all built-in" not in description.lower()
    assert re.match(r"^\d+ s \(load [\d.]+\)", run_time)  # measured, and in seconds: about 90 on 2 cores
