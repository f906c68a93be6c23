"""Capture and calibration on the real decoder, SmolLM2-135M (marked `model`: skipped where `make model` has not
written its folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from attnbench.cli import main
from attnbench.inputs.captured import capture_meta, read_tensors
from attnbench.inputs.catalogue import make_inputs
from attnbench.model.texts import TUTORIAL
from attnbench.registry import registry

pytest.importorskip("transformers")
pytestmark = [pytest.mark.model, pytest.mark.slow]
N = 256


def test_captured_qk_reproduce_every_layers_attention_output(model_dir: Path, tmp_path: Path) -> None:
    """Post-rotary q/k/v from the file, through exact causal `full` at the file's scaling, give the attention output
    the model computed (the input of each layer's o_proj) within float tolerance; pre-rotary ones do not."""
    from transformers import AutoModel

    out = tmp_path / "real.safetensors"
    argv = ["capture", str(model_dir), "--text-file", str(TUTORIAL), "--seq-len", str(N), "--out", str(out)]
    assert main(argv) == 0
    meta = capture_meta(read_tensors(out))
    assert meta["post_rotary"] and meta["causal"] and meta["positions"] == N and len(meta["scaling"]) == 30
    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa").eval()
    seen: list[torch.Tensor] = []
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
             for layer in model.layers]  # fmt: skip
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(model_dir))(TUTORIAL.read_text(), return_tensors="pt").input_ids[:, :N]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for hook in hooks:
        hook.remove()
    full = registry.create("full")
    for layer in (0, 14, 29):
        x = make_inputs("captured", {"path": str(out), "layer": layer}, batch=1, heads=9, seq_len=N, head_dim=64,
                        dtype=torch.float32, device=torch.device("cpu"), seed=0)  # fmt: skip
        again = full(x.q, x.k, x.v, causal=True)  # (b, h, n, d)
        expected = seen[layer].view(1, N, 9, 64).transpose(1, 2)
        torch.testing.assert_close(again, expected, rtol=1e-4, atol=1e-4)
    pre = tmp_path / "pre.pt"
    assert main([*argv[:-2], "--out", str(pre), "--pre-rotary"]) == 0
    with pytest.warns(UserWarning, match="rotary"):
        x = make_inputs("captured", {"path": str(pre), "layer": 14}, batch=1, heads=9, seq_len=N, head_dim=64,
                        dtype=torch.float32, device=torch.device("cpu"), seed=0)  # fmt: skip
    assert (full(x.q, x.k, x.v, causal=True) - seen[14].view(1, N, 9, 64).transpose(1, 2)).abs().max() > 1e-2


def test_calibrate_on_the_real_decoder_reproduces_the_shipped_table_at_512(model_dir: Path, tmp_path: Path) -> None:
    """The shipped table's N=512 row, recomputed from the model: the same numbers (same text, same windows)."""
    from attnbench.inputs.calibration import decoder_table

    out = tmp_path / "table.json"
    shipped = decoder_table()["lengths"]["512"]
    argv = ["calibrate", str(model_dir), "--out", str(out), "--seq-lens", "512", "--windows", str(shipped["windows"])]
    assert main(argv) == 0
    import json

    mine = json.loads(out.read_text())["lengths"]["512"]["statistics"]
    for name, statistic in shipped["statistics"].items():
        assert mine[name]["mean"] == pytest.approx(statistic["mean"], abs=2e-3), name


def test_needles_in_the_real_decoders_attention_are_retrieved_exactly_and_attended_as_the_keys_they_were(
    model_dir: Path, tmp_path: Path
) -> None:
    """Needles planted in SmolLM2's own post-rotary heads (background = "captured"), three layers side by side:
    exact attention retrieves every one, and the other queries attend each needle as they did the key at its
    position (ranked among all keys by that attention, needles rank as their positions did before planting).
    27 query heads share 9 key/value heads here: each query head gets needles of its own (see the README)."""
    from helpers import needle_attention_ranks

    out = tmp_path / "real.pt"
    assert main(["capture", str(model_dir), "--text-file", str(TUTORIAL), "--seq-len", "1024", "--out", str(out)]) == 0
    params = {"pairs": 16, "background": "captured", "path": str(out), "layer": [4, 16, 26]}
    x = make_inputs("needles", params, batch=1, heads=27, seq_len=1024, head_dim=64, dtype=torch.float32,
                    device=torch.device("cpu"), seed=0, causal=True)  # fmt: skip
    from attnbench.measure.metrics import needle_fields

    assert needle_fields(registry.create("full")(x.q, x.k, x.v, causal=True), x, causal=True)["needle_accuracy"] == 1.0
    context = make_inputs("captured", {"path": str(out), "layer": [4, 16, 26]}, batch=1, heads=27, seq_len=1024,
                          head_dim=64, dtype=torch.float32, device=torch.device("cpu"), seed=0)  # fmt: skip
    ranks, before = needle_attention_ranks(x), needle_attention_ranks(x, context=context)  # (h, p) each
    assert abs(ranks.median() - before.median()) < 0.05 and (ranks - before).abs().mean() < 0.1
