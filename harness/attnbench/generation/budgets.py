"""The cache a method keeps, as a share of the prompt: each family's knob, set from the share and the prompt's length.

kvpress sweeps the compression ratio (the share of key/value pairs removed); the share kept here is 1 minus it. A
share s of a prompt of n tokens is T = round(s n) tokens (`tokens_kept`), counted right after the prompt, exactly:
- `band` (StreamingLLM's sinks + window): window = T - c - 1 for c = max(sinks, global_tokens) first positions, so
  the cache holds the c sinks and the last window + 1 positions, T per key/value head (a step then sees the sinks,
  the window and itself, T keys);
- `h2o`: budget = T positions per key/value head (its `recent` ones among them);
- `snapkv`: budget = T per key/value head (its observation window among them);
- `topk` (Quest): Quest's token budget is T: a step reads T // page pages per query head (Quest's page budget),
  its current page among them, and every page while the context has no more: top_k = T // page - 1 ranked pages,
  and one fewer with keep_first_block (its forced first page is one of the T // page). Quest keeps every key: what
  is budgeted is what a step reads, whole pages, so (T // page) page <= T < (T // page + 1) page;
- `think` (ThinK) keeps every token and prunes key channels: its knob is the share itself, key_channels = s of each
  head's key channels (kvpress sets ThinK's key-channel ratio apart from the compression ratio);
- `duo-attention` (DuoAttention) keeps whole heads: head_compression_ratio = (n - T) / (n - c), the share of heads made
  streaming heads (c = sinks + recent positions each; the retrieval heads keep all n), so that the mean per key/value
  head is T (heads are whole: round(g L ratio) streaming heads over a model's L layers of g); 0 when T >= n, 1 (every
  head c positions, its floor) when T <= c.
A prompt no longer than T is kept whole (Quest: every page is read while there are no more than T // page). Below a
method's smallest setting it holds that instead: band c + 1 positions, h2o `recent` (when set), snapkv window + 1,
topk its current page (and the first one with keep_first_block). `tests/generation/test_knob_shares.py` checks each
count on the states themselves. A method without a knob (an RNN state, full) is run once, whatever the share.
Under the fixed-total budget rule (`attnbench.generation.kept`) a method whose cache grows by every later token
(SnapKV) keeps T less the tokens that will follow (`reserve`: the question and the answer's budget), so it never
holds more than T; a window and H2O hold T as they step, and Quest reads its T at every step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from attnbench.interface import AttentionVariant
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry


@dataclass(frozen=True)
class Knob:
    """The hyperparameter that sets a family's cache, and its value for a number of kept tokens per head."""

    parameter: str
    value: Callable[..., Any]  # (tokens kept | the share, the variant's hyperparameters[, n with of_length]) -> value
    floor: Callable[[dict[str, Any]], int]  # the fewest tokens a setting keeps (Quest: reads), whatever the share
    reads_only: bool = False  # the knob sets what a step reads; the cache keeps everything (Quest)
    appends: bool = False  # its own steps append every later token (SnapKV): fixed-total keeps room for them
    of_share: bool = False  # `value` takes the share itself, not the tokens it keeps (ThinK's key channels)
    of_length: bool = False  # `value` takes the prompt's length n too: (tokens, hparams, n) (DuoAttention's heads)


OWN_KNOBS: dict[str, Knob] = {  # the families with a cache rule of their own
    "band": Knob("window", lambda tokens, p: max(0, tokens - max(p["sinks"], p["global_tokens"]) - 1),
                 lambda p: max(p["sinks"], p["global_tokens"]) + 1),
    "h2o": Knob("budget", lambda tokens, p: max(1, p["recent"] or 0, tokens), lambda p: max(1, p["recent"] or 0)),
    "topk": Knob(
        "top_k", lambda tokens, p: max(0, tokens // p["block_size"] - 1 - int(p["keep_first_block"])),
        lambda p: (1 + int(p["keep_first_block"])) * p["block_size"], reads_only=True,
    ),
    # ThinK keeps every token: the share sets its key channels' share (values whole); no floor of tokens
    "think": Knob("key_channels", lambda share, p: min(1.0, share), lambda p: 1, of_share=True),
    # DuoAttention: the share of heads made streaming (c = sinks + recent positions each) for a mean of T per head
    "duo-attention": Knob(
        "head_compression_ratio",
        lambda tokens, p, n: min(1.0, max(0.0, (n - tokens) / max(1, n - p["sinks"] - p["recent"]))),
        lambda p: p["sinks"] + p["recent"], appends=True, of_length=True,
    ),
}  # fmt: skip


def press_knob(press: type[AttentionVariant]) -> Knob:
    """Every variant that declares `budget_knob` (kvpress's presses, `attnbench.variants.press.ScoredPress`: SnapKV,
    Knorm, ...): `budget` = T positions per head, at least its `smallest_budget`; its steps append."""
    return Knob("budget", lambda tokens, p: max(press.smallest_budget(p), tokens), press.smallest_budget, appends=True)


def _press(registry: Registry, name: str) -> type[AttentionVariant] | None:
    """The variant's class when it declares `budget_knob`, else None (unknown or broken: the registry says why)."""
    try:
        cls = registry.load(name)
    except Exception:
        return None
    return cls if getattr(cls, "budget_knob", False) else None


def knobs(registry: Registry = default_registry) -> dict[str, Knob]:
    """Every registered variant with a cache knob: the own rules above, and every press (a plugin's too)."""
    found = dict(OWN_KNOBS)
    for name in registry.names():
        if name not in found and (press := _press(registry, name)) is not None:
            found[name] = press_knob(press)
    return found


def knob_of(name: str, registry: Registry = default_registry) -> Knob | None:
    """The knob that sets a variant's cache from a share, or None (a method run once, whatever the share)."""
    if name in OWN_KNOBS:
        return OWN_KNOBS[name]
    press = _press(registry, name)
    return press_knob(press) if press is not None else None


def tokens_kept(share: float, n: int) -> int:
    """Positions per key/value head a share of a prompt of n tokens keeps (Quest: its token budget, what a step
    reads per query head)."""
    return max(1, round(share * n))


def at_share(name: str, hparams: dict[str, Any], share: float, n: int, reserve: int = 0) -> dict[str, Any]:
    """The variant's hyperparameters (every one resolved) with its knob set for `share` of a prompt of n tokens;
    `reserve` tokens fewer for a method whose steps append (the fixed-total rule's room for what follows)."""
    knob = knob_of(name)
    assert knob is not None, f"{name} has no cache knob"
    if knob.of_share:
        return {**hparams, knob.parameter: knob.value(share, hparams)}
    tokens = max(1, tokens_kept(share, n) - (reserve if knob.appends else 0))
    if knob.of_length:
        return {**hparams, knob.parameter: knob.value(tokens, hparams, n)}
    return {**hparams, knob.parameter: knob.value(tokens, hparams)}


def clamp_note(name: str, hparams: dict[str, Any], share: float, n: int, label: str = "") -> str | None:
    """What a share below a method's smallest setting becomes, said (kvpress's #264: a ratio that would evict the whole
    cache): None when the share's own count stands."""
    knob = knob_of(name)
    if knob is None or n <= 0:
        return None
    asked, floor = share * n, knob.floor(hparams)
    if tokens_kept(share, n) >= floor and asked >= 0.5:
        return None
    held = min(n, floor)
    return (f"{label or name} at keep {share:g} of N={n} would keep {asked:.3g} tokens per head: clamped to {held}, its smallest "
            f"setting{' (every page it reads)' if knob.reads_only else ''}")
