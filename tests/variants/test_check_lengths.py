"""`check` judges an exact pattern at several N, across block and chunk boundaries (issue 39, item 4)."""

from __future__ import annotations

import torch


def test_check_crosses_a_plugins_chunk_boundary() -> None:
    """Issue 39, item 4: `check` judged a plugin's exactness at N=75 alone, below its chunk of 256. A band whose keys
    are read chunk by chunk and which forgets the keys of the previous chunk passes at 75 and fails now."""
    from attnbench.conformance import CheckContext, check_exact_pattern
    from attnbench.variants.band import BandAttention

    class ChunkForgetting(BandAttention):
        name = "chunk-forgetting"

        def forward(self, q, k, v, *, causal, key_padding_mask):
            out = super().forward(q, k, v, causal=causal, key_padding_mask=key_padding_mask)
            n = q.shape[-2]
            for start in range(256, n, 256):  # each chunk's queries see its own chunk's keys only
                stop = min(n, start + 256)
                out[..., start:stop, :] = super().forward(
                    q[..., start:stop, :], k[..., start:stop, :], v[..., start:stop, :], causal=causal,
                    key_padding_mask=None if key_padding_mask is None else key_padding_mask[..., start:stop],
                )  # fmt: skip
            return out

    result = check_exact_pattern(CheckContext(lambda: ChunkForgetting(window=32), torch.device("cpu"), torch.float64))
    assert result.status == "fail" and "N = 75, 300, 1100" in result.detail
    assert check_exact_pattern(CheckContext(lambda: BandAttention(window=32), torch.device("cpu"), torch.float64)).status == "pass"


def test_a_block_larger_than_the_defaults_is_crossed_too() -> None:
    """Review finding: `check topk --param block_size=1024` judged exactness at 75, 300 and 1100 and leaks up to
    1024, inside one block or barely past it. Both checks now go past twice the largest integer hyperparameter."""
    from attnbench.conformance import CheckContext, check_exact_pattern, leakage_lengths
    from attnbench.registry import registry

    big = registry.create("band", window=1000)
    assert leakage_lengths(big) == [96, 160, 2017] and leakage_lengths(registry.create("band")) == [96, 160, 529]
    result = check_exact_pattern(CheckContext(lambda: big, torch.device("cpu"), torch.float64))
    assert result.status == "pass" and "N = 75, 300, 1100, 2017" in result.detail
