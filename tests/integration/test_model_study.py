"""`attnbench model` on tiny random models built from configs here (an encoder and a decoder; nothing downloaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from attnbench.cli import main
from attnbench.model.study import ModelStudy, load_model, masked_inputs
from attnbench.plan.cells import VariantSpec

transformers = pytest.importorskip("transformers")
N = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny BERT with a masked-LM head and a tiny Llama (grouped-query) with a causal-LM head, saved locally."""
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    shape = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                 max_position_embeddings=128)  # fmt: skip
    transformers.BertForMaskedLM(transformers.BertConfig(**shape)).save_pretrained(root / "encoder")
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape, num_key_value_heads=2)).save_pretrained(
        root / "decoder"
    )
    return {"encoder": root / "encoder", "decoder": root / "decoder"}


def study_of(path: Path, **options) -> ModelStudy:
    model, kind = load_model(path)
    ids = torch.randint(97, (1, N), generator=torch.Generator().manual_seed(0))
    ids, labels = masked_inputs(ids, 3, 0) if kind == "masked-lm" else (ids, ids)
    return ModelStudy(model, kind, ids, labels, **options)


@pytest.mark.parametrize("which", ["encoder", "decoder"])
def test_a_band_covering_the_sequence_is_the_exact_model_and_a_narrow_one_is_not(models, which: str) -> None:
    study = study_of(models[which], single_layers=True, min_run_time=0.02)
    assert study.causal == (which == "decoder") and study.layers == 2
    native = study.native_check()  # through our implementation with exact `full`: the model's own SDPA
    assert native.output_difference < 1e-6 and native.perplexity_difference < 1e-6
    head = study.head_check()  # the sliced head and loss: transformers' complete forward and its own loss
    assert head.tokens == N and head.logits_difference < 1e-6 and head.loss_difference < 1e-6
    wide = pd.DataFrame(map(vars, study.rows(VariantSpec("band", (("window", N),)))))
    narrow = pd.DataFrame(map(vars, study.rows(VariantSpec("band", (("window", 2),)))))
    assert (wide.status == "ok").all() and set(wide.swap) == {"all", "single"}
    assert set(wide[wide.swap == "single"].layer) == {"0", "1"} and set(wide[wide.swap == "all"].layer) == {
        "0",
        "1",
        "final",
    }
    assert wide.rel_error.max() < 1e-5 and wide.cosine.min() > 1 - 1e-6  # every layer, both views
    final = lambda rows: rows[rows.layer == "final"].iloc[0]  # noqa: E731
    assert final(narrow).rel_error > 100 * max(final(wide).rel_error, 1e-7)
    assert (narrow[narrow.swap == "single"].rel_error > 1e-3).all()  # each layer alone feels it
    assert abs(final(wide).loss_change) < 1e-4 and final(narrow).loss_change == final(narrow).loss_change
    assert final(wide).speedup > 0 and final(wide).speedup_low <= final(wide).speedup <= final(wide).speedup_high


def test_a_variant_without_a_causal_form_is_refused_for_a_decoder_with_its_reason(models) -> None:
    (row,) = study_of(models["decoder"]).rows(VariantSpec("linformer"))
    assert row.status == "unsupported" and "causal" in row.reason
    encoder_rows = study_of(models["encoder"]).rows(VariantSpec("linformer", (("k", 16),)))
    assert all(r.status == "ok" for r in encoder_rows)


def test_the_command_writes_a_table_and_a_report(models, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = ",".join(str(i % 97) for i in range(40))
    argv = ["model", str(models["decoder"]), "--variants", "band(window=8),linformer,full", "--token-ids", ids,
            "--out", str(tmp_path), "--per-layer", "--time", "--min-run-time", "0.02"]  # fmt: skip
    assert main(argv) == 0
    run = next(tmp_path.iterdir())
    rows = pd.read_csv(run / "model.csv")
    assert set(rows.label) == {"band(window=8)", "linformer", "full"}
    assert rows[rows.label == "linformer"].status.tolist() == ["unsupported"]
    full = rows[(rows.label == "full") & (rows.layer == "final")].iloc[0]
    assert full.rel_error < 1e-6 and full.loss_exact > 0 and abs(full.loss_change) < 1e-5
    assert {p.name for p in (run / "plots").iterdir()} == {"layers.png", "loss-vs-speedup.png"}
    assert "linformer does not support causal attention" in (run / "report.md").read_text()
    captured = capsys.readouterr()
    assert "band(window=8)" in captured.out and captured.err.strip().endswith("report.html")


def test_models_whose_attention_cannot_be_swapped_faithfully_are_refused(tmp_path: Path, monkeypatch) -> None:
    """An attention the routing does not reproduce makes the exact model through attnbench differ from the model's
    own: refused with the figure, not measured against the wrong reference. A sliding window is reproduced (each
    sliding layer keeps its own, exact); a router that dropped it is the stand-in for a feature the variants do not
    model."""
    from attnbench.model import attention
    from attnbench.model.study import ModelStudyError
    from attnbench.registry import registry

    config = transformers.MistralConfig(vocab_size=97, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, sliding_window=8)  # fmt: skip
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path / "sliding")
    model, kind = load_model(tmp_path / "sliding")
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.randint(97, (1, 32), generator=torch.Generator().manual_seed(0))
    assert ModelStudy(model, kind, ids, ids).native.worst() < 1e-4  # its window kept: the model's own attention
    monkeypatch.setattr(attention, "model_window", lambda window: registry.create("full"))  # the window dropped
    with pytest.raises(ModelStudyError, match="attention feature the variants do not model"):
        ModelStudy(model, kind, ids, ids)
    transformers.BartModel(transformers.BartConfig(vocab_size=97, d_model=16, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                           decoder_ffn_dim=16)).save_pretrained(tmp_path / "bart")  # fmt: skip
    with pytest.raises(ModelStudyError, match="encoder-decoder"):
        load_model(tmp_path / "bart")


def test_bad_input_is_refused_before_the_model_is_loaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", str(tmp_path), "--variants", "bnad,band(window=-1)", "--text", "x"]) == 2
    err = capsys.readouterr().err
    assert "bnad" in err and "window" in err
    assert main(["model", str(tmp_path), "--variants", "band", "--text", "x"]) == 2
    assert "not a local model folder" in capsys.readouterr().err
    assert main(["model", str(tmp_path), "--variants", "band(window=3),lsh(bucket_size=8", "--text", "x"]) == 2
    assert "unbalanced parentheses" in capsys.readouterr().err
    assert main(["model", str(tmp_path), "--variants", "band", "--random-tokens", "1"]) == 2
    assert "--random-tokens must be >= 2" in capsys.readouterr().err
    assert [s.label() for s in VariantSpec.parse("band(window=64, block_size=32),lsh")] == [
        "band(block_size=32, window=64)",
        "lsh",
    ]


def test_each_length_has_its_own_exact_model_and_the_slow_passes_are_off_by_default(
    models, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--seq-len 16 64 on 40 tokens: the first 16, then all 40 (64 cut to the input), each against its own exact
    model; no single-layer swaps and no timing unless asked; a perplexity plot across the lengths."""
    ids = ",".join(str(i * 7 % 97) for i in range(40))
    argv = ["model", str(models["decoder"]), "--variants", "band(window=4),full", "--token-ids", ids,
            "--seq-len", "16", "64", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    assert "--seq-len 64 cut to 40" in capsys.readouterr().err
    run = next(tmp_path.iterdir())
    rows = pd.read_csv(run / "model.csv")
    finals = rows[rows.layer == "final"].set_index(["label", "seq_len"])
    assert sorted(finals.index) == [("band(window=4)", 16), ("band(window=4)", 40), ("full", 16), ("full", 40)]
    assert finals.loc[("full", 16)].loss_exact != finals.loc[("full", 40)].loss_exact  # its own exact model
    assert (finals.xs("full").perplexity_ratio - 1).abs().max() < 1e-5
    assert set(rows.swap) == {"all"} and rows.time_s.isna().all() and rows.speedup.isna().all()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["seq_lens"] == [16, 40] and not meta["per_layer"] and not meta["timed"]
    assert set(meta["native_check"]) == {"16", "40"} and meta["memory"]["peak_rss_bytes"] > 0
    assert {p.name for p in (run / "plots").iterdir()} == {"perplexity-vs-n.png", "layers.png"}


def test_a_length_over_the_memory_limit_or_the_positions_is_refused_before_any_work(
    models, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decoder = str(models["decoder"])
    assert main(["model", decoder, "--variants", "band", "--random-tokens", "100", "--seq-len", "16", "100",
                 "--memory-limit-gb", "0.001", "--out", str(tmp_path)]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "--seq-len 16: estimated peak memory" in err and "--seq-len 100: estimated peak memory" in err
    assert "exceeds the limit" in err and "--memory-limit-gb" in err
    assert main(["model", decoder, "--variants", "band", "--random-tokens", "300", "--seq-len", "64,200",
                 "--out", str(tmp_path)]) == 2  # fmt: skip
    assert "--seq-len 200: the model has 128 positions" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no run folder: nothing ran


def test_the_memory_estimate_grows_with_the_length_and_the_single_layer_swaps(models) -> None:
    from attnbench.model.memory import ModelShape, estimated_peak_bytes
    from attnbench.registry import registry

    model, _ = load_model(models["decoder"])
    shape, full = ModelShape.of(model), [registry.create("full")]
    short, long = (estimated_peak_bytes(shape, n, full, causal=True, single_layers=False) for n in (1024, 8192))
    assert shape.loaded_bytes < short < long
    assert estimated_peak_bytes(shape, 8192, full, causal=True, single_layers=True) > long
    dense = [registry.create("full-math")]  # builds the (h, n, n) scores: the estimate sees them
    assert estimated_peak_bytes(shape, 8192, dense, causal=True, single_layers=False) > long + 4 * 8192**2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_device_cuda_without_cuda_is_refused_before_any_work(models, tmp_path: Path, capsys) -> None:
    """`make gpu-check` runs `attnbench model --device cuda`; without CUDA that is bad input, named, before loading."""
    argv = ["model", str(models["decoder"]), "--variants", "band", "--random-tokens", "100", "--seq-len", "16",
            "--device", "cuda", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 2
    assert "--device cuda: CUDA is not available" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_device_cpu_runs_the_study_as_before(models, tmp_path: Path) -> None:
    argv = ["model", str(models["decoder"]), "--variants", "band(window=4)", "--random-tokens", "40", "--seq-len",
            "16", "--device", "cpu", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    rows = pd.read_csv(next(tmp_path.iterdir()) / "model.csv")
    assert (rows[rows.layer == "final"].status.fillna("ok") == "ok").all() and len(rows) > 1


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 3 decoder (its layout: sliding layers around a global one, as `tiny("gemma3")` in
    tests/generation/test_architectures.py), saved locally."""
    folder = tmp_path_factory.mktemp("models") / "gemma"
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                           num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                           query_pre_attn_scalar=64, sliding_window=8, max_position_embeddings=128,
                                           layer_types=["sliding_attention", "sliding_attention", "full_attention",
                                                        "sliding_attention"])  # fmt: skip
    transformers.Gemma3ForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_hybrid_model_s_layout_is_named_and_only_its_global_layers_are_swapped(
    gemma: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Gemma 3's sliding layers keep their window (`attention.Routing`): the terminal and the report say so, never
    "every layer"; the hidden state is exact until the global layer 2; only layer 2 is swapped alone."""
    argv = ["model", str(gemma), "--variants", "band(window=2)", "--random-tokens", "48", "--seq-len", "48",
            "--per-layer", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    layout = ("3 of its 4 self-attention layers attend through a sliding window of 8 positions and keep it, exact, "
              "in every pass (the model's own attention there); a variant goes into its 1 global layer (2)")
    assert f"gemma: {layout}" in err
    assert "every global layer (the sliding-window layers keep their window) + each global layer alone" in err
    assert ", every layer" not in err
    run = next(tmp_path.iterdir())
    report = " ".join((run / "report.md").read_text().split())
    assert layout in report and "Every global self-attention layer swapped (the sliding-window layers keep" in report
    assert "Every self-attention layer swapped" not in report
    assert json.loads((run / "meta.json").read_text())["model"]["layout"] == layout
    rows = pd.read_csv(run / "model.csv", dtype={"layer": str})
    swapped = rows[rows.swap == "all"].set_index("layer").rel_error
    assert swapped["0"] == 0 and swapped["1"] == 0 and swapped["2"] > 1e-3  # the window kept, then the variant
    assert rows[rows.swap == "single"].layer.tolist() == ["2"]


def test_a_model_without_a_global_layer_is_refused_by_the_command(tmp_path: Path, capsys) -> None:
    """Mistral with a window in every layer: each keeps it, so no variant would change anything; exit 2, named."""
    config = transformers.MistralConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=64, sliding_window=8)  # fmt: skip
    transformers.MistralForCausalLM(config).save_pretrained(tmp_path / "sliding")
    argv = ["model", str(tmp_path / "sliding"), "--variants", "band", "--random-tokens", "32", "--seq-len", "32",
            "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    assert "every one of its 2 layers attends through a sliding window of 8 positions" in capsys.readouterr().err
