"""Input distributions: seeded, deterministic, each with the statistic it claims; captured files round-trip
and malformed ones fail with a message that says what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from attnbench.inputs.catalogue import DISTRIBUTIONS, make_inputs, validate_input
from attnbench.inputs.calibration import ENCODER as CALIBRATION
from attnbench.measure.reference import exact_reference
from attnbench.plan.config import ConfigError, parse_config

SYNTHETIC = [name for name in DISTRIBUTIONS if name not in ("captured", "heads")]  # files: tests of their own


def draw(name: str, params: dict | None = None, n: int = 512, seed: int = 0, b: int = 1, h: int = 2, d: int = 64):
    return make_inputs(
        name,
        params or {},
        batch=b,
        heads=h,
        seq_len=n,
        head_dim=d,
        dtype=torch.float64,
        device=torch.device("cpu"),
        seed=seed,
    )


def statistics(name: str, n: int = 512) -> tuple[float, float]:
    inputs = draw(name, n=n)
    reference = exact_reference(inputs.q, inputs.k, inputs.v, causal=False, key_padding_mask=None)
    return reference.entropy, reference.band_mass


@pytest.mark.parametrize("name", SYNTHETIC)
def test_each_distribution_is_seeded(name: str) -> None:
    a, b, c = draw(name, seed=1), draw(name, seed=1), draw(name, seed=2)
    assert torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and torch.equal(a.v, b.v)
    assert not torch.equal(a.q, c.q)


def test_each_distribution_has_the_statistic_it_claims() -> None:
    gaussian_entropy, gaussian_band = statistics("gaussian")
    clustered_entropy, _ = statistics("clustered")
    local_entropy, local_band = statistics("local")
    assert gaussian_entropy > 0.9  # iid Gaussian at temperature 1: nearly uniform attention
    assert gaussian_band == pytest.approx(129 / 512, abs=0.05)  # mass near the diagonal ~ its share of keys
    assert clustered_entropy < gaussian_entropy - 0.2  # peaked on the query's own cluster
    assert local_band > 0.95 and local_entropy < gaussian_entropy - 0.3  # most mass within 64 positions
    long = draw("local", n=4096)  # and it stays there at long N (evenly spaced phases would line up again)
    assert exact_reference(long.q, long.k, long.v, causal=False, key_padding_mask=None).band_mass > 0.9
    sharp = draw("gaussian", {"temperature": 0.25})
    sharp_entropy = exact_reference(sharp.q, sharp.k, sharp.v, causal=False, key_padding_mask=None).entropy
    assert sharp_entropy < gaussian_entropy - 0.2  # temperature makes it peaked


@pytest.mark.parametrize("head_dim", [32, 64])
def test_realistic_matches_the_statistics_of_a_real_encoder(head_dim: int) -> None:
    """The documented calibration: 72 heads (3 seeds x 24) at N=512 against MiniLM-L6's 72 heads, per statistic
    the mean over heads and the spread across them."""
    per_head: dict[str, list[torch.Tensor]] = {}
    for seed in range(3):
        inputs = draw("realistic", n=512, seed=seed, h=24, d=head_dim)
        reference = exact_reference(inputs.q, inputs.k, inputs.v, causal=False, key_padding_mask=None)
        for name, values in reference.per_head.items():
            per_head.setdefault(name, []).append(values)
    for name, target in CALIBRATION.items():
        values = torch.cat(per_head[name])
        assert values.mean().item() == pytest.approx(target.mean, abs=target.tolerance), name
        assert values.std().item() == pytest.approx(target.spread, abs=max(target.tolerance, target.spread / 2)), name
    assert reference.head_spread > 0.1  # heads differ (a Gaussian input's heads all look alike)
    gaussian = draw("gaussian", h=8)
    flat = exact_reference(gaussian.q, gaussian.k, gaussian.v, causal=False, key_padding_mask=None)
    assert flat.head_spread < 0.01 and flat.sink_mass < 0.01


def test_realistic_sink_keeps_its_share_at_long_n_and_small_heads() -> None:
    """The first token's share does not fade with N (its logit grows with log N), and tiny head dims still work."""
    long = draw("realistic", n=4096, h=8, d=32)
    reference = exact_reference(long.q, long.k, long.v, causal=False, key_padding_mask=None)
    assert reference.sink_mass == pytest.approx(CALIBRATION["sink_mass"].mean, abs=0.06)
    for d in (1, 2, 3, 5):
        tiny = draw("realistic", n=64, h=2, d=d)
        assert tiny.q.shape == (1, 2, 64, d) and torch.isfinite(tiny.q).all() and torch.isfinite(tiny.k).all()


def test_lowrank_queries_and_keys_span_rank_dimensions() -> None:
    inputs = draw("lowrank", {"rank": 5})
    for x in (inputs.q, inputs.k):
        values = torch.linalg.svdvals(x[0, 0])
        assert values[4] > 1e3 * values[5]


def capture_file(folder: Path, suffix: str, layers: int = 2, kv_heads: int = 1) -> tuple[Path, dict]:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "q": torch.randn(layers, 1, 2, 40, 8, generator=generator),
        "k": torch.randn(layers, 1, kv_heads, 40, 8, generator=generator),
        "v": torch.randn(layers, 1, kv_heads, 40, 8, generator=generator),
    }
    path = folder / f"capture{suffix}"
    if suffix == ".pt":
        torch.save(tensors, path)
    elif suffix == ".npz":
        np.savez(path, **{name: t.numpy() for name, t in tensors.items()})
    else:
        safetensors = pytest.importorskip("safetensors.torch")
        safetensors.save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("suffix", [".pt", ".npz", ".safetensors"])
def test_captured_files_round_trip(tmp_path: Path, suffix: str) -> None:
    path, tensors = capture_file(tmp_path, suffix)
    inputs = make_inputs(
        "captured",
        {"path": str(path), "layer": 1},
        batch=1,
        heads=2,
        seq_len=32,
        head_dim=8,
        dtype=torch.float32,
        device=torch.device("cpu"),
        seed=0,
    )
    torch.testing.assert_close(inputs.q, tensors["q"][1, :, :, :32])
    torch.testing.assert_close(inputs.k[:, 1], tensors["k"][1, :, 0, :32])  # one k/v head shared by both q heads
    assert validate_input("captured", {"path": str(path), "layer": 1}) == []


def test_captured_length_rule(tmp_path: Path) -> None:
    path, tensors = capture_file(tmp_path, ".pt")
    common = dict(batch=1, heads=2, seq_len=100, head_dim=8, dtype=torch.float32, device=torch.device("cpu"), seed=0)
    with pytest.raises(ValueError, match='has 40 positions and N=100 was asked.*beyond = "tile"'):
        make_inputs("captured", {"path": str(path)}, **common)
    tiled = make_inputs("captured", {"path": str(path), "beyond": "tile"}, **common)
    torch.testing.assert_close(tiled.q[..., 40:80, :], tensors["q"][0])


def test_malformed_captured_files_fail_clearly(tmp_path: Path) -> None:
    torch.save({"q": torch.zeros(1, 2, 4, 8), "k": torch.zeros(1, 2, 4, 8)}, tmp_path / "no_v.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    torch.save({"q": torch.zeros(2, 4, 8), "k": torch.zeros(2, 4, 8), "v": torch.zeros(2, 4, 8)}, tmp_path / "3d.pt")
    torch.save(
        {"q": torch.zeros(1, 3, 4, 8), "k": torch.zeros(1, 2, 4, 8), "v": torch.zeros(1, 2, 4, 8)},
        tmp_path / "heads.pt",
    )
    (tmp_path / "junk.pt").write_bytes(b"not a tensor file")
    (tmp_path / "capture.txt").write_text("q k v")
    expectations = {
        "no_v.pt": "missing tensor(s) v",
        "list.pt": "holds a list",
        "3d.pt": "3, 3, 3 dimensions",
        "heads.pt": "not a divisor",
        "junk.pt": "could not be read",
        "capture.txt": "unknown format",
        "absent.pt": "does not exist",
    }
    for name, message in expectations.items():
        problems = validate_input("captured", {"path": str(tmp_path / name)})
        assert len(problems) == 1 and message in problems[0], (name, problems)
    path, _ = capture_file(tmp_path, ".pt")
    assert "layer 5 is out of range" in validate_input("captured", {"path": str(path), "layer": 5})[0]
    assert "beyond must be" in validate_input("captured", {"path": str(path), "beyond": "wrap"})[0]


def test_bad_inputs_stop_the_config_before_any_work(tmp_path: Path) -> None:
    raw = {
        "variants": ["full"],
        "inputs": [{"name": "clustered", "clusters": 0}, {"name": "captured"}, {"name": "local", "lenght": 3}],
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    text = str(caught.value)
    assert "clusters must be a finite positive number" in text and "give path" in text and "unknown parameter 'lenght'" in text


def test_gaussian_scale_multiplies_queries_and_keys_and_leaves_the_default_as_it_was() -> None:
    plain, scaled = draw("gaussian"), draw("gaussian", {"scale": 0.5, "temperature": 2.0})
    torch.testing.assert_close(scaled.q, plain.q / 2.0 * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(scaled.k, plain.k * 0.5, rtol=0, atol=0)
    torch.testing.assert_close(scaled.v, plain.v, rtol=0, atol=0)
    explicit = draw("gaussian", {"scale": 1.0})
    assert all(torch.equal(a, b) for a, b in zip((explicit.q, explicit.k, explicit.v), (plain.q, plain.k, plain.v)))
    from attnbench.inputs.catalogue import validate_input

    assert validate_input("gaussian", {"scale": 0.0}) and validate_input("gaussian", {"scale": -1.0})
