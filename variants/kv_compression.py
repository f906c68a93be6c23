"""KV-cache compression: methods that keep part of the keys and values for generation, split as kvpress splits
them: a `score` saying which positions matter, and one shared `compress` keeping the top ones per head.

- `h2o` (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
  Models"): a cache of `budget` positions per head, the `recent` last ones and the heavy hitters, the positions
  whose keys received the most attention mass so far (the sum over queries of the softmax weights a key got: over
  the prompt, then from every step). After the prompt the top budget - recent older positions by mass are kept;
  each step attends to the cache and itself, adds its weights to the masses, and the position leaving the recent
  ring takes the heavy slot of least mass if it has more (else it is dropped): H2O's greedy eviction of the
  lowest-scored non-recent token, in buffers of fixed size.
- the shared part of every press: `KVCompression` (decode only), `compress` (the top scores per head), and SnapKV's
  window votes and pooling (`window_votes`, `pooled`), which `attnbench.variants.press_attention` scores with.

H2O and every press compute exact causal attention over the prompt (they compress after it), keep everything when the prompt fits
the budget (then they are exact decoding; H2O until the budget fills), and change generation only: a full-sequence
call is refused (`--mode decode`). Positions: q and k arrive post-rotary, so a kept key keeps the position it was
encoded at (StreamingLLM re-assigns positions inside its cache, which needs the rotary step, outside attention
here; neither H2O nor SnapKV does).

b - batch, h - heads, i - query position, j - key position, d - head dim, e - value dim, s - kept slot
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    VariantError,
    expand_kv_heads,
    query_group,
    softmax_attention_flops,
)
from attnbench.kernels import usable
from attnbench.kernels.steps import h2o_step
from attnbench.ops import (
    SCORE_CHUNK,
    attention_mass,
    causal_allows,
    default_scale,
    prompt_mass,
)
from einops import einsum, rearrange
from torch import Tensor

BUDGET = Hyperparameter(512, "positions kept per head (the compressed cache's size)", minimum=1)
POOLS = ("max", "avg")
SELECT_PER = Hyperparameter(
    "kv-head", "grouped-query attention: keep positions per key/value head, scored by the mean over its query heads "
    "(kvpress's rule), or per query head (query-head: k and v repeated for every query head, a cache h / g times "
    "larger, counted as such)", kind=str, choices=("kv-head", "query-head"),
)  # fmt: skip


def heads_to_keep(q: Tensor, k: Tensor, v: Tensor, select_per: str) -> tuple[Tensor, Tensor, int]:
    """The k, v a method keeps positions of, and how many query heads share each: as given (per key/value head) or
    repeated for every query head (`select_per="query-head"`, group 1)."""
    group = query_group(q, k)
    if select_per == "query-head":
        return expand_kv_heads(k, group), expand_kv_heads(v, group), 1
    return k, v, group


# ---- kvpress's split: a score per position, one compress for every method --------------------------------------


def compress(k: Tensor, v: Tensor, scores: Tensor, keep: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per head, the `keep` positions with the highest scores: k (b, h, n, d), v (b, h, n, e), scores (b, h, n) ->
    their keys (b, h, s, d), values (b, h, s, e) and positions (b, h, s), in the order of the sequence."""
    positions = scores.topk(keep, dim=-1).indices.sort(dim=-1).values
    return gather_positions(k, positions), gather_positions(v, positions), positions


def gather_positions(x: Tensor, positions: Tensor) -> Tensor:
    """x (b, h, n, d) at positions (b, h, s) -> (b, h, s, d)."""
    return x.gather(2, positions[..., None].expand(*positions.shape, x.shape[-1]))


def window_votes(q: Tensor, k: Tensor, window: int) -> Tensor:
    """SnapKV's observation: the last `window` queries' causal softmax weights (over every key) on the prefix keys,
    summed over the window's queries, per query head: q (b, h, n, d), k (b, g, n, d) -> (b, h, n - window), in
    float32 at least. (kvpress averages over the window: the same ranking, pooling being linear in the votes.)"""
    k = expand_kv_heads(k, query_group(q, k))
    n = k.shape[-2]
    work = torch.promote_types(q.dtype, torch.float32)
    scores = einsum(q[:, :, n - window :].to(work), k.to(work), "b h i d, b h j d -> b h i j")
    scores = scores * default_scale(q.shape[-1])
    i, j = torch.arange(n - window, n, device=q.device)[:, None], torch.arange(n, device=q.device)[None, :]
    weights = scores.masked_fill_(~causal_allows(i, j), float("-inf")).softmax(-1)  # (b, h, w, n)
    return weights[..., : n - window].sum(dim=-2)


def pooled(votes: Tensor, kernel: int, pool: str) -> Tensor:
    """Votes (b, h, n) smoothed along the keys, stride 1, same length: the max or the average of `kernel`
    neighbours (centred; the average counts the zero padding at the ends, as SnapKV's avg_pool1d does)."""
    pooling = F.max_pool1d if pool == "max" else F.avg_pool1d
    out = pooling(rearrange(votes, "b h n -> (b h) 1 n"), kernel, stride=1, padding=kernel // 2)
    return rearrange(out[..., : votes.shape[-1]], "(b h) 1 n -> b h n", b=votes.shape[0])


# ---- H2O's cache ---------------------------------------------------------------------------------------------


@dataclass
class HeavyHitterCache(DecodeState):
    """H2O's cache in one buffer of fixed size: `heavy` slots of heavy hitters, then a ring of `recent` + 1 slots
    (position p in slot heavy + p % (recent + 1)): keys (b, h, H + R + 1, d), values (b, h, H + R + 1, e), and the
    attention mass each slot's key received so far, mass (b, h, H + R + 1), float32 at least (-inf: an empty slot).

    A step writes the new token into its ring slot (which held position t - recent - 1, already admitted or dropped
    a step ago), attends to the whole buffer (the heavy hitters, the last `recent` positions and itself) in one
    softmax, adds the weights to the masses, and position t - recent, leaving the window, competes for a heavy slot:
    a handful of operations a step, where three parts and their masks took ~220."""

    keys: Tensor
    values: Tensor
    mass: Tensor
    heavy: int  # heavy-hitter slots, before the ring
    length: int  # positions seen: the next token's position
    full: bool = False  # every slot filled: no mask needed any more

    @classmethod
    def of_prompt(cls, k: Tensor, v: Tensor, mass: Tensor, *, budget: int, recent: int) -> "HeavyHitterCache":
        """After the prompt k (b, h, n, d), v (b, h, n, e) with its masses (b, h, n): its last `recent` positions in
        the ring, and of the older ones the budget - recent with the most mass (all when they fit)."""
        (b, h, n, d), e, heavy = k.shape, v.shape[-1], budget - recent
        slots = heavy + recent + 1
        keys, values = k.new_zeros(b, h, slots, d), v.new_zeros(b, h, slots, e)
        masses = mass.new_full((b, h, slots), float("-inf"))
        last = torch.arange(max(0, n - recent), n, device=k.device)
        ring = heavy + last % (recent + 1)
        keys[..., ring, :], values[..., ring, :], masses[..., ring] = k[..., last, :], v[..., last, :], mass[..., last]
        older = max(0, n - recent)  # the positions before the ring compete for the heavy slots
        kept = min(older, heavy)
        if kept:
            scores = mass[..., :older]
            kept_k, kept_v, positions = compress(k[..., :older, :], v[..., :older, :], scores, kept)
            keys[..., :kept, :], values[..., :kept, :] = kept_k, kept_v
            masses[..., :kept] = scores.gather(-1, positions)
        return cls(keys, values, masses, heavy, n)

    evicts = True  # a step drops the lightest position when the window moves on

    def kept(self) -> tuple[Tensor, Tensor]:
        """The filled slots' keys and values (the heavy hitters and the recent positions; the ring's slot for the
        next token left out)."""
        filled = (self.mass[0, 0] != float("-inf")).nonzero()[:, 0]  # every head fills the same slots
        return self.keys[..., filled, :], self.values[..., filled, :]

    @property
    def held_bytes(self) -> int:
        """The filled slots' keys, values and masses."""
        filled = int((self.mass[0, 0] != float("-inf")).sum())
        b, h = self.keys.shape[:2]
        row = sum(x.shape[-1] * x.element_size() for x in (self.keys, self.values)) + self.mass.element_size()
        return b * h * filled * row

    @property
    def heavy_mass(self) -> Tensor:
        """The heavy slots' masses (b, h, H)."""
        return self.mass[..., : self.heavy]

    def step(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The new token (position t = length) attends to the cache and itself, q (b, h, 1, d), k, v (b, g, 1, d|e) ->
        (b, h, 1, e); every key's mass grows by its weight; position t - recent then competes for a heavy slot. Fused
        (float32 on the CPU): one call of the C kernel `h2o_step`; eager (`eager_steps`): the operations below."""
        t, heavy, ring = self.length, self.heavy, self.keys.shape[-2] - self.heavy
        slot = heavy + t % ring
        leaving = t - (ring - 1)  # position t - recent: out of the window from the next step on
        if usable(q, k, v, self.keys, self.values, self.mass):  # one call: write, attend, weigh, admit
            visible = None
            if not self.full:
                visible = self.mass != float("-inf")
                visible[..., slot] = True
                self.full = bool(visible.all())
            out = h2o_step(q, k, v, self.keys, self.values, self.mass, None if self.full else visible, slot=slot,
                           source=heavy + leaving % ring if heavy and leaving >= 0 else -1, heavy=heavy,
                           scale=default_scale(q.shape[-1]))  # fmt: skip
            self.length += 1
            return out
        self.keys[..., slot : slot + 1, :], self.values[..., slot : slot + 1, :] = k, v
        self.mass[..., slot] = 0.0
        grouped = rearrange(q, "b (g r) 1 d -> b g r d", g=self.keys.shape[1])
        scores = torch.matmul(grouped, self.keys.transpose(-1, -2)).mul_(default_scale(q.shape[-1]))  # (b, g, r, s)
        if not self.full:
            empty = self.mass == float("-inf")  # (b, g, s)
            self.full = not bool(empty.any())
            scores.masked_fill_(empty[..., None, :], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights, self.values)  # (b, g, r, e)
        self.mass += weights.mean(dim=-2).to(self.mass.dtype)  # the group's query heads averaged; -inf stays -inf
        if heavy and leaving >= 0:
            self.admit(heavy + leaving % ring)
        self.length += 1
        return rearrange(out, "b g r e -> b (g r) 1 e")

    def admit(self, source: int) -> None:
        """The position in ring slot `source` takes the heavy slot of least mass in the heads where it has more;
        elsewhere it is dropped (H2O evicts the lowest-scored non-recent token)."""
        heavy_mass = self.mass[..., : self.heavy]
        weakest = heavy_mass.argmin(dim=-1, keepdim=True)  # (b, h, 1)
        candidate = self.mass[..., source : source + 1]  # (b, h, 1)
        wins = candidate > heavy_mass.gather(-1, weakest)  # (b, h, 1)
        target = torch.where(wins, weakest, torch.full_like(weakest, source))  # a loser is written onto itself
        for buffer in (self.keys, self.values):
            index = target[..., None].expand(*target.shape, buffer.shape[-1])  # (b, h, 1, d|e)
            buffer.scatter_(2, index, buffer[..., source : source + 1, :].clone())
        self.mass.scatter_(-1, target, candidate.clone())

    @property
    def read_bytes(self) -> int:
        """What the next step reads: the filled slots' keys, values and masses (it writes the masses back)."""
        t, ring, heavy = self.length, self.keys.shape[-2] - self.heavy, self.heavy
        recent = ring - 1
        b, h = self.keys.shape[:2]
        slots = min(t, recent) + min(max(0, t - recent), heavy)
        row = sum(x.shape[-1] * x.element_size() for x in (self.keys, self.values))
        per_slot = row + self.mass.element_size()
        return b * h * slots * per_slot


# ---- the methods ---------------------------------------------------------------------------------------------


class KVCompression(AttentionVariant):
    """A KV-cache method: exact causal attention over the prompt, then generation against the part of the cache it
    keeps. Decode only: a full-sequence call is refused."""

    family = "kv-cache"
    exact = False
    decode_equals_forward = False  # what is kept depends on the prompt's end, not on the forward's pattern
    supports = Capabilities(
        key_padding_mask=False,
        cross_attention=False,
        backward=False,
        grouped_kv=True,
        notes={
            "key_padding_mask": "generation: one sequence per batch row",
            "cross_attention": "generation attends to its own sequence",
            "backward": "a KV-cache method changes generation only",
        },
    )

    def unsupported_reason(self, **options: Any) -> str | None:
        if not options.get("decode"):
            return f"{self.name} is a KV-cache method: it changes generation only (--mode decode)"
        return super().unsupported_reason(**options)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        raise UnsupportedOptionError(f"{self.name} is a KV-cache method: it changes generation only (--mode decode)")

    def prompt_cost(self, shape: Shape, *, attention_pairs: float, scored_pairs: float, held_scores: float) -> Cost:
        """The prefill's cost, per head: the prompt's attention over `attention_pairs` scores, and `scored_pairs`
        more whose weights the method's score takes besides, `held_scores` of them held at once (in float32)."""
        s, heads = shape, shape.batch * shape.heads
        matmul, other = softmax_attention_flops(heads * attention_pairs, s)
        score_matmul = 2 * heads * scored_pairs * s.head_dim
        io = heads * s.n_k * (2 * s.head_dim + 2 * s.value_dim)  # q, k, v in, the outputs out
        output = heads * s.n_k * s.value_dim * s.dtype_bytes
        return Cost(
            flops=matmul + other + score_matmul + 5 * heads * scored_pairs,
            bytes_moved=io * s.dtype_bytes,
            working_bytes=output + 2 * heads * held_scores * max(4, s.dtype_bytes),
            matmul_flops=matmul + score_matmul,
        )


class HeavyHitterOracle(KVCompression):
    """H2O: the `recent` last positions and the heavy hitters by accumulated attention mass, `budget` per head."""

    name = "h2o"
    paper = "H2O (Zhang et al. 2023)"  # for `attnbench list`; kvpress's prompt-only form: observed-attention
    scores_prompt_mass = True  # a model's exact prefill hands it the masses from its own pass
    hyperparameters = {
        "budget": BUDGET,
        "select_per": SELECT_PER,
        "recent": Hyperparameter(
            None, "of the budget, the last positions always kept (default budget // 2: the paper's equal split of "
            "heavy hitters and recent tokens)", minimum=0, optional=True,
        ),
    }  # fmt: skip

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if self.recent is not None and self.recent > self.budget:
            raise VariantError(
                f"Invalid hyperparameters for variant 'h2o': recent: {self.recent} exceeds the budget {self.budget} "
                "(the recent positions are part of it)"
            )

    @property
    def recent_kept(self) -> int:
        """The recent positions always kept: `recent`, else half the budget."""
        return self.budget // 2 if self.recent is None else self.recent

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt, whose weights give each key its mass; then the cache (`room` is
        not needed: its size is fixed)."""
        k, v, _ = heads_to_keep(q, k, v, self.select_per)
        out, mass = attention_mass(q, k, v)
        assert out is not None
        return out, HeavyHitterCache.of_prompt(k, v, mass, budget=self.budget, recent=self.recent_kept)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        k, v, _ = heads_to_keep(q, k, v, self.select_per)
        return HeavyHitterCache.of_prompt(k, v, prompt_mass(q, k), budget=self.budget, recent=self.recent_kept)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if not isinstance(state, HeavyHitterCache):
            raise UnsupportedOptionError(f"h2o cannot step from a {type(state).__name__}")
        k, v, _ = heads_to_keep(q, k, v, self.select_per)
        return state.step(q, k, v), state

    def cost(self, shape: Shape) -> Cost:
        n, chunk = shape.n_k, SCORE_CHUNK
        computed = sum(min(chunk, n - start) * min(n, start + chunk) for start in range(0, n, chunk))  # rows x keys
        return self.prompt_cost(shape, attention_pairs=computed, scored_pairs=0, held_scores=min(chunk, n) * n)
