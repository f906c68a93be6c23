"""LSH attention: its limiting cases equal exact attention; it is causal, seeded, and improves with rounds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from attnbench.interface import VariantError
from attnbench.measure.metrics import error_metrics
from attnbench.measure.reference import exact_reference
from attnbench.ops import dense_masked_attention
from attnbench.registry import registry
from attnbench.variants.lsh import hash_buckets


def qkv(n: int, b: int = 2, h: int = 2, d: int = 16, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=generator, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("n", [100, 128, 37])
@pytest.mark.parametrize("n_hashes", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_one_bucket_one_chunk_is_full_attention(n: int, n_hashes: int, padded: bool) -> None:
    causal = False  # causal needs shared_qk (below)
    # every round sees every key: the union is everything, each key counted once however many rounds share it
    q, k, v = qkv(n)
    mask = torch.arange(n)[None, :] >= torch.tensor([n - n // 3, n])[:, None] if padded else None
    variant = registry.create("lsh", n_buckets=1, bucket_size=128, n_hashes=n_hashes)
    expected = exact_reference(q, k, v, causal=causal, key_padding_mask=mask).output
    torch.testing.assert_close(variant(q, k, v, causal=causal, key_padding_mask=mask), expected, rtol=0, atol=1e-12)


def test_chunks_with_look_around_covering_n_are_full_attention() -> None:
    # 4 chunks of 32, looking 3 back and 3 forward: every chunk sees all; many rounds, one answer
    q, k, v = qkv(128)
    variant = registry.create("lsh", bucket_size=32, n_buckets=8, n_hashes=4, look_backward=3, look_forward=3)
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(variant(q, k, v), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bucket_size", [128, 32])
def test_shared_qk_one_bucket_is_the_self_masked_reference(causal: bool, bucket_size: int) -> None:
    n = 90
    q, _, v = qkv(n)
    look = 3 if bucket_size == 32 else 1  # 3 chunks of 32 looking 3 back and forward: everything is seen
    variant = registry.create(
        "lsh", n_buckets=1, bucket_size=bucket_size, n_hashes=2, shared_qk=True, look_backward=look, look_forward=look
    )
    allowed = ~torch.eye(n, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    expected = dense_masked_attention(q, F.normalize(q, dim=-1), v, allowed)
    if causal:  # the first token sees nothing but itself, so it attends to itself
        expected[:, :, 0] = v[:, :, 0]
    torch.testing.assert_close(variant(q, torch.zeros_like(q), v, causal=causal), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_buckets", [2, 8])
@pytest.mark.parametrize("padded", [False, True])
def test_causal_outputs_do_not_depend_on_later_tokens(n_buckets: int, padded: bool) -> None:
    # later tokens must change neither what an earlier query attends to nor which chunk it lands in
    n, t = 300, 170
    q, _, v = qkv(n, seed=1)
    q2, _, v2 = qkv(n, seed=2)
    mask = torch.arange(n)[None, :] >= torch.tensor([250, n])[:, None] if padded else None
    later = torch.arange(n)[:, None] > t
    variant = registry.create("lsh", bucket_size=16, n_hashes=4, n_buckets=n_buckets, shared_qk=True)
    before = variant(q, q, v, causal=True, key_padding_mask=mask)
    after = variant(torch.where(later, q2, q), q, torch.where(later, v2, v), causal=True, key_padding_mask=mask)
    torch.testing.assert_close(before[:, :, : t + 1], after[:, :, : t + 1], rtol=0, atol=1e-12)


def test_causal_needs_shared_qk() -> None:
    reason = registry.create("lsh").unsupported_reason(
        device="cpu", dtype="float32", causal=True, padded=False, n_q=8, n_k=8
    )
    assert reason is not None and "shared_qk=True" in reason


def test_seed_decides_the_rotations() -> None:
    q, k, v = qkv(256)
    same = [registry.create("lsh", bucket_size=16, seed=7)(q, k, v) for _ in range(2)]
    assert torch.equal(same[0], same[1])
    buckets = [hash_buckets(q, registry.create("lsh", seed=s).rotations(16, 16, q.device)) for s in (1, 2)]
    assert (buckets[0] != buckets[1]).float().mean() > 0.5


def clustered(n: int, centroids: int = 8, d: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """Queries and keys near a few shared centroids (what LSH is built for); values random."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(centroids, d, generator=generator) * 3
    assignment = torch.randint(centroids, (2, 1, 2, n), generator=generator)
    q = centres[assignment[0]] + 0.3 * torch.randn(1, 2, n, d, generator=generator)
    k = centres[assignment[1]] + 0.3 * torch.randn(1, 2, n, d, generator=generator)
    return [q, k, torch.randn(1, 2, n, d, generator=generator)]


def test_error_falls_as_rounds_grow_on_clustered_inputs() -> None:
    q, k, v = clustered(1024)
    reference = exact_reference(q, k, v, causal=False, key_padding_mask=None)
    errors = [
        error_metrics(registry.create("lsh", bucket_size=32, n_hashes=rounds, seed=3)(q, k, v), reference).vs_uniform
        for rounds in (1, 2, 4, 8)
    ]
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < 0.5 * errors[0]


def test_odd_bucket_count_is_refused_by_name() -> None:
    with pytest.raises(VariantError, match="n_buckets: 7 must be even or 1"):
        registry.create("lsh", n_buckets=7)


def test_gradcheck_through_the_attention() -> None:
    q, k, v = (t[:1, :1, :20, :4].clone().requires_grad_() for t in qkv(20))
    variant = registry.create("lsh", n_buckets=1, bucket_size=8, n_hashes=2)
    assert torch.autograd.gradcheck(lambda q, k, v: variant(q, k, v), (q, k, v))
    shared = registry.create("lsh", n_buckets=1, bucket_size=8, n_hashes=2, shared_qk=True)
    assert torch.autograd.gradcheck(lambda q, v: shared(q, q, v, causal=True), (q, v))


def union_of_rounds(
    buckets_q: torch.Tensor, buckets_k: torch.Tensor, chunk: int, back: int, forward: int, causal: bool
) -> torch.Tensor:
    """(b, h, r, n) buckets -> (b, h, n, n) bool: pairs that meet in any round, derived here from the definition.

    Non-causal: sort each round by (bucket, position), chunk index = rank // chunk, a query sees key chunks
    [its chunk - back, its chunk + forward]. Causal: each bucket chunked on its own (rank within the bucket),
    and only keys of the query's bucket, at or before it.
    """
    n = buckets_q.shape[-1]
    positions = torch.arange(n)

    def chunk_index(buckets: torch.Tensor) -> torch.Tensor:
        if causal:  # rank among earlier positions of the same bucket; buckets never share a chunk
            same = buckets[..., :, None] == buckets[..., None, :]  # (b, h, r, n, n)
            return (same & (positions[None, :] < positions[:, None])).sum(-1) // chunk
        order = (buckets * n + positions).argsort(dim=-1)
        return order.argsort(dim=-1) // chunk  # rank of each position in sorted order, as a chunk

    query_chunk, key_chunk = chunk_index(buckets_q), chunk_index(buckets_k)
    offset = key_chunk[..., None, :] - query_chunk[..., :, None]  # (b, h, r, n, n)
    meets = (offset >= -back) & (offset <= forward)
    if causal:
        meets &= buckets_q[..., :, None] == buckets_k[..., None, :]
        meets &= positions[None, :] <= positions[:, None]
    return meets.any(dim=2)


@pytest.mark.parametrize(
    "shared_qk, causal, n, bucket_size, look",
    [
        (False, False, 100, 8, (1, 0)),
        (False, False, 160, 16, (1, 1)),
        (True, False, 77, 8, (1, 0)),
        (True, False, 150, 8, (2, 1)),
        (True, True, 90, 8, (1, 0)),
        (False, False, 300, 1, (1, 0)),  # 300 chunks: the chunk gaps leave bytes for int16
        (True, True, 300, 1, (1, 1)),
    ],
)
@pytest.mark.parametrize("padded", [False, True])
def test_each_pair_met_in_any_round_counts_once(
    shared_qk: bool, causal: bool, n: int, bucket_size: int, look: tuple[int, int], padded: bool
) -> None:
    # the general case, many buckets and rounds, against a dense reference built from the same buckets
    q, k, v = qkv(n, seed=4)
    keys = F.normalize(q, dim=-1) if shared_qk else k
    variant = registry.create(
        "lsh", bucket_size=bucket_size, n_buckets=6, n_hashes=4, shared_qk=shared_qk,
        look_backward=look[0], look_forward=look[1], seed=5,
    )  # fmt: skip
    rotations = variant.rotations(q.shape[-1], 6, q.device)
    buckets_q = hash_buckets(q, rotations)
    buckets_k = buckets_q if shared_qk else hash_buckets(k, rotations)
    allowed = union_of_rounds(buckets_q, buckets_k, bucket_size, *look, causal)
    mask = torch.arange(n)[None, :] >= torch.tensor([n - n // 4, n])[:, None] if padded else None
    if mask is not None:
        allowed &= ~mask[:, None, None, :]
    if shared_qk:  # itself only when nothing else is visible
        allowed &= ~torch.eye(n, dtype=torch.bool)
    expected = dense_masked_attention(q, keys, v, allowed)
    if shared_qk:  # a real token with nothing else to see attends to itself; a padding token outputs zeros
        alone = ~allowed.any(dim=-1, keepdim=True)
        if mask is not None:
            alone &= ~mask[:, None, :, None]
        expected = torch.where(alone, v, expected)
    assert allowed.float().mean() < 0.8, "the test should exercise sparse supports"
    got = variant(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("back, forward", [(1, 0), (0, 0), (2, 1), (0, 3)])
def test_chunk_gap_is_exact_at_the_edge_of_its_byte_range(back: int, forward: int) -> None:
    # uint8 differences wrap; the largest chunk count allowed in bytes must not alias; int16/int32 cover the rest
    from attnbench.variants.lsh import _gap

    for dtype, top in ((torch.uint8, 256 - max(back, forward)), (torch.int16, 700), (torch.int32, 700)):
        chunk = torch.arange(top)
        inside = (chunk[None, :] - chunk[:, None] >= -back) & (chunk[None, :] - chunk[:, None] <= forward)
        gap = _gap(chunk[None, :].to(dtype), chunk[:, None].to(dtype), back, forward)
        assert torch.equal(gap <= back + forward, inside), dtype


def test_a_bias_pattern_leaves_its_bias_alone_and_reads_its_support_from_it() -> None:
    # LSH hands Pattern a cached round-0 bias: rows with no key must be fixed in a copy
    from attnbench.variants.blocks import Pattern

    bias = torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]])
    kept = bias.clone()
    pattern = Pattern(bias=bias)
    assert torch.equal(bias, kept)
    assert pattern.has_key.tolist() == [True, False] and not pattern.complete
    assert pattern.allowed.tolist() == [[True, False], [False, False]]
    assert torch.equal(pattern.bias(torch.float32), torch.tensor([[0.0, float("-inf")], [0.0, 0.0]]))
    assert pattern.bias(torch.float64).dtype == torch.float64


@pytest.mark.parametrize("causal", [False, True])
def test_shared_qk_padding_token_that_sees_nothing_outputs_zeros_not_its_value(causal: bool) -> None:
    """Left padding: a padding query sees no key and outputs zeros (its own value is padding too); a real token
    with nothing else to see attends to itself alone (Reformer's rule), and only a real token does."""
    n, pads = 40, 6
    q, _, v = qkv(n)
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[:, :pads] = True  # element 0 and 1: positions 0-5 are padding
    mask[1, -3:] = True  # element 1: padding at the end too
    variant = registry.create("lsh", n_buckets=1, bucket_size=64, n_hashes=2, shared_qk=True)
    allowed = ~torch.eye(n, dtype=torch.bool)[None, None] & ~mask[:, None, None, :]
    if causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    expected = dense_masked_attention(q, F.normalize(q, dim=-1), v, allowed)
    alone = ~allowed.any(dim=-1) & ~mask[:, None, :]  # (b, 1, n): real tokens with nothing else to see
    expected = torch.where(alone[..., None], v, expected)
    out = variant(q, torch.zeros_like(q), v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    if causal:  # the leading padding tokens see nothing at all
        assert torch.equal(out[:, :, :pads], torch.zeros_like(out[:, :, :pads]))
