"""Block top-k selection: MoBA (Lu et al., 2025, "MoBA: Mixture of Block Attention for Long-Context LLMs", §2.2),
with Quest's block bound (Tang et al., 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
Inference", §3.2) as the `score="minmax"` option.

Keys are cut into blocks of `block_size`. Each query attends, by exact softmax, to the keys of two blocks it always
keeps, its own block (the local one) and the first block (the attention sink: real decoders put much of their mass
on the first token, whose block a mean score misses), and of the `top_k` highest-scoring blocks among the rest:
(top_k + 2) * block_size keys at most. MoBA (§2.2) always keeps the own block; NSA's selection (Yuan et al., 2025,
"Native Sparse Attention", §3.3.2) keeps the initial block and the local ones too.
- score="mean" (MoBA's gate): s(q, block) = q · mean(K_block), the mean over the block's real keys;
- score="minmax" (Quest): s(q, block) = Σ_d max(q_d max_j K_jd, q_d min_j K_jd), an upper bound of q · k over the
  block's keys, so a block holding one key close to q is not averaged away.
Causal (MoBA's decoder form): blocks after the query's own are never scored or chosen, and the own block is masked
causally inside; a chosen block (the first one too) lies wholly before the query, so every key in it is visible.
Key padding: padded keys leave the block statistics; a block with no real key is never chosen, the first one
included. The budget: `top_k` counts the scored blocks only, the kept ones come on top: top_k = 8 reads 10 blocks
(9 for the first block's own queries, which keep one block fewer), where MoBA's reference code counts the own block
among its top_k. `keep_first_block=False` puts the first block back among the scored ones (top_k + 1 blocks; the
own block is kept either way: a causal query in the first block has no other). The support depends on q and k:
`support_for` returns the one chosen, for the self-check and the dropped mass. top_k >= the number of other blocks
is exact softmax attention.

Computed without an N x N tensor: the block scores are taken 16 query blocks at a time (held: 16 N scores; causal:
only the blocks before the chunk's last query's own, so about half the scores of all blocks), from block summaries
reduced from views of the keys (no copy of them without key padding);
the chosen (query, block) pairs are grouped by key block, each group cut into chunks of `queries_per_chunk` queries,
and every chunk attends to its block's keys through the fused SDPA kernel (queries gathered, keys one block each);
the kept first block is one more chosen block, read by every query outside it; the parts are merged by their
log-sum-exp, with the own block's part computed block-diagonally. Without autograd the chunks go in batches of
half the queries' slots, each merged into a running sum (`OnlineMerge`) and dropped: the memory of a batch, not of
all (top_k + 1) N gathered queries and outputs at once. At N=8192 (B=1, H=8, D=64) a call peaks at 2.7x exact
attention's fused kernel (46 MiB against 17.4): the choices and their pairs hold (top_k + 1) ids a query and head
where full holds one log-sum-exp, and the tiles need the whole sequence's pairs grouped by key block: cut into ranges
of queries small enough to fit full's peak, a range leaves a handful of queries per key block, and the kernel runs
tiles of 16 queries at 136 M scores/s against 176 for tiles of 128 (16K, one core, 2026-11-28).

Decode (`prefill` / `step`) is Quest's, whatever `score` (ported from its authors' code: the decode path of
quest/models/QuestAttention.py, whose kernels' reference is `_ref_self_approx_attention` in
quest/tests/test_approx_attention.py; the bound is evaluation/quest_attention.py's): the cache, per key/value head, is
cut in pages of `block_size` and keeps each page's elementwise key max and min (2 d values a page, the metadata); a
step (its token appended first) ranks the pages before its own by the bound and attends by exact softmax to its own
page (always read: Quest's current page), the first page when kept, and the top_k ranked pages.
- select_per="query-head" (Quest): each query head ranks by its own query and reads its own pages of its key/value
  head (under grouped-query attention the group's heads may read different pages; the cache is not repeated);
- select_per="kv-head": a key/value head ranks once, by the mean of its query heads' bounds, and its group shares the
  pages (one choice per group).
Quest as published is keep_first_block=False, select_per="query-head": top_k + 1 pages read per query head (Quest's
page budget, the current page among them), and every page while no more than top_k are ranked. The NSA-style rule
(the decode before 2026-11-28: a forced first page, the group's mean) is keep_first_block=True, select_per="kv-head".
With score="minmax" and select_per="query-head" a step is the causal forward's last row (`decode_equals_forward`);
MoBA's mean gate is a prefill method and is not kept.

b - batch, h - heads, x - (b h), i - query position, c - key block (page), j - key in block, s - chosen slot,
t - chunk, r - query in chunk (decode: query head of a key/value head's group), g - key/value heads, d - head dim,
e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from attnbench.interface import (
    AttentionVariant,
    Capabilities,
    Cost,
    DecodeState,
    Hyperparameter,
    Shape,
    UnsupportedOptionError,
    expand_kv_heads,
    query_group,
    softmax_attention_flops,
)
from attnbench.interface import default_scale
from attnbench.ops import causal_allows
from attnbench.variants.block_scores import block_summaries, score_blocks
from attnbench.variants.quest_cache import QuestCache
from attnbench.variants.topk_shared import SHARED_AT_ONCE, shared_attention, shared_selection
from attnbench.variants.blocks import (
    Pattern,
    block_count,
    expand_over_heads,
    needs_grad,
    partial_attention,
    query_blocks,
    real_key_blocks,
)
from attnbench.variants.window import unblocked
from einops import rearrange
from torch import Tensor

SCORE_QUERY_BLOCKS = 16  # queries are scored this many blocks at a time: (16 b) x N / b scores held, linear in N
SCORES = ("mean", "minmax")
SELECT_FOR = ("query", "block")  # see `attnbench.variants.topk_shared`
SELECT_PER = Hyperparameter(
    "query-head", "grouped-query decode: who ranks a key/value head's pages, each of its query heads by its own query "
    "(query-head: Quest's rule, its heads may read different pages; the cache stays per key/value head) or the "
    "key/value head once, by the mean of its query heads' bounds (kv-head: the group shares the pages; with "
    "keep_first_block, the NSA-style rule)", kind=str, choices=("query-head", "kv-head"),
)  # fmt: skip


def score_chunk(size: int) -> int:
    """Queries whose block scores are taken at once: whole query blocks, so the scores held grow with N only."""
    return SCORE_QUERY_BLOCKS * size


GROUP = 8  # `largest` narrows to the top k groups of this many scores before its exact top k (8: fastest of 4, 8, 16)
NARROW_FROM = 64  # scores per row from which narrowing pays


def largest(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest scores along the last axis and their indices, exactly as torch.topk gives (ties aside), about
    35% faster for rows of 256: the k largest lie in the k groups of GROUP scores with the largest maxima (a score
    outside them is at most the k-th largest group maximum, and those k maxima are k scores at least as large),
    so the rows are narrowed to those groups first."""
    width = scores.shape[-1]
    if width < NARROW_FROM or k * GROUP >= width:
        return scores.topk(k, dim=-1)
    padded = F.pad(scores, (0, -width % GROUP), value=float("-inf")) if width % GROUP else scores
    groups = rearrange(padded, "... (g m) -> ... g m", m=GROUP).amax(dim=-1).topk(k, dim=-1, sorted=False).indices
    members = groups[..., None] * GROUP + torch.arange(GROUP, device=scores.device)  # (..., k, m): their scores' places
    members = rearrange(members, "... k m -> ... (k m)")
    values, within = padded.gather(-1, members).topk(k, dim=-1)  # a gather along the last axis: the fast one
    return values, members.gather(-1, within)


@dataclass
class Selection:
    """The key blocks each query reads besides its own: ids (b, h, i, s) and whether slot s holds one (b, h, i, s).
    The scored choices come first; with the first block kept, it is the last slot (empty in the first block's own
    queries, or where it has no real key)."""

    ids: Tensor
    chosen: Tensor


def select_blocks(
    q: Tensor,
    k: Tensor,
    *,
    size: int,
    top_k: int,
    score: str,
    causal: bool,
    key_padding_mask: Tensor | None,
    keep_first: bool,
) -> Selection:
    """For each query, its `top_k` highest-scoring key blocks other than its own (causal: only earlier ones; never a
    block without a real key), and with `keep_first` the first block besides, unscored and outside the top_k. Fewer
    slots are filled when fewer blocks qualify; among equal scores, any."""
    b, h, n, _ = q.shape
    real = real_key_blocks(b, k.shape[-2], size, key_padding_mask, q.device)  # (b, c, j)
    blocks = real.shape[1]
    slots = min(top_k, blocks - 1)
    keep_first = keep_first and blocks > 1  # one block: it is every query's own
    work = torch.promote_types(q.dtype, torch.float32)  # ranked in float32 at least: bfloat16 scores flip near-ties
    summaries = block_summaries(k.to(work), real, size, score)
    poisoned = any(bool(s.isnan().any()) for s in summaries)  # a NaN key: its block is chosen, so the NaN shows
    has_real = real.any(dim=-1)[:, None, None, :]  # (b, 1, 1, c)
    every_block_real = bool(has_real.all())
    chunk = score_chunk(size)
    ids = torch.zeros(b, h, n, slots + keep_first, dtype=torch.long, device=q.device)  # the kept first block: id 0
    chosen = torch.zeros(b, h, n, slots + keep_first, dtype=torch.bool, device=q.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        width = blocks
        if causal:  # blocks from the chunk's last query's own one on are never chosen: not scored (whole GROUPs)
            width = min(blocks, max(slots, -(-((stop - 1) // size) // GROUP) * GROUP))
        chunk_summaries = tuple(summary[:, :, :width] for summary in summaries)
        scores = score_blocks(q[:, :, start:stop].to(work), chunk_summaries)  # (b, h, r, c')
        if poisoned:
            scores.nan_to_num_(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
        own = torch.arange(start, stop, device=q.device)[:, None] // size  # (r, 1)
        if causal:  # the own block and later ones out
            scores.masked_fill_(torch.arange(width, device=q.device)[None, :] >= own, float("-inf"))
        else:  # the own block out
            scores.scatter_(-1, own.expand(b, h, stop - start, 1), float("-inf"))
        if not every_block_real:
            scores.masked_fill_(~has_real[..., :width], float("-inf"))
        if keep_first:  # kept, so not among the scored
            scores[..., 0] = float("-inf")
        values, indices = largest(scores, slots)  # (b, h, r, s)
        ids[:, :, start:stop, :slots] = indices
        chosen[:, :, start:stop, :slots] = values > float("-inf")
    if keep_first:  # the last slot: the first block, for every query outside it, where it has a real key
        outside = torch.arange(n, device=q.device) >= size  # (i,) queries not in the first block
        chosen[..., slots] = (real[:, 0].any(dim=-1)[:, None] & outside)[:, None, :]  # (b, 1, i)
    return Selection(ids=ids, chosen=chosen)


def selected_support(selection: Selection, n_k: int, size: int, causal: bool) -> Tensor:
    """(b, h, i, j) bool, dense: the keys of each query's own block (causal: up to itself) and of the other blocks
    it reads (its chosen ones and the kept first one).
    For checks at small N only."""
    b, h, n, _ = selection.ids.shape
    blocks = block_count(n_k, size)
    picked = torch.zeros(b, h, n, blocks + 1, dtype=torch.bool, device=selection.ids.device)
    picked.scatter_(-1, selection.ids.masked_fill(~selection.chosen, blocks), True)  # unused slots hit the spare
    key_block = torch.arange(n_k, device=picked.device) // size
    i, j = torch.arange(n, device=picked.device)[:, None], torch.arange(n_k, device=picked.device)[None, :]
    own = key_block[None, :] == (i // size)
    own = own & causal_allows(i, j) if causal else own
    return picked[..., key_block] | own


@dataclass
class Chunks:
    """The chosen (query, block) pairs grouped by key block, in chunks of r queries: slot (t r) holds query row
    `rows[t r]` (a row of (b h i); 0 where `used` is False) and chunk t attends to key block `group[t]` (of (b h c))."""

    rows: Tensor  # (t r,) long
    used: Tensor  # (t r,) bool
    group: Tensor  # (t,) long


    def part(self, start: int, stop: int) -> "Chunks":
        """Chunks start..stop-1 (their slots with them): a batch the forward pass attends to at once."""
        r = len(self.rows) // max(1, len(self.group))
        return Chunks(self.rows[start * r : stop * r], self.used[start * r : stop * r], self.group[start:stop])


def chunk_pairs(selection: Selection, blocks: int, per_chunk: int) -> Chunks:
    """Group the chosen pairs by (batch-head, key block) and cut each group into chunks of `per_chunk` queries."""
    b, h, n, slots = selection.ids.shape
    device = selection.ids.device
    narrow = torch.int32 if b * h * blocks < 2**31 else torch.long  # sorting int32 takes half the time of int64
    group = (torch.arange(b * h, device=device, dtype=narrow).view(b, h, 1, 1) * blocks + selection.ids.to(narrow))
    group = group.flatten()  # ((b h i s),): the (b h c) each pair reads
    if bool(selection.chosen.all()):  # every slot filled (no causal start, enough real blocks): no compaction
        pair = None
    else:
        pair = selection.chosen.flatten().nonzero().squeeze(1)  # (p,) the filled slots of (b h i s)
        group = group[pair]
    group, order = torch.sort(group, stable=True)
    row = (order if pair is None else pair[order]).floor_divide_(slots)  # (p,) the (b h i) row of each pair, by group
    del order, pair  # each (p,) int64: dropped as soon as used, as below
    counts = torch.bincount(group, minlength=b * h * blocks)  # (b h c)
    chunks_per_group = -(-counts // per_chunk)
    first_slot = (torch.cumsum(chunks_per_group, 0) - chunks_per_group) * per_chunk  # of each group's first chunk
    first_pair = torch.cumsum(counts, 0) - counts
    slot = (first_slot - first_pair).index_select(0, group).add_(torch.arange(len(group), device=device))  # in (t r)
    del group
    total = int(chunks_per_group.sum()) * per_chunk
    rows = torch.zeros(total, dtype=torch.long, device=device).index_put_((slot,), row)
    del row
    used = torch.zeros(total, dtype=torch.bool, device=device).index_fill_(0, slot, True)
    del slot
    chunk_group = torch.repeat_interleave(torch.arange(b * h * blocks, device=device), chunks_per_group)
    return Chunks(rows, used, chunk_group)


class BlockTopKAttention(AttentionVariant):
    """Each query attends to its own key block, the first key block, and the top_k other key blocks its score ranks
    highest."""

    name = "topk"
    family = "block-sparse"
    exact = True
    supports = Capabilities(
        cross_attention=False,
        subquadratic_memory=True,
        grouped_kv=True,
        notes={"cross_attention": "a query's own block is the block of its position in the one sequence"},
    )
    hyperparameters = {
        "block_size": Hyperparameter(64, "keys per block (MoBA's and Quest's experiments use 64 and 16 up)", minimum=1),
        "top_k": Hyperparameter(8, "blocks chosen by score per query, besides the kept own and first blocks (8)",
                                minimum=0),
        "keep_first_block": Hyperparameter(True, "always attend to the first key block (the attention sink), as NSA "
                                           "does, outside top_k; False: it is scored like the others (Quest's "
                                           "decode)", bool),
        "score": Hyperparameter("mean", "block score: mean (MoBA: q . mean K) or minmax (Quest's bound)", str,
                                choices=SCORES),
        "queries_per_chunk": Hyperparameter(128, "queries of one key block attended to together (speed and memory)",
                                            minimum=1),
        "select_per": SELECT_PER,
        "select_for": Hyperparameter(
            "query", "who ranks the key blocks: each query (MoBA), or each query block by its mean query, its "
            "queries sharing the choice (XAttention/SeerAttention/NSA's compressed branch: one attention per query "
            "block, faster)", str, choices=SELECT_FOR,
        ),
    }

    def size(self, n: int) -> int:
        """The block size for a sequence of n: `block_size`, clipped to n."""
        return min(self.block_size, n)

    def select(self, q: Tensor, k: Tensor, causal: bool, key_padding_mask: Tensor | None) -> Selection:
        """The blocks each query reads besides its own (see `select_blocks`; with select_for="block", its query
        block's, `shared_selection`)."""
        size = self.size(k.shape[-2])
        if self.select_for == "block":
            ids, used = self.shared(q, k, causal, key_padding_mask)  # (b, h, c, l), the own block last
            block = torch.arange(q.shape[-2], device=q.device) // size  # each query's block
            return Selection(ids=ids[:, :, block, :-1], chosen=used[:, :, block, :-1])
        return select_blocks(
            q, k, size=size, top_k=self.top_k, score=self.score, causal=causal, key_padding_mask=key_padding_mask,
            keep_first=self.keep_first_block,
        )

    def shared(self, q: Tensor, k: Tensor, causal: bool, key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """select_for="block": the key blocks each query block reads, ids and used (b, h, c, l)."""
        return shared_selection(
            q, k, size=self.size(k.shape[-2]), top_k=self.top_k, score=self.score, causal=causal,
            key_padding_mask=key_padding_mask, keep_first=self.keep_first_block,
        )

    def support_for(
        self, q: Tensor, k: Tensor, *, causal: bool, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        selection = self.select(q, k, causal, key_padding_mask)
        return selected_support(selection, k.shape[-2], self.size(k.shape[-2]), causal)

    @property
    def decode_equals_forward(self) -> bool:  # type: ignore[override]
        """Decode is Quest's: it ranks pages by the min/max bound, as the forward does with score="minmax" (then
        a step is the causal forward's last row: own block, first block when kept, top_k earlier ones by the same
        bound, per query head; with select_for="block" the forward ranks by a query block's mean query, a step by its
        own). With select_per="kv-head" under grouped-query attention a step ranks by the group's mean bound: equal
        only for one query head per key/value head (the self-check's)."""
        return self.score == "minmax" and self.select_for == "query"

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The causal forward, and Quest's paged cache (page = `block_size`) with each page's key max and min."""
        group = query_group(q, k)
        state = self.prefill_state(q, k, v, room=room)
        return self(q, expand_kv_heads(k, group), expand_kv_heads(v, group), causal=True), state

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        """Quest's paged cache (page = `block_size`) with each page's key max and min, per key/value head."""
        choosers = query_group(q, k) if self.select_per == "query-head" else 1
        return QuestCache.of_prompt(
            k, v, page=self.block_size, room=room, top_k=self.top_k, keep_first=self.keep_first_block,
            choosers=choosers,
        )

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, QuestCache):
            raise UnsupportedOptionError(f"topk cannot step from a {type(state).__name__}")
        return state.step(q, k, v), state

    def steps(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """A chunk of tokens at once (`QuestCache.steps`), each as its own step would take it."""
        if not isinstance(state, QuestCache):
            raise UnsupportedOptionError(f"topk cannot step from a {type(state).__name__}")
        return state.steps(q, k, v), state

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        b, h, n, _ = q.shape
        size = self.size(n)
        real = real_key_blocks(b, n, size, key_padding_mask, q.device)  # (b, c, j)
        if self.select_for == "block":
            with torch.no_grad():
                ids, used = self.shared(q, k, causal, key_padding_mask)
            return shared_attention(q, k, v, ids, used, real, causal=causal)
        blocks = real.shape[1]
        own = self.own_block(q, k, v, real, causal)  # (x, i, e), (x, i)
        with torch.no_grad():
            selection = self.select(q, k, causal, key_padding_mask)
        if not bool(selection.chosen.any()):
            return rearrange(own[0], "(b h) i e -> b h i e", b=b)
        chunks = chunk_pairs(selection, blocks, self.queries_per_chunk)
        del selection  # its pairs are in `chunks`: dropped before the batches take their memory
        if needs_grad(q, k, v):  # autograd keeps every chunk's output for the backward pass anyway: one merge
            out, lse = self.chosen_blocks(q, k, v, real, chunks)  # ((t r), e), ((t r),)
            return rearrange(merge_chunks(own, out, lse, chunks), "(b h) i e -> b h i e", b=b)
        merged = OnlineMerge(*own)
        per_batch = max(1, b * h * n // (2 * self.queries_per_chunk))  # chunks at once: half the queries' slots
        for start in range(0, len(chunks.group), per_batch):
            part = chunks.part(start, start + per_batch)
            merged.add(*self.chosen_blocks(q, k, v, real, part), part)
        return rearrange(merged.result(), "(b h) i e -> b h i e", b=b)

    def own_block(self, q: Tensor, k: Tensor, v: Tensor, real: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
        """Each query against its own key block (block-diagonal), causal inside it: ((b h) i e), ((b h) i)."""
        b, h, n, _ = q.shape
        size = real.shape[-1]
        position = torch.arange(size, device=q.device)
        allowed = real[:, :, None, :]  # (b, c, 1, j)
        if causal:
            allowed = allowed & causal_allows(position[:, None], position[None, :])  # (b, c, i, j)
        blocks = [query_blocks(x, size) for x in (q, k, v)]  # ((b h), c, j, d)
        part = partial_attention(*blocks, Pattern(expand_over_heads(allowed, h)))
        flat = "b h i ... -> (b h) i ..."
        return rearrange(unblocked(part.out, b, n), flat), rearrange(unblocked(part.lse, b, n), flat)

    def chosen_blocks(self, q: Tensor, k: Tensor, v: Tensor, real: Tensor, chunks: Chunks) -> tuple[Tensor, Tensor]:
        """Every chunk of queries against its key block: outputs ((t r), e) and log-sum-exps ((t r),)."""
        h, d = q.shape[1], q.shape[-1]
        size, blocks = real.shape[-1], real.shape[1]
        r = self.queries_per_chunk
        queries = rearrange(q, "b h i d -> (b h i) d").index_select(0, chunks.rows).view(-1, 1, r, d)  # (t, 1, r, d)
        keys, values = (
            rearrange(query_blocks(x, size), "x c j d -> (x c) j d").index_select(0, chunks.group)[:, None]
            for x in (k, v)
        )  # (t, 1, j, d|e), one key block each
        batch, block = chunks.group // (h * blocks), chunks.group % blocks
        allowed = real[batch, block][:, None, None, :]  # (t, 1, 1, j)
        part = partial_attention(queries, keys, values, Pattern(allowed))
        return rearrange(part.out, "t one r e -> (t one r) e"), rearrange(part.lse, "t one r -> (t one r)")

    def cost(self, shape: Shape) -> Cost:
        if self.select_for == "block":
            return self.shared_cost(shape)
        s = shape
        heads = s.batch * s.heads
        size = self.size(s.n_k)
        blocks = block_count(s.n_k, size)
        slots = min(self.top_k, blocks - 1)
        choosers = expected_choosers(s.n_k, size, slots, s.causal, self.keep_first_block)  # (c,) readers of each
        r = self.queries_per_chunk
        chunk_slots = heads * float((torch.ceil(choosers / r) * r).sum())
        own = heads * blocks * size * size
        summary_dims = 1 if self.score == "mean" else 2
        select = 2 * heads * s.n_q * blocks * s.head_dim * summary_dims  # the block scores, matmuls
        matmul, other = softmax_attention_flops(own + chunk_slots * size, s)
        gathered = chunk_slots * s.head_dim + chunk_slots / r * size * (s.head_dim + s.value_dim)
        io = heads * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) + gathered
        scores_held = heads * min(s.n_q, score_chunk(size)) * blocks
        at_once = min(chunk_slots, max(r, heads * s.n_q // 2)) / max(chunk_slots, 1)  # the share of one batch
        # a batch's gathered queries, keys and outputs, and the merge's running sum, total and maximum
        parts = chunk_slots * at_once * (s.value_dim + 1) + heads * s.n_q * (s.value_dim + 2)
        gathered_held = gathered * at_once
        return Cost(
            flops=matmul + other + select + heads * s.n_k * s.head_dim * summary_dims,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=(gathered_held + parts + scores_held) * s.dtype_bytes,
            matmul_flops=matmul + select,
        )


    def shared_cost(self, shape: Shape) -> Cost:
        """select_for="block": each query block's (top_k + 2) blocks read densely (masked scores computed), the
        pooled queries' block scores, and SHARED_AT_ONCE query blocks' gathered keys, values and pattern held."""
        s = shape
        heads = s.batch * s.heads
        size = self.size(s.n_k)
        blocks = block_count(s.n_k, size)
        read = min(self.top_k, blocks - 1) + int(self.keep_first_block and blocks > 1) + 1  # blocks a query block reads
        pairs = heads * blocks * size * read * size
        matmul, other = softmax_attention_flops(pairs, s)
        summary_dims = 1 if self.score == "mean" else 2
        select = 2 * heads * blocks * blocks * s.head_dim * summary_dims
        gathered = heads * blocks * read * size * (s.head_dim + s.value_dim)
        io = heads * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim) + gathered
        at_once = min(blocks, SHARED_AT_ONCE) / blocks
        held = gathered * at_once + heads * min(blocks, SHARED_AT_ONCE) * size * read * size  # keys, values, bias
        return Cost(
            flops=matmul + other + select + heads * s.n_k * s.head_dim * summary_dims,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=held * s.dtype_bytes + heads * blocks * blocks * 4,
            matmul_flops=matmul + select,
        )

def expected_choosers(n: int, size: int, slots: int, causal: bool, keep_first: bool) -> Tensor:
    """(c,) float64: how many queries read each key block besides their own: with `keep_first`, the first block
    every query outside it, and each query's `slots` scored choices spread evenly over the blocks it may choose
    (exact where it may choose no more than `slots`, as at small N)."""
    blocks = block_count(n, size)
    sizes = torch.full((blocks,), float(size), dtype=torch.float64)
    sizes[-1] = n - (blocks - 1) * size
    if blocks == 1:
        return torch.zeros(blocks, dtype=torch.float64)
    query_block = torch.arange(blocks, dtype=torch.float64)
    kept = float(keep_first) * (query_block >= 1)  # the first block, taken out of the scored ones
    candidates = (query_block if causal else blocks - 1) - kept  # causal: the earlier blocks; else every other one
    share = sizes * torch.clamp(candidates, max=slots) / candidates.clamp(min=1)  # a query block's choices per block
    if causal:
        choosers = share.flip(0).cumsum(0).flip(0) - share  # block c: from every later query block
    else:
        choosers = share.sum() - share  # block c: from every other query block
    if keep_first:
        choosers[0] = n - sizes[0]  # read by every query outside it, never scored
    return choosers


class OnlineMerge:
    """One softmax over each query's own block and its chosen blocks, merged batch by batch of chunks (without
    autograd): per query row a reference log-sum-exp, the weighted sum of outputs and of weights relative to it;
    the reference is the own block's and is raised (that row's sums rescaled) only where a part would outweigh it
    beyond RESCALE_ABOVE, so no batch's outputs outlive it and a batch touches only the rows it adds to.
    own: ((b h) i e), ((b h) i)."""

    def __init__(self, own_out: Tensor, own_lse: Tensor) -> None:
        x, n, e = own_out.shape
        self.shape = (x, n, e)
        self.top = own_lse.reshape(x * n).clone()  # ((b h i),) the reference, -inf where nothing yet
        self.total = torch.isfinite(self.top).to(self.top.dtype)  # the weights' sum relative to exp(top)
        self.summed = own_out.reshape(x * n, e)  # ((b h i), e) the own part, weight 1 relative to exp(top)

    def add(self, out: Tensor, lse: Tensor, chunks: Chunks) -> None:
        """A batch of chunks: outputs ((t r), e) and log-sum-exps ((t r),); unused slots weigh nothing."""
        lse = lse.masked_fill(~chunks.used, float("-inf"))
        relative = lse - self.top[chunks.rows]  # ((t r),): NaN where both are -inf (an unused slot, a row with nothing)
        over = relative > RESCALE_ABOVE  # a part that would overflow exp: its row's reference rises to its maximum
        if bool(over.any()):
            raised = torch.zeros_like(self.total, dtype=torch.bool).index_fill_(0, chunks.rows[over], True)
            rows = raised.nonzero().squeeze(1)  # those rows alone are rescaled: each row's sums depend on it only
            top = self.top.scatter_reduce(0, chunks.rows, lse, reduce="amax")[rows]
            rescale = torch.exp(self.top[rows] - top)  # 0 where the old reference was -inf
            self.summed.index_copy_(0, rows, self.summed[rows] * rescale[:, None].to(self.summed.dtype))
            self.total.index_copy_(0, rows, self.total[rows] * rescale)
            self.top.index_copy_(0, rows, top)
            relative = lse - self.top[chunks.rows]
        weight = torch.exp(relative).nan_to_num_(nan=0.0)  # ((t r),), at most exp(RESCALE_ABOVE)
        self.summed.index_add_(0, chunks.rows, out.mul_(weight[:, None].to(out.dtype)))
        self.total.index_add_(0, chunks.rows, weight)

    def result(self) -> Tensor:
        """((b h) i e): the merged output; a query with no key gets zeros."""
        total = torch.where(self.total > 0, self.total, torch.ones_like(self.total))
        return self.summed.div_(total[:, None].to(self.summed.dtype)).view(self.shape)


RESCALE_ABOVE = 30.0  # a part's log-sum-exp over its row's reference: exp(30) * (top_k + 2) parts stays finite in
# float32 (and bfloat16, whose range is float32's) with room, and loses no digit: the sums are relative


def merge_chunks(own: tuple[Tensor, Tensor], out: Tensor, lse: Tensor, chunks: Chunks) -> Tensor:
    """One softmax over each query's own block and its chosen blocks: each part weighted by exp(its log-sum-exp),
    summed by query row. own: ((b h) i e), ((b h) i); chunk slots: ((t r) e), ((t r),), unused slots weigh nothing.
    Returns ((b h) i e). The forward calls it under autograd only."""
    own_out, own_lse = own
    x, n, e = own_out.shape
    own_out, own_lse = own_out.reshape(x * n, e), own_lse.reshape(x * n)
    lse = lse.masked_fill(~chunks.used, float("-inf"))
    top = own_lse.detach().scatter_reduce(0, chunks.rows, lse.detach(), reduce="amax")  # ((b h i),)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    own_weight = torch.exp(own_lse - top)  # 0 where the own block has no real key
    weight = torch.exp(lse - top[chunks.rows])  # ((t r),), 0 for unused slots
    total = own_weight.index_add(0, chunks.rows, weight)
    total = torch.where(total > 0, total, torch.ones_like(total))  # a query with no key: zeros
    summed = (own_out * own_weight[:, None].to(own_out.dtype)).index_add(
        0, chunks.rows, out * weight[:, None].to(out.dtype)
    )  # out of place: autograd keeps the parts (without it, `OnlineMerge` merges batch by batch)
    return (summed / total[:, None].to(summed.dtype)).view(x, n, e)
