"""Quest's decode cache (Tang et al., 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference"):
keys and values in pages, each page's key max and min as the selection metadata, and a step that attends to the pages
its query ranks highest. The rule is documented with `attnbench.variants.topk` (the `topk` variant's decode).

b - batch, g - key/value heads, r - query head of a group (a chooser), c - page, j - key in page, s - chosen slot,
t - position or chunk token, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from attnbench.interface import DecodeState, default_scale
from attnbench.kernels import usable
from attnbench.kernels.steps import quest_step
from attnbench.ops import KVCache, softmax_step
from attnbench.variants.block_scores import block_summaries
from attnbench.variants.blocks import block_count, real_key_blocks
from einops import rearrange
from torch import Tensor



def ranked_pages(t: int, page: int, keep_first: bool) -> range:
    """The pages a step at position t ranks: all before its own (the newest), but the first when it is kept."""
    return range(1 if keep_first else 0, t // page)


def page_rows(chosen: Tensor, pages: int) -> Tensor:
    """chosen (b, g, r, s) page indices -> (b g r s) rows of the (b g pages, page d) view `pages_at` reads, once for
    the keys and the values."""
    b, g = chosen.shape[:2]
    first = torch.arange(0, b * g * pages, pages, device=chosen.device).view(b, g, 1, 1)  # each head's first page
    return (first + chosen).flatten()


def pages_at(x: Tensor, rows: Tensor, choosers: int, page: int) -> Tensor:
    """Pages of a paged buffer, each whole: x (b, g, pages page, d) contiguous, rows (b g r s) from `page_rows` for
    r = `choosers` per key/value head -> (b, g r, s page, d). One index_select of rows: a gather over an index
    expanded to every element took ~3x as long (a review's profile of this step)."""
    b, g = x.shape[:2]
    picked = rearrange(x, "b g (c j) d -> (b g c) (j d)", j=page).index_select(0, rows)  # (b g r s, page d)
    return rearrange(picked, "(b g r s) (j d) -> b (g r) (s j) d", b=b, g=g, r=choosers, j=page)


@dataclass
class QuestCache(KVCache):
    """Quest's cache: keys and values in pages of `page` positions (capacity a whole number of pages), per key/value
    head, and each page's elementwise key maximum and minimum side by side, the selection metadata: bounds (b, g,
    pages, 2 d), filled for the pages that hold a position. A step attends to its own page, the first page when
    kept, and the `top_k` others with the highest bound Σ_d max(q_d max_d, q_d min_d) of q · k over a page's keys,
    ranked by each of a key/value head's `choosers` query heads (its group: Quest's rule) or once for the group
    (1: by the mean of its query heads' bounds)."""

    bounds: Tensor
    page: int
    top_k: int
    keep_first: bool
    choosers: int  # who ranks a key/value head's pages: its query heads (the group), or 1 (the group's mean)
    context_pages: int | None = None  # after `close_context`: only these first pages are ranked, the later read whole
    row_top_k: tuple[int, ...] = ()  # rows of several budgets stacked (`stack`): each row's top_k, top_k the largest

    @classmethod
    def of_prompt(
        cls, k: Tensor, v: Tensor, *, page: int, room: int, top_k: int, keep_first: bool, choosers: int
    ) -> "QuestCache":
        """The cache of the prompt k (b, g, n, d), v (b, g, n, e), with room for `room` more positions."""
        b, g, n, d = k.shape
        pages = block_count(n + room, page)
        cache = KVCache.of(k, v, pages * page - n)
        bounds = k.new_zeros(b, g, pages, 2 * d)
        filled = block_count(n, page)
        real = real_key_blocks(b, n, page, None, k.device)  # (b, c, j): the last page's rows past n are no keys
        bounds[..., :filled, :] = torch.cat(block_summaries(k, real, page, "minmax"), dim=-1)
        return cls(cache.keys, cache.values, cache.length, bounds, page, top_k, keep_first, choosers)

    @property
    def high(self) -> Tensor:
        """(b, g, pages, d): each page's elementwise key maximum (a view)."""
        return self.bounds[..., : self.keys.shape[-1]]

    @property
    def low(self) -> Tensor:
        """(b, g, pages, d): each page's elementwise key minimum (a view)."""
        return self.bounds[..., self.keys.shape[-1] :]

    def grow(self, positions: int) -> None:
        """Room for `positions` more: full buffers double (whole pages), their metadata too."""
        while self.length + positions > self.keys.shape[-2]:
            self.keys, self.values, self.bounds = (
                torch.cat([x, torch.zeros_like(x)], dim=-2) for x in (self.keys, self.values, self.bounds)
            )

    def append(self, k: Tensor, v: Tensor) -> "QuestCache":
        """Add positions k (b, g, t, d), v (b, g, t, e) and fold their keys into their pages' max and min."""
        self.grow(k.shape[-2])
        t = self.length
        super().append(k, v)
        if k.shape[-2] > 1:  # the touched pages' bounds again, from their filled positions
            first, stop = t // self.page, block_count(self.length, self.page)
            held = self.keys[..., first * self.page : stop * self.page, :]
            real = torch.arange(first * self.page, stop * self.page, device=k.device) < self.length
            real = rearrange(real, "(c j) -> c j 1", j=self.page)
            paged = rearrange(held, "b g (c j) d -> b g c j d", j=self.page)
            self.high[..., first:stop, :] = paged.masked_fill(~real, float("-inf")).amax(dim=-2)
            self.low[..., first:stop, :] = paged.masked_fill(~real, float("inf")).amin(dim=-2)
            return self
        p, key = t // self.page, k[..., 0, :]
        high, low = self.high[..., p, :], self.low[..., p, :]  # views: updated in place
        if t % self.page == 0:  # a new page
            high.copy_(key), low.copy_(key)
        else:
            torch.maximum(high, key, out=high), torch.minimum(low, key, out=low)
        return self

    def kept(self) -> None:
        """Quest keeps every position and selects what it reads: not a set of kept positions."""
        return None

    @property
    def held_bytes(self) -> int:
        """The filled positions' keys and values, and the metadata of the pages holding them."""
        pages = block_count(self.length, self.page)
        return KVCache.held_bytes.fget(self) + self.bounds[..., :pages, :].numel() * self.bounds.element_size()  # type: ignore[attr-defined]

    def close_context(self) -> None:
        """kvpress's budget rule: the pages wholly inside the context are ranked from now on, the context's last
        (partial) page and every later one read whole (the question and the answer are appended, as for every
        method)."""
        self.context_pages = self.length // self.page

    def ranked(self, t: int) -> range:
        """The pages the step at position t ranks (see `ranked_pages`), the context's alone after `close_context`."""
        pages = ranked_pages(t, self.page, self.keep_first)
        return pages if self.context_pages is None else range(pages.start, max(pages.start, min(pages.stop, self.context_pages)))

    def reads_every_page(self, t: int) -> bool:
        """The step at position t ranks no more than top_k pages (every row's): it reads them all (exact attention)."""
        return len(self.ranked(t)) <= min(self.row_top_k or (self.top_k,))

    def budgets(self) -> tuple[int, ...]:
        """Each row's top_k."""
        return self.row_top_k or (self.top_k,) * self.keys.shape[0]

    def stack_key(self) -> tuple:
        """Caches of one prompt and selection rule stack, whatever their budgets (top_k)."""
        shapes = tuple(x.shape[1:] for x in (self.keys, self.values, self.bounds))
        return (QuestCache, shapes, self.keys.dtype, self.length, self.page, self.keep_first, self.choosers,
                self.context_pages)  # fmt: skip

    @classmethod
    def stack(cls, states: list[DecodeState]) -> "QuestCache":
        """One cache of the caches' rows (equal `stack_key`s), each row keeping its own top_k (`row_top_k`)."""
        caches = [state for state in states if isinstance(state, QuestCache)]
        assert len(caches) == len(states) and len({c.stack_key() for c in caches}) == 1, "caches that do not stack"
        budgets = tuple(k for cache in caches for k in cache.budgets())
        first = caches[0]
        keys, values, bounds = (torch.cat([getattr(c, name) for c in caches]) for name in ("keys", "values", "bounds"))
        return cls(keys, values, first.length, bounds, first.page, max(budgets), first.keep_first, first.choosers,
                   first.context_pages, budgets if len(set(budgets)) > 1 else ())  # fmt: skip

    def select_rows(self, rows: list[int]) -> "QuestCache":
        index = torch.tensor(rows, device=self.keys.device)
        budgets = tuple(self.budgets()[row] for row in rows)
        keys, values, bounds = (x.index_select(0, index) for x in (self.keys, self.values, self.bounds))
        return QuestCache(keys, values, self.length, bounds, self.page, max(budgets), self.keep_first, self.choosers,
                          self.context_pages, budgets if len(set(budgets)) > 1 else ())  # fmt: skip

    def whole_pages(self, t: int) -> int:
        """Pages the step at position t reads whole besides the ranked ones and its own: after `close_context`, those
        from the context's last on."""
        return 0 if self.context_pages is None else max(0, t // self.page - max(self.context_pages, self.ranked(t).start))

    def bound_scores(self, q: Tensor, pages: range) -> Tensor:
        """Quest's bound of q · k over each page's keys, Σ_d max(q_d hi_d, q_d lo_d): q (b, h, t, d) -> (b, g, r, t,
        pages), r = `choosers` (the group's mean for 1), in float32 at least (as the forward ranks)."""
        work = torch.promote_types(q.dtype, torch.float32)
        grouped = rearrange(q.to(work), "b (g r) t d -> b g (r t) d", g=self.keys.shape[1])
        # Σ_d max(q_d hi_d, q_d lo_d) = q⁺ · hi + q⁻ · lo (hi >= lo): one product against [hi | lo]
        signed = torch.cat([grouped.clamp(min=0), grouped.clamp(max=0)], dim=-1)  # (b, g, r t, 2 d)
        metadata = self.bounds[..., pages.start : pages.stop, :].to(work)  # (b, g, pages, 2 d): read once a group
        scores = rearrange(torch.matmul(signed, metadata.transpose(-1, -2)), "b g (r t) c -> b g r t c", t=q.shape[-2])
        if self.choosers == 1 and scores.shape[2] > 1:
            scores = scores.mean(dim=2, keepdim=True)  # the group's mean: (b, g, 1, t, pages)
        return scores

    def select(self, q: Tensor) -> tuple[Tensor, Tensor | None]:
        """The pages the step at t = length - 1 (its token appended) reads when it ranks more than top_k: q (b, h,
        1, d) -> page indices (b, g, r, s), r = `choosers` per key/value head: the top_k ranked ones, the first page
        when kept, the own page last; and, for rows of several budgets, which of the ranked slots a row reads (b, top_k)
        (a row of a smaller budget reads its best ones; None: every slot)."""
        t, page = self.length - 1, self.page
        ranked = self.ranked(t)
        scores = self.bound_scores(q, ranked)[..., 0, :]  # (b, g, r, ranked)
        slots = min(self.top_k, len(ranked))
        top = scores.topk(slots, dim=-1, sorted=bool(self.row_top_k)).indices + ranked.start  # (b, g, r, slots)
        reads = None
        if self.row_top_k:  # the best first: a row reads its own top_k of them
            reads = torch.arange(slots, device=q.device) < torch.tensor(self.row_top_k, device=q.device)[:, None]
        whole = torch.arange(t // page - self.whole_pages(t), t // page + 1, device=q.device)  # ..., the own page last
        edges = [top.new_full((*top.shape[:-1], 1), 0), whole.expand(*top.shape[:-1], -1)]
        return torch.cat([top, edges[0], edges[1]] if ranked.start else [top, edges[1]], dim=-1), reads

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token (position t = length) joins the cache and attends, by exact softmax, to the pages chosen
        for it (all of them when no more than top_k are ranked): q (b, h, 1, d), k, v (b, g, 1, d|e) -> (b, h, 1, e).
        Fused (float32 on the CPU): one call of the C kernel `quest_step` appends, ranks and reads the pages where
        they lie. Eager (`eager_steps`, or the kernels unavailable): `select`, then `gathered_step`."""
        if usable(q, k, v, self.keys, self.values, self.bounds):
            self.grow(1)
            t, page = self.length, self.page
            ranked = self.ranked(t)
            budget = torch.tensor(self.budgets(), dtype=torch.int64)
            out = quest_step(q, k, v, self.keys, self.values, self.bounds, budget, t=t, page=page,
                             choosers=self.choosers, ranked=ranked, slots=min(self.top_k, len(ranked)),
                             keep_first=self.keep_first, whole_from=t // page - self.whole_pages(t),
                             scale=default_scale(q.shape[-1]))  # fmt: skip
            self.length += 1
            return out
        self.append(k, v)
        if self.reads_every_page(self.length - 1):
            return softmax_step(q, self.k, self.v)
        return self.gathered_step(q, *self.select(q))

    def gathered_step(self, q: Tensor, chosen: Tensor, reads: Tensor | None) -> Tensor:
        """The eager form of a step's read: the chosen pages copied together (one index_select each for keys and
        values, (b, g r, s page, d)), then `softmax_step` (two matrix products: SDPA's one-query CPU path is ~2x
        slower for the same keys)."""
        t, page = self.length - 1, self.page
        rows = page_rows(chosen, self.keys.shape[-2] // page)
        held = (chosen.shape[-1] - 1) * page + t % page + 1  # the own page's positions after t are not keys yet
        keys, values = (pages_at(x, rows, chosen.shape[2], page)[..., :held, :] for x in (self.keys, self.values))
        visible = None
        if reads is not None:  # rows of smaller budgets leave their last ranked slots out (b, 1, held)
            slots = torch.cat([reads, reads.new_ones(reads.shape[0], chosen.shape[-1] - reads.shape[-1])], dim=-1)
            visible = slots.repeat_interleave(page, dim=-1)[:, None, :held]
        return softmax_step(q, keys, values, visible)

    def steps(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """t new tokens at once, each reading what its own `step` would (its pages chosen by its query, among the
        pages ranked at its position; the chunk's earlier tokens seen): q (b, h, t, d), k, v (b, g, t, d|e) -> (b, h,
        t, e). Every filled position's score is computed and the unread ones masked: the form of a chunk (the question
        after a compressed context, a teacher-forced continuation), whose reads are not what a method costs per token;
        `step` reads its pages alone."""
        start, t, page = self.length, q.shape[-2], self.page
        self.append(k, v)
        n = self.length
        at = torch.arange(start, n, device=q.device)  # (t,) each token's position
        pages = torch.arange(block_count(n, page), device=q.device)
        own = at // page
        first = int(self.keep_first)
        last = own if self.context_pages is None else own.clamp(max=max(first, self.context_pages))
        ranked = (pages >= first) & (pages < last[:, None])  # (t, pages): the pages each token ranks
        scores = self.bound_scores(q, range(0, len(pages))).masked_fill(~ranked, float("-inf"))  # (b, g, r, t, pages)
        slots = min(self.top_k, len(pages))
        best, top = scores.topk(slots, dim=-1)  # the best first, then a row's budget takes its first top_k
        budget = torch.tensor(self.budgets(), device=q.device).view(-1, 1, 1, 1, 1)
        chosen = (torch.arange(slots, device=q.device) < budget) & (best > float("-inf"))
        reads = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, chosen)
        always = pages == own[:, None]  # (t, pages): the own page, the first when kept, the context's end on
        if self.keep_first:
            always = always | (pages == 0)
        if self.context_pages is not None:
            always = always | ((pages >= self.context_pages) & (pages <= own[:, None]))
        reads = (reads | always).repeat_interleave(page, dim=-1)[..., :n]  # (b, g, r, t, n)
        reads = reads & (torch.arange(n, device=q.device) <= at[:, None])  # causal inside the chunk
        grouped = rearrange(q, "b (g r) t d -> b g (r t) d", g=self.keys.shape[1])  # a group reads its keys once
        logits = torch.matmul(grouped, self.k.transpose(-1, -2)).mul_(default_scale(q.shape[-1]))  # (b, g, r t, n)
        logits = rearrange(logits, "b g (r t) n -> b g r t n", t=t).masked_fill_(~reads, float("-inf"))
        weights = rearrange(torch.softmax(logits, dim=-1), "b g r t n -> b g (r t) n")
        return rearrange(torch.matmul(weights, self.v), "b g (r t) e -> b (g r) t e", t=t)

    @property
    def read_bytes(self) -> int:
        """What the next step (at t = length) reads of the cache: the metadata of the pages it ranks (once per
        key/value head), and the keys and values of the pages it keeps, its own page's held part, counted per
        chooser: per query head when each ranks (what its gather reads, and Quest's per-head kernel: the group's
        heads may share pages, so a kernel reading each distinct page of a key/value head once reads between 1 and
        `choosers` times less), per key/value head for the group's mean; every held position, once per key/value
        head, when it ranks no more than top_k."""
        if self.row_top_k:  # each row as its own cache would read
            return sum(self.select_rows([row]).read_bytes for row in range(self.keys.shape[0]))
        t, page = self.length, self.page
        b, g = self.keys.shape[:2]
        row = self.keys.shape[-1] * self.keys.element_size() + self.values.shape[-1] * self.values.element_size()
        if self.reads_every_page(t):
            return b * g * t * row
        ranked = len(self.ranked(t))
        metadata = ranked * self.bounds.shape[-1] * self.bounds.element_size()
        rows = (self.top_k + int(self.keep_first) + self.whole_pages(t)) * page + t % page
        return b * g * (self.choosers * rows * row + metadata)
