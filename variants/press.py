"""kvpress's split of a KV-cache method: a **scorer** says how much each cached position of the prompt matters, and one
shared **compress** keeps the top ones per key/value head (kvpress/presses/scorer_press.py: `score()` beside the one
`compress()`). A press here is a `ScoredPress` subclass that writes `score` — a dozen lines — and takes, for free, the
wrappers kvpress writes as presses around a scorer, here its hyperparameters:

- `heads="adaptive"`: AdaKV's head-wise budgets (a layer's budget shared by its heads through one top-k over all of
  them, each head's safeguard first) — kept in ragged per-head caches that hold only what they keep
  (`attnbench.variants.headwise`), where kvpress masks the evicted keys and holds the whole cache;
- `layers="pyramid"`: PyramidKV's layer budgets (more in the first layers, fewer in the last: `press_wrappers`);
- `chunk=c`: ChunkKV (the scores summed over chunks of c positions, whole chunks kept: `press_wrappers`);
- `critical=True`: CriticalKV (a first stage by the score, then the output projection's share ||W_o v||:
  `press_wrappers`).

Every press compresses once, when the prompt ends (exact causal attention over it), and then appends: its cache is a
`KVCache` of the positions it kept (or a ragged one), read whole by each step. Under grouped-query attention it keeps
positions per key/value head (`select_per="kv-head"`, kvpress's rule) or per query head.

A press that needs the model around the layer (the rotary embedding, the output projection, an extra pass) reads it
from the `PromptContext` given by `for_prompt`; without one (a per-call decode run on synthetic inputs) it falls back
where its paper allows and says so, or is refused (`needs_model`).

b - batch, h - query heads, g - key/value heads, n - prompt positions, d - head dim, e - value dim, s - kept
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch.nn.functional as F
from attnbench.interface import (
    Cost,
    DecodeState,
    Hyperparameter,
    PromptContext,
    Shape,
    UnsupportedOptionError,
    VariantError,
)
from attnbench.ops import KVCache
from torch import Tensor

from attnbench.variants.kv_compression import BUDGET, SELECT_PER, KVCompression, compress, heads_to_keep

WRAPPERS: dict[str, Hyperparameter] = {  # kvpress's wrapper presses, as hyperparameters of every scored press
    "heads": Hyperparameter(
        "uniform", "the layer's budget over its heads: uniform (every head keeps `budget`) or adaptive (AdaKV: one "
        "top-k over the scores of all the layer's heads, each head's safeguard share first; ragged caches that hold "
        "only what each head keeps)", kind=str, choices=("uniform", "adaptive"),
    ),
    "safeguard": Hyperparameter(0.2, "adaptive heads: the share of the uniform budget every head keeps at least "
                                "(AdaKV's alpha_safeguard, 0.2)", kind=float, minimum=0.0),
    "layers": Hyperparameter(
        "uniform", "the budget over the model's layers: uniform, or pyramid (PyramidKV: more in the first layers, "
        "fewer in the last, the same total)", kind=str, choices=("uniform", "pyramid"),
    ),
    "chunk": Hyperparameter(1, "ChunkKV: positions kept in whole chunks of this many, by their summed scores "
                            "(1: off; ChunkKV's and kvpress's chunk_length: 20)", minimum=1),
    "critical": Hyperparameter(False, "CriticalKV: keep twice the budget by the score, then the budget by the score "
                               "times ||W_o v|| (the value's share of the layer's output)", kind=bool),
}  # fmt: skip


class ScoredPress(KVCompression):
    """A KV-cache method that scores the prompt's positions and keeps the top `budget` per head (kvpress's
    ScorerPress): subclasses set `name`, `paper`, `press` and write `score`."""

    paper: ClassVar[str] = ""  # the paper, for `attnbench list`
    press: ClassVar[str] = ""  # kvpress's class of the same rule ("" when kvpress has none)
    uses_queries: ClassVar[bool] = False  # the score reads the prompt's queries (attention-based scorers)
    budget_knob = True  # a generation grid's share sets `budget` (at least `smallest_budget`, 1 unless overridden)
    hyperparameters = {"budget": BUDGET, "select_per": SELECT_PER, **WRAPPERS}
    context: PromptContext | None = None

    # ---- what a subclass writes ----------------------------------------------------------------------------------

    def score(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """(b, g, n): how much each prompt position matters to key/value head g (higher: kept first), from the prompt's
        post-rotary q (b, h, n, d), k (b, g, n, d), v (b, g, n, e) (g = h when kept per query head)."""
        raise NotImplementedError

    # ---- the shared part -------------------------------------------------------------------------------------------

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        super().__init__(seed, **hyperparams)
        if not 0 <= self.safeguard <= 1:
            raise VariantError(f"Invalid hyperparameters for variant '{self.name}': safeguard: {self.safeguard} must lie "
                               "in [0, 1] (the share of the uniform budget every head keeps at least)")

    def for_prompt(self, context: PromptContext) -> "ScoredPress":
        bound = copy.copy(self)
        bound.context = context
        return bound

    def unsupported_reason(self, **options: Any) -> str | None:
        if options.get("decode") and not options.get("in_model"):
            needs = [self.needs_model] if self.needs_model else []
            needs += ["the layer's output projection W_o, for critical=True (CriticalKV)"] if self.critical else []
            needs += ["the model's layers, for layers=pyramid (PyramidKV)"] if self.layers == "pyramid" else []
            if needs:
                return f"{self.label()} needs the model around each layer ({'; '.join(needs)}): attnbench generate only"
        return super().unsupported_reason(**options)

    def layer_budget(self, n: int) -> int:
        """Positions per head this layer keeps of a prompt of n: `budget`, or its PyramidKV share."""
        if self.layers == "pyramid":
            from attnbench.variants.press_wrappers import pyramid_budget

            context = self.context or PromptContext()
            return pyramid_budget(self.budget, n, context.layer, context.layers, self.smallest_budget(self.hparams))
        return self.budget

    def kept_scores(self, q: Tensor, k: Tensor, v: Tensor, budget: int) -> Tensor:
        """The scores compress ranks by: the press's own, through the wrappers set (CriticalKV, ChunkKV)."""
        scores = self.score(q, k, v)
        if self.critical:
            from attnbench.variants.press_wrappers import critical_scores

            scores = critical_scores(scores, v, budget, self.context, self.name, adaptive=self.heads == "adaptive",
                                     safeguard=self.safeguard)
        if self.chunk > 1:
            from attnbench.variants.press_wrappers import chunk_scores

            scores = chunk_scores(scores, self.chunk)
        return scores

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """Exact causal attention over the prompt, then the cache of what the press keeps (all when the prompt fits
        its budget), with room for `room` steps."""
        kept_k, kept_v, group = heads_to_keep(q, k, v, self.select_per)
        out = F.scaled_dot_product_attention(q, kept_k, kept_v, is_causal=True, enable_gqa=group > 1)
        return out, self.prefill_state(q, k, v, room=room)

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        k, v, _ = heads_to_keep(q, k, v, self.select_per)
        n = k.shape[-2]
        budget = self.layer_budget(n)
        if n <= budget:
            return KVCache.of(k, v, room)
        scores = self.kept_scores(q, k, v, budget)  # (b, g, n)
        if self.heads == "adaptive":
            from attnbench.variants.headwise import RaggedCache, adaptive_lengths

            return RaggedCache.of_scores(k, v, scores, adaptive_lengths(scores, budget, self.safeguard), room)
        kept_k, kept_v, _ = compress(k, v, scores, budget)
        return KVCache.of(kept_k, kept_v, room)

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        k, v, _ = heads_to_keep(q, k, v, self.select_per)
        if isinstance(state, KVCache):
            return state.step(q, k, v), state
        if hasattr(state, "attend"):  # a ragged (head-wise) cache
            return state.attend(q, k, v), state  # type: ignore[attr-defined]
        raise UnsupportedOptionError(f"{self.name} cannot step from a {type(state).__name__}")

    def steps(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        if hasattr(state, "attend"):  # a ragged cache takes a chunk at once
            k, v, _ = heads_to_keep(q, k, v, self.select_per)
            return state.attend(q, k, v), state  # type: ignore[attr-defined]
        return super().steps(state, q, k, v)

    def cost(self, shape: Shape) -> Cost:
        n = shape.n_k
        causal = n * (n + 1) / 2
        scored = n * n if self.uses_queries else 0
        return self.prompt_cost(shape, attention_pairs=causal, scored_pairs=scored, held_scores=min(n, 64) * n)
