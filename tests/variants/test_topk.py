"""Block top-k selection (MoBA, Quest's bound) against definitions written here: the block scores and the choice
from them by brute force, the kept first (sink) block, and the attention against a dense reference that applies the
same selection."""

from __future__ import annotations

import pytest
import torch
from attnbench.ops import dense_masked_attention, generate
from attnbench.registry import registry
from attnbench.variants import topk
from attnbench.variants.blocks import real_key_blocks
from helpers import LargestTensor

PADDING = ("none", "start", "middle", "end")


def qkv(n: int, b: int = 2, h: int = 2, d: int = 8, dtype: torch.dtype = torch.float64):
    generator = torch.Generator().manual_seed(n)
    return tuple(torch.randn(b, h, n, d, generator=generator, dtype=dtype) for _ in range(3))


def padding(n: int, where: str) -> torch.Tensor | None:
    """(2, n): element 0 padded at the start, middle or end (a whole block or more there), element 1 not."""
    if where == "none":
        return None
    position = torch.arange(n)
    padded = {"start": position < n // 4, "middle": (position >= n // 3) & (position < n // 2),
              "end": position >= n - n // 4}[where]  # fmt: skip
    return torch.stack([padded, torch.zeros(n, dtype=torch.bool)])


def block_score(query: torch.Tensor, keys: torch.Tensor, score: str) -> float:
    """The paper's score of one block for one query, from its real keys (m, d): q . mean, or Quest's bound."""
    if score == "mean":
        return float(query @ keys.mean(dim=0))
    high, low = keys.max(dim=0).values, keys.min(dim=0).values
    return float(torch.maximum(query * high, query * low).sum())


def eligible_scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, *, size: int, score: str, causal: bool
) -> list[list[list[dict[int, float]]]]:
    """For each (batch, head, query): the score of every block it may choose, by block (the first block included:
    a kept first block is left out of them by the caller)."""
    b, h, n, _ = q.shape
    blocks = -(-n // size)
    scores = []
    for bi in range(b):
        real = torch.ones(n, dtype=torch.bool) if mask is None else ~mask[bi]
        per_head = []
        for hi in range(h):
            per_query = []
            for i in range(n):
                own = i // size
                eligible = {}
                for c in range(blocks):
                    members = [j for j in range(c * size, min(n, (c + 1) * size)) if real[j]]
                    if c == own or not members or (causal and c > own):
                        continue
                    eligible[c] = block_score(q[bi, hi, i], k[bi, hi, members], score)
                per_query.append(eligible)
            per_head.append(per_query)
        scores.append(per_head)
    return scores


@pytest.mark.parametrize("score", topk.SCORES)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("n, size, top_k", [(75, 8, 3), (41, 5, 2), (64, 8, 1)])
def test_each_query_chooses_its_top_k_blocks_by_the_papers_score(
    n: int, size: int, top_k: int, causal: bool, score: str
) -> None:
    """Never its own block, never a block after its own under causal, never an all-padding block, never the kept
    first block; exactly min(top_k, eligible) blocks; and every chosen block scores at least as high as every one
    left out. The kept first block takes the last slot, for every query outside it."""
    q, k, _ = qkv(n)
    mask = padding(n, "middle")
    expected = eligible_scores(q, k, mask, size=size, score=score, causal=causal)
    for keep_first in (True, False):
        selection = topk.select_blocks(
            q, k, size=size, top_k=top_k, score=score, causal=causal, key_padding_mask=mask, keep_first=keep_first
        )
        if keep_first:
            assert (selection.ids[..., -1] == 0).all()
            assert torch.equal(selection.chosen[..., -1], (torch.arange(n) >= size).expand(2, 2, n))
            selection = topk.Selection(ids=selection.ids[..., :-1], chosen=selection.chosen[..., :-1])
        for bi, per_head in enumerate(expected):
            for hi, per_query in enumerate(per_head):
                for i, scored in enumerate(per_query):
                    eligible = {c: x for c, x in scored.items() if not (keep_first and c == 0)}
                    ids = selection.ids[bi, hi, i][selection.chosen[bi, hi, i]].tolist()
                    assert len(ids) == len(set(ids)) == min(top_k, len(eligible)), (bi, hi, i, ids, eligible)
                    assert set(ids) <= set(eligible), f"query {i} chose a block it may not: {ids} vs {sorted(eligible)}"
                    left_out = [eligible[c] for c in eligible if c not in ids]
                    if left_out:
                        assert min(eligible[c] for c in ids) >= max(left_out) - 1e-12, (i, ids, eligible)


def test_quests_score_bounds_every_key_of_the_block() -> None:
    """minmax is an upper bound of q . k over the block's real keys: a block holding one key close to q ranks
    at least as high as that key's score."""
    q, k, _ = qkv(48)
    real = real_key_blocks(2, 48, 8, None, q.device)
    bound = topk.score_blocks(q, topk.block_summaries(k, real, 8, "minmax"))  # (b, h, i, c)
    exact = torch.einsum("bhid,bhjd->bhij", q, k).unflatten(-1, (6, 8)).amax(dim=-1)
    assert (bound >= exact - 1e-12).all()
    blocks = k.unflatten(2, (6, 8))  # (b, h, c, j, d): the bound is Quest's formula itself, not any looser one
    high, low = blocks.amax(dim=-2), blocks.amin(dim=-2)
    formula = torch.maximum(q[:, :, :, None] * high[:, :, None], q[:, :, :, None] * low[:, :, None]).sum(-1)
    torch.testing.assert_close(bound, formula, rtol=0, atol=1e-6)
    mean = topk.score_blocks(q, topk.block_summaries(k, real, 8, "mean"))
    assert (bound >= mean - 1e-12).all()


@pytest.mark.parametrize("padded", PADDING)
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize(
    "n, params",
    [
        (75, {"block_size": 8, "top_k": 3}),
        (75, {"block_size": 8, "top_k": 3, "score": "minmax"}),
        (130, {"block_size": 16, "top_k": 2, "queries_per_chunk": 5}),
        (75, {"block_size": 8, "top_k": 3, "keep_first_block": False}),
        (41, {"block_size": 5, "top_k": 0}),
        (41, {"block_size": 5, "top_k": 0, "keep_first_block": False}),
        (7, {"block_size": 64}),
        (1, {"block_size": 4, "top_k": 2}),
        (75, {"block_size": 8, "top_k": 3, "select_for": "block"}),
        (130, {"block_size": 16, "top_k": 2, "score": "minmax", "select_for": "block"}),
        (75, {"block_size": 8, "top_k": 3, "keep_first_block": False, "select_for": "block"}),
        (41, {"block_size": 5, "top_k": 0, "select_for": "block"}),
        (7, {"block_size": 64, "select_for": "block"}),
    ],
)
def test_topk_matches_the_dense_reference_of_its_selection(n: int, params: dict, causal: bool, padded: str) -> None:
    """Exact softmax over the own block (causal inside), the first block (unless keep_first_block=False; never
    when all padding) and the chosen blocks, padding removed, at awkward N."""
    variant = registry.create("topk", **params)
    q, k, v = qkv(n)
    mask = padding(n, padded) if n > 4 else None
    selection = variant.select(q, k, causal, mask)
    size = min(params["block_size"], n)
    keep_first = params.get("keep_first_block", True)
    scored = slice(None, -1) if keep_first and n > size else slice(None)  # the kept first block's slot left out
    # the reference support from the scored selection and the rule for the first block, position by position
    allowed = torch.zeros(2, 2, n, n, dtype=torch.bool)
    for bi in range(2):
        first_real = mask is None or not bool(mask[bi, :size].all())
        for hi in range(2):
            for i in range(n):
                chosen = set(selection.ids[bi, hi, i, scored][selection.chosen[bi, hi, i, scored]].tolist())
                for j in range(n):
                    own = j // size == i // size and (not causal or j <= i)
                    first = keep_first and first_real and j < size <= i  # the first block's own: causal
                    allowed[bi, hi, i, j] = own or first or j // size in chosen
    assert torch.equal(variant.support_for(q, k, causal=causal, key_padding_mask=mask), allowed)
    if mask is not None:
        allowed = allowed & ~mask[:, None, None, :]
    expected = dense_masked_attention(q, k, v, allowed)
    out = variant(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("keep_first", [True, False], ids=["keep-first", "score-first"])
@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("score", topk.SCORES)
@pytest.mark.parametrize("select_for", topk.SELECT_FOR)
def test_choosing_every_block_is_softmax_attention(causal: bool, score: str, keep_first: bool, select_for: str) -> None:
    variant = registry.create("topk", block_size=8, top_k=100, score=score, keep_first_block=keep_first,
                              select_for=select_for)  # fmt: skip
    q, k, v = qkv(77)
    mask = padding(77, "end")
    expected = registry.create("full")(q, k, v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(variant(q, k, v, causal=causal, key_padding_mask=mask), expected, rtol=0, atol=1e-12)


def test_kept_blocks_come_on_top_of_top_k() -> None:
    """top_k counts the scored blocks only: under causal, top_k = blocks - 2 with the first block kept covers every
    earlier block (exact causal softmax), and one fewer leaves a block out for the last query block."""
    q, k, v = qkv(77)  # 10 blocks of 8
    mask = padding(77, "end")
    expected = registry.create("full")(q, k, v, causal=True, key_padding_mask=mask)
    every = registry.create("topk", block_size=8, top_k=8)
    torch.testing.assert_close(every(q, k, v, causal=True, key_padding_mask=mask), expected, rtol=0, atol=1e-12)
    short = registry.create("topk", block_size=8, top_k=7)
    support = short.support_for(q, k, causal=True)
    assert support.sum(dim=-1)[..., 72:].eq(torch.arange(73, 78) - 8).all()  # the last block's queries miss one
    assert support.sum(dim=-1)[..., :72].eq(torch.arange(1, 73)).all()  # every earlier query sees all it may


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("top_k", [0, 1])
def test_the_first_and_own_blocks_are_read_at_any_top_k(top_k: int, causal: bool) -> None:
    """With top_k 0 or 1 every query still reads the whole first block and its own block (causal: up to itself),
    and top_k more blocks where it has that many to choose from; with keep_first_block=False only its own is
    sure, and the first block is one of those it may choose."""
    n, size, blocks = 75, 8, 10
    q, k, v = qkv(n)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    own = (i // size == j // size) & ((j <= i) if causal else True)
    own_block = torch.arange(n) // size
    for keep_first in (True, False):
        variant = registry.create("topk", block_size=size, top_k=top_k, keep_first_block=keep_first)
        support = variant.support_for(q, k, causal=causal)
        kept = own | ((j < size) & (i >= size)) if keep_first else own  # the first block's own: as own
        assert (support | ~kept).all(), "a kept block is missing"
        by_block = torch.nn.functional.pad(support & ~kept, (0, blocks * size - n)).unflatten(-1, (blocks, size))
        others = by_block.any(dim=-1).sum(dim=-1)  # (b, h, i): blocks read beyond the kept ones
        may_choose = (own_block if causal else torch.full((n,), blocks - 1)) - (keep_first & (own_block >= 1)).long()
        assert torch.equal(others, may_choose.clamp(max=top_k).expand_as(others))
        out = variant(q, k, v, causal=causal)
        torch.testing.assert_close(out, dense_masked_attention(q, k, v, support), rtol=0, atol=1e-10)


def sink_inputs(n: int = 96, size: int = 8) -> tuple[torch.Tensor, ...]:
    """Queries along one direction u; key 0 a sink far along u (most of every query's mass), the rest of the first
    block far against it, so that block has the lowest mean score of all; other keys small noise."""
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    u = torch.zeros(8, dtype=torch.float64)
    u[0] = 1.0
    q = u + 0.1 * q
    k = 0.3 * k
    k[:, :, 0] = 30 * u
    k[:, :, 1:size] = -5 * u
    v[:, :, 0] = 10.0  # the sink's value stands out in the output
    return q, k, v


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_the_sink_block_is_kept_though_its_mean_scores_lowest(causal: bool) -> None:
    """The first block's mean key points against the queries (its score is the lowest), yet its first key takes
    most of the mass: scored, it is never chosen and the output is far from softmax; kept, it is read by every
    query and the error falls fiftyfold at least."""
    n, size, top_k = 96, 8, 2
    later = (top_k + 1) * size  # causal: earlier queries choose every block they may
    q, k, v = sink_inputs(n, size)
    real = topk.real_key_blocks(1, n, size, None, q.device)
    scores = topk.score_blocks(q, topk.block_summaries(k, real, size, "mean"))  # (b, h, i, c)
    assert (scores.argmin(dim=-1) == 0).all(), "the construction should give the first block the lowest score"
    full = registry.create("full")(q, k, v, causal=causal)
    errors = {}
    for keep_first in (True, False):
        variant = registry.create("topk", block_size=size, top_k=top_k, keep_first_block=keep_first)
        support = variant.support_for(q, k, causal=causal)
        first_read = support[..., later:, :size]  # by queries with more blocks to choose from than top_k
        assert bool(first_read.all() if keep_first else ~first_read.any()), "the first block, kept or dropped"
        out = variant(q, k, v, causal=causal)
        torch.testing.assert_close(out, dense_masked_attention(q, k, v, support), rtol=0, atol=1e-10)
        errors[keep_first] = float((out - full)[..., later:, :].abs().mean())
    assert errors[True] < 0.1 < 5.0 < errors[False], errors


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("keep_first", [True, False], ids=["keep-first", "score-first"])
@pytest.mark.parametrize("n, size, top_k", [(75, 8, 3), (100, 8, 100), (41, 5, 0)])
def test_the_cost_model_counts_every_block_read(n: int, size: int, top_k: int, keep_first: bool, causal: bool) -> None:
    """`expected_choosers` spreads the scored choices evenly, but its total is the number of (query, block) pairs
    the selection reads, the kept first block's included; where every block is read it is exact block by block."""
    q, k, _ = qkv(n)
    selection = topk.select_blocks(
        q, k, size=size, top_k=top_k, score="mean", causal=causal, key_padding_mask=None, keep_first=keep_first
    )
    blocks = -(-n // size)
    read = torch.zeros(blocks, dtype=torch.float64).index_add_(
        0, selection.ids[selection.chosen], torch.ones(int(selection.chosen.sum()), dtype=torch.float64)
    ) / 4  # per (batch, head)
    modelled = topk.expected_choosers(n, size, min(top_k, blocks - 1), causal, keep_first)
    assert float(modelled.sum()) == pytest.approx(float(read.sum()))
    if keep_first:
        assert float(modelled[0]) == float(read[0]) == n - size
    if top_k >= blocks:
        torch.testing.assert_close(modelled, read, rtol=0, atol=1e-9)


def test_causal_never_peeks_at_future_blocks() -> None:
    """Under causal, changing every key and value after a query (its own block's later keys and all later blocks)
    changes neither which blocks it chooses nor its output: a future block cannot win the selection."""
    variant = registry.create("topk", block_size=8, top_k=2)
    q, k, v = qkv(80)
    cut = 43  # inside block 5
    k2, v2 = k.clone(), v.clone()
    k2[:, :, cut + 1 :] = 50 * torch.randn_like(k2[:, :, cut + 1 :])  # future keys that would win any score
    v2[:, :, cut + 1 :] += 7
    before, after = variant.select(q, k, True, None), variant.select(q, k2, True, None)
    assert torch.equal(before.ids[:, :, : cut + 1], after.ids[:, :, : cut + 1])
    out, out2 = variant(q, k, v, causal=True), variant(q, k2, v2, causal=True)
    torch.testing.assert_close(out[:, :, : cut + 1], out2[:, :, : cut + 1], rtol=0, atol=0)
    assert (before.ids[before.chosen] < 10).all()
    chosen_blocks = before.ids.masked_fill(~before.chosen, -1)  # each query's choice lies before its own block
    own = torch.arange(80)[None, None, :, None] // 8
    assert (chosen_blocks < own).all()


def test_scores_far_from_zero_merge_without_overflow() -> None:
    """Log-sum-exps near 10^3 (exp overflows float32 and float64): the parts are merged relative to their max."""
    variant = registry.create("topk", block_size=8, top_k=2)
    q, k, v = qkv(60)
    q = q * 400
    selection_support = variant.support_for(q, k, causal=False)
    out = variant(q.float(), k.float(), v.float())
    expected = dense_masked_attention(q, k, v, selection_support)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-4)


def test_largest_is_torch_topk() -> None:
    generator = torch.Generator().manual_seed(0)
    for shape, k in [((3, 5, 300), 8), ((4, 257), 3), ((2, 66), 8), ((6, 64), 16), ((3, 40), 8)]:
        scores = torch.randn(shape, generator=generator)
        scores[..., ::7] = float("-inf")
        values, indices = topk.largest(scores, k)
        torch.testing.assert_close(values, scores.topk(k, dim=-1).values, rtol=0, atol=0)
        assert torch.equal(scores.gather(-1, indices), values)
    ties = torch.randint(0, 3, (50, 200), generator=generator).float()
    values, indices = topk.largest(ties, 8)
    assert torch.equal(values, ties.topk(8, dim=-1).values) and torch.equal(ties.gather(-1, indices), values)
    assert all(len(set(row)) == 8 for row in indices.tolist())


def test_scoring_in_chunks_of_queries_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    variant = registry.create("topk", block_size=8, top_k=3)
    q, k, v = qkv(100)
    whole = variant(q, k, v, causal=True)
    monkeypatch.setattr(topk, "SCORE_QUERY_BLOCKS", 1)  # a block of queries at a time
    torch.testing.assert_close(variant(q, k, v, causal=True), whole, rtol=0, atol=0)


def test_gradients_match_finite_differences() -> None:
    variant = registry.create("topk", block_size=3, top_k=2, queries_per_chunk=2)
    q, k, v = (t[:1, :1, :17, :4].clone().requires_grad_() for t in qkv(17))
    mask = torch.zeros(1, 17, dtype=torch.bool)
    mask[0, 5:7] = True
    for causal in (False, True):
        call = lambda q, k, v: variant(q, k, v, causal=causal, key_padding_mask=mask)  # noqa: E731
        assert torch.autograd.gradcheck(call, (q, k, v))


def test_never_builds_an_n_by_n_tensor() -> None:
    variant = registry.create("topk")
    n = 8192
    q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
    with LargestTensor() as largest, torch.no_grad():
        variant(q, k, v, causal=True)
    assert largest.numel < n * n / 16, f"a tensor of {largest.numel} elements: N x N is {n * n}"


@pytest.mark.parametrize("keep_first", [True, False], ids=["keep-first", "score-first"])
@pytest.mark.parametrize("score", topk.SCORES)
@pytest.mark.parametrize("select_for", topk.SELECT_FOR)
def test_a_nan_key_is_chosen_so_the_nan_shows(keep_first: bool, score: str, select_for: str) -> None:
    """A NaN key makes its block's score NaN: the block is chosen by every query (not silently dropped from the
    selection), so every output that could have read it is NaN, as with full attention; so does every decode step
    (Quest's pages ranked by the same bound)."""
    variant = registry.create("topk", block_size=8, top_k=3, keep_first_block=keep_first, score=score,
                              select_for=select_for)  # fmt: skip
    q, k, v = qkv(64)
    k[0, 0, 29, 0] = float("nan")  # in block 3
    selection = variant.select(q, k, False, None)
    scored = slice(None, 3)  # the kept first block's slot after them
    picks_block_3 = ((selection.ids[0, 0, :, scored] == 3) & selection.chosen[0, 0, :, scored]).any(dim=-1)
    outside = torch.arange(64) // 8 != 3
    assert picks_block_3[outside].all() and selection.chosen[0, 0, :, scored].all()
    assert variant(q, k, v)[0, 0].isnan().any(dim=-1).all()
    _, steps, _ = generate(variant, q, k, v, prompt=40)  # the NaN key in the prompt's cache
    assert steps[0, 0].isnan().any(dim=-1).all()


def test_low_precision_inputs_are_ranked_in_float32() -> None:
    q, k, _ = qkv(300, dtype=torch.float32)
    variant = registry.create("topk", block_size=8, top_k=3)
    low = variant.select(q.bfloat16(), k.bfloat16(), False, None)
    same = variant.select(q.bfloat16().float(), k.bfloat16().float(), False, None)
    assert torch.equal(low.ids.sort(dim=-1).values, same.ids.sort(dim=-1).values)


def test_the_self_checks_judge_a_selection_where_there_is_one_to_make() -> None:
    """A dynamic-support variant whose support_for misreports its choice passes at the check's usual small N (every
    block chosen there) and fails at CHOSEN_SUPPORT_CHECK_LEN, which `check` and the run's self-check also use."""
    from attnbench.conformance import CheckContext, check_exact_pattern
    from attnbench.interface import CHOSEN_SUPPORT_CHECK_LEN
    from attnbench.ops import exactness_error

    class Misreported(topk.BlockTopKAttention):
        name = "misreported"

        def support_for(self, q, k, *, causal, key_padding_mask=None):
            wider = topk.select_blocks(
                q, k, size=self.size(k.shape[-2]), top_k=self.top_k + 1, score=self.score, causal=causal,
                key_padding_mask=key_padding_mask, keep_first=self.keep_first_block,
            )  # fmt: skip
            return topk.selected_support(wider, k.shape[-2], self.size(k.shape[-2]), causal)

    cpu = torch.device("cpu")
    assert exactness_error(Misreported(), n=75, causal=False, padded=False, device=cpu, dtype=torch.float64) < 1e-12
    wrong = exactness_error(
        Misreported(), n=CHOSEN_SUPPORT_CHECK_LEN, causal=False, padded=False, device=cpu, dtype=torch.float64
    )
    assert wrong > 1e-3
    result = check_exact_pattern(CheckContext(lambda: Misreported(), cpu, torch.float64))
    assert result.status == "fail" and "N = 75, 300, 1100" in result.detail



@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("score", topk.SCORES)
@pytest.mark.parametrize("padded", ["none", "middle"])
def test_a_query_block_reads_the_top_k_blocks_of_its_mean_query(causal: bool, score: str, padded: str) -> None:
    """select_for="block": every query of a block reads the same blocks, the top_k of the block's mean query by the
    paper's score over real keys (brute force here), among the earlier blocks (causal) or the others; the first
    block kept besides."""
    n, size, top_k = 83, 8, 3
    variant = registry.create("topk", block_size=size, top_k=top_k, score=score, select_for="block")
    q, k, _ = qkv(n)
    mask = padding(n, padded)
    selection = variant.select(q, k, causal, mask)
    blocks = -(-n // size)
    for bi in range(2):
        real = torch.ones(n, dtype=torch.bool) if mask is None else ~mask[bi]
        for hi in range(2):
            for c in range(blocks):
                rows = slice(c * size, min(n, (c + 1) * size))
                mean_query = q[bi, hi, rows].mean(dim=0)
                candidates = [b for b in range(1, c if causal else blocks) if b != c
                              and bool(real[b * size : (b + 1) * size].any())]  # fmt: skip
                scores = {b: block_score(mean_query, k[bi, hi, b * size : (b + 1) * size][real[b * size : (b + 1) * size]],
                                         score) for b in candidates}  # fmt: skip
                expected = set(sorted(scores, key=scores.get, reverse=True)[:top_k])
                for i in range(rows.start, rows.stop):
                    ids, chosen = selection.ids[bi, hi, i], selection.chosen[bi, hi, i]
                    scored = set(ids[:-1][chosen[:-1]].tolist())  # the last slot: the kept first block
                    assert scored == expected, (bi, hi, c, i)
                    assert bool(chosen[-1]) == (c >= 1 and bool(real[:size].any()))


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
def test_a_block_of_one_query_shares_its_choice_with_nobody(causal: bool) -> None:
    """Limiting case: with blocks of one position the block-shared choice is the per-query one (MoBA's)."""
    q, k, v = qkv(29)
    mask = padding(29, "middle")
    per_query, per_block = (registry.create("topk", block_size=1, top_k=4, select_for=who) for who in topk.SELECT_FOR)
    torch.testing.assert_close(per_block(q, k, v, causal=causal, key_padding_mask=mask),
                               per_query(q, k, v, causal=causal, key_padding_mask=mask), rtol=0, atol=1e-12)  # fmt: skip


def test_the_block_shared_selection_never_builds_an_n_by_n_tensor() -> None:
    variant = registry.create("topk", select_for="block")
    n = 8192
    q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
    with LargestTensor() as largest, torch.no_grad():
        variant(q, k, v, causal=True)
    assert largest.numel < n * n / 16, f"a tensor of {largest.numel} elements: N x N is {n * n}"
