"""Each self-attention layer of the model generating with a method: the method's state for that layer, built from the
prompt, and every later token through the method's `step`.

A forward pass of the model carries one method per batch row (the rows share the prompt, so the projections and
MLPs run once for all methods, batched); attention is split by row and each row goes to its own method. Key/value
heads arrive as the model has them (SmolLM2: 3 for 9 query heads): a method that declares `grouped_kv` keeps and
selects per key/value head; another is handed them repeated for every query head (its state is then per query head,
and counted so).

How a method meets the prompt (`Method.prefill`):
- "dense": the prompt's attention is exact in every layer (computed once, `ExactPrompt`, and shared by every such
  method), and the method's state is built from each layer's exact q/k/v: kvpress's protocol (compress at the end
  of prefill), and that of H2O, SnapKV and Quest, which change generation only;
- "own": the method's own prefill in every layer, its outputs flowing into the next layer (a window's or an RNN's
  prompt, a sparse prefill).
A method whose `decode` is "exact" (any variant with `prefill = "own"`: MoBA's `topk` selection, `strided`, a
variant with no decode form at all) is its sparse prefill followed by exact decoding against the prompt's whole
cache.

A hybrid model's sliding-window layers (Gemma 3: five of each six; the call says so, `attention.band_window`) keep
their window as the model does, in every row: the exact model's cache there is that window, and a method goes into
the global layers only (`Method.layers` "global", the default: its share and bytes are then of what the model really
holds, the windows counted as the model's own). With "all" it also replaces each sliding layer's window after the
prompt, reading what it keeps of the whole context as a global layer would.

b - batch (one method per row), h - query heads, g - key/value heads, n - positions, d - head dim, e - value dim
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from attnbench.generation.kept import (
    BUDGET_RULES,
    QUANTIZE,
    appends_after_prompt,
    attend_appended,
    attend_batched,
    batched,
    row_held_bytes,
)
from attnbench.interface import AttentionVariant, DecodeState, PromptContext, expand_kv_heads, query_group
from attnbench.model.attention import model_window
from attnbench.ops import (
    KVCache,
    attention_and_masses,
    attention_with_lse,
    masses_from_lse,
    remember_mass,
)

PREFILLS = ("dense", "own")
DECODES = ("own", "exact")  # the variant's own decode form, or exact decoding against every key kept
LAYERS = ("global", "all")  # where a method goes in a hybrid model: its global layers, or every layer (windows too)


@dataclass(frozen=True)
class Method:
    """One attention setting inside the model: the variant, how it meets the prompt, how many of the first layers stay
    exact (Quest leaves the first two dense), and whether what it keeps after the prompt is quantized (`QUANTIZE`)."""

    variant: AttentionVariant
    prefill: str = "dense"
    dense_layers: int = 0
    label: str = ""
    decode: str = "own"
    quantize: str = "none"
    layers: str = "global"  # `LAYERS`: a sliding-window layer keeps its window unless "all"

    def __post_init__(self) -> None:
        if self.prefill not in PREFILLS:
            raise ValueError(f"prefill must be one of {', '.join(PREFILLS)}; got {self.prefill!r}")
        if self.decode not in DECODES:
            raise ValueError(f"decode must be one of {', '.join(DECODES)}; got {self.decode!r}")
        if self.quantize not in QUANTIZE:
            raise ValueError(f"quantize must be one of {', '.join(QUANTIZE)}; got {self.quantize!r}")
        if self.layers not in LAYERS:
            raise ValueError(f"layers must be one of {', '.join(LAYERS)}; got {self.layers!r}")
        if not self.label:
            quantized = f" + {self.quantize}" if self.quantize != "none" else ""
            everywhere = " in every layer" if self.layers == "all" else ""
            object.__setattr__(self, "label", self.variant.label() + quantized + everywhere)

    @property
    def decodes(self) -> bool:
        """Its steps are its variant's decode form; else exact against the whole cache."""
        return self.decode == "own" and self.variant.decodes()

    @property
    def shares_exact_prompt(self) -> bool:
        """Its prompt is the exact model's, computed once for every such method (see the module docstring)."""
        return self.prefill == "dense" or self.variant.name == "full"


def own_form(variant: AttentionVariant | None, own_decode: bool) -> bool:
    """The layer runs the variant's own prefill/step (else exact attention and a KV cache, or a variant's forward over
    the prompt followed by exact steps)."""
    return variant is not None and own_decode and variant.decodes()


def kv_for(variant: AttentionVariant, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """k, v (b, g, n, d|e) as the variant's decode form takes them: as given when it decodes grouped-query attention,
    else repeated for every query head."""
    if variant.supports.grouped_kv:
        return k, v
    group = query_group(q, k)
    return expand_kv_heads(k, group), expand_kv_heads(v, group)


def self_attention_only(causal: bool, padding: Tensor | None, cross: bool) -> None:
    if cross or padding is not None or not causal:
        raise ValueError("generation runs a decoder's causal self-attention on one unpadded sequence")


def layer_prefill(
    variant: AttentionVariant | None, q: Tensor, k: Tensor, v: Tensor, room: int, own_decode: bool = True
) -> tuple[Tensor, DecodeState]:
    """One layer's prompt through a method: q (b, h, n, d), k (b, g, n, d), v (b, g, n, e) -> its outputs (b, h, n, e)
    and its state. None: exact attention and a KV cache (a layer kept dense). Without its own decode form (none, or
    `own_decode` False): its causal forward, and the whole cache for exact steps."""
    if own_form(variant, own_decode):
        assert variant is not None
        return variant.prefill(q, *kv_for(variant, q, k, v), room=room)
    group = query_group(q, k)
    if variant is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=group > 1)
    else:
        out = variant(q, expand_kv_heads(k, group), expand_kv_heads(v, group), causal=True)
    return out, KVCache.of(k, v, room)


def layer_state(
    variant: AttentionVariant | None, q: Tensor, k: Tensor, v: Tensor, room: int, own_decode: bool = True
) -> DecodeState:
    """`layer_prefill`'s state without its outputs (the prompt's attention is the exact one, computed elsewhere)."""
    if own_form(variant, own_decode):
        assert variant is not None
        return variant.prefill_state(q, *kv_for(variant, q, k, v), room=room)
    return KVCache.of(k, v, room)


def layer_step(
    variant: AttentionVariant | None, state: DecodeState, q: Tensor, k: Tensor, v: Tensor, own_decode: bool = True
) -> tuple[Tensor, DecodeState]:
    """t new tokens through a layer, each as a step takes it: q (b, h, t, d), k, v (b, g, t, d|e) -> (b, h, t, e) and
    the state (exact against the whole cache without the variant's own decode form). One token: the variant's
    `step`; several: its `steps` (a chunk at once where its state allows, else a token at a time)."""
    if own_form(variant, own_decode):
        assert variant is not None
        k, v = kv_for(variant, q, k, v)
        return variant.step(state, q, k, v) if q.shape[-2] == 1 else variant.steps(state, q, k, v)
    assert isinstance(state, KVCache)
    if q.shape[-2] > 1:
        return attend_appended(state, q, k, v), state
    return state.step(q, k, v), state


@dataclass
class ExactPrompt:
    """Router of the exact prompt: exact causal attention in every layer (grouped, as the model's own SDPA), each
    layer's post-rotary q (b, h, n, d), k, v (b, g, n, d|e) kept for the methods that build their state from it."""

    layers: list[tuple[Tensor, Tensor, Tensor]] = field(default_factory=list)
    with_masses: bool = False  # the attention mass each key receives, from the same pass (H2O's prompt score)
    masses: list[Tensor | None] = field(default_factory=list)  # (1, g, n) per layer, with_masses
    masses_s: float = 0.0  # seconds spent on the masses (H2O's cost, not the exact model's)
    windows: list[int | None] = field(default_factory=list)  # each layer's own sliding window (None: global)
    masses_in_windows: bool = False  # with_masses: a sliding layer's too (a method scoring them goes there: "all")

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool, window: int | None = None) -> Tensor:
        self_attention_only(causal, padding, cross)
        self.layers.append((query, key, value))
        self.windows.append(window)
        if window is not None:  # the model's own sliding window, exact (block-wise)
            out, _ = layer_prefill(model_window(window), query, key, value, room=0)
            if self.with_masses:
                started = time.perf_counter()
                self.masses.append(attention_and_masses(query, key, value)[1] if self.masses_in_windows else None)
                self.masses_s += time.perf_counter() - started
            return out
        if not self.with_masses:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                  enable_gqa=query.shape[1] != key.shape[1])  # fmt: skip
        fused = attention_with_lse(query, key, value)  # the fused kernel's outputs, the masses from its log-sum-exp
        started = time.perf_counter()
        if fused is None:  # no kernel to take them from: a pass of their own, counted as theirs
            out, mass = attention_and_masses(query, key, value)
        else:
            out, mass = fused[0], masses_from_lse(query, key, fused[1])
        self.masses_s += time.perf_counter() - started
        self.masses.append(mass)
        return out

    @property
    def cache_bytes(self) -> int:
        """What the exact model's KV cache holds after the prompt: every layer's keys and values (g heads), a sliding
        layer's last window + 1 positions."""
        held = 0
        for (_, k, v), window in zip(self.layers, self.windows or [None] * len(self.layers)):
            n = k.shape[-2] if window is None else min(k.shape[-2], window + 1)
            held += (k[..., :n, :].numel() * k.element_size() + v[..., :n, :].numel() * v.element_size())
        return held


@dataclass
class Member:
    """What steps one or several rows of a layer after the prompt: a batched cache of kept positions (`batched`, the
    rows stepping together by `attend_batched`: a KVCache, or a quantized cache for rows that quantize), or the state
    of one method's rows, stacked (`DecodeState.stack`: Quest at several budgets) or one row's alone, stepped by the
    method."""

    rows: list[int]
    state: DecodeState
    batched: bool
    window: bool = False  # the model's own sliding window, every row that keeps it stepping as one


class MethodRows:
    """Router of a batch whose row r generates with methods[r]: each layer's states per row, filled by `prefill`
    (the model's forward over the prompt, for methods with their own prefill) or `from_exact` (the shared exact
    prompt), then advanced through every later token (a forward pass over one token per row, or over several: the
    question after a compressed context). At a layer's first call after the prompt its states are sorted under the
    budget rule (`attnbench.generation.kept`): the rows that only append from then on, grouped by how many positions
    they kept, step together as one batched cache; every other row steps alone through its method's `step`."""

    def __init__(self, methods: list[Method], room: int, rule: str = "kvpress") -> None:
        if rule not in BUDGET_RULES:
            raise ValueError(f"budget rule must be one of {', '.join(BUDGET_RULES)}; got {rule!r}")
        self.methods, self.room, self.rule = methods, room, rule
        self.states: list[list[DecodeState]] = []  # [layer][row], after the prompt
        self.windows: list[int | None] = []  # [layer]: its own sliding window (None: a global layer)
        self.members: list[list[Member]] = []  # [layer], from the first call after the prompt
        self.layer = 0  # the next self-attention call's layer: the caller resets it before each forward pass
        self.build_s = [0.0] * len(methods)  # each row's time building its states from the exact prompt
        self.alive = list(range(len(methods)))  # the rows a call's batch holds, in order (`retain` drops finished ones)

    def join(self, other: "MethodRows") -> "MethodRows":
        """One batch of this batch's rows, then the other's, their states kept (both past the same prompt)."""
        if not self.methods or not other.methods:
            return other if not self.methods else self
        joined = MethodRows(self.methods + other.methods, self.room, self.rule)
        joined.states = [mine + theirs for mine, theirs in zip(self.states, other.states)]
        joined.windows = self.windows or other.windows
        joined.build_s = self.build_s + other.build_s
        return joined

    def retain(self, rows: list[int]) -> None:
        """From the next call on, the batch holds these rows alone (in this order): a row whose answer has ended
        takes no more steps. Every layer's members lose the others (a batched cache keeps its remaining rows)."""
        keep = set(rows)
        for layer in range(len(self.states)):
            members = []
            for member in self.members_of(layer):
                mine = [index for index, row in enumerate(member.rows) if row in keep]
                if len(mine) == len(member.rows):
                    members.append(member)
                elif mine:  # rows of a batched or stacked state: the state of those left
                    members.append(Member([member.rows[i] for i in mine], member.state.select_rows(mine), member.batched,
                                          member.window))
            self.members[layer] = members
        self.alive = list(rows)

    def keeps_window(self, row: int, layer: int) -> bool:
        """The layer is one of the model's sliding-window layers and the row's method leaves it its window."""
        return layer < len(self.windows) and self.windows[layer] is not None and self.methods[row].layers == "global"

    def variant_at(self, row: int, layer: int) -> AttentionVariant | None:
        method = self.methods[row]
        if self.keeps_window(row, layer):
            return model_window(self.windows[layer])  # type: ignore[arg-type]
        return None if layer < method.dense_layers else method.variant

    def own_decode(self, row: int, layer: int = -1) -> bool:
        return self.methods[row].decode == "own" or self.keeps_window(row, layer)

    def from_exact(self, exact: ExactPrompt, contexts: list[PromptContext] | None = None) -> None:
        """Each layer's state of every row built from the exact prompt's q/k/v (the outputs are the exact model's): the
        rows share that one prompt (a batch of 1). H2O's prompt masses come from the exact pass when it kept them;
        `contexts` (one per layer): what a method may read of the model around the layer (`for_prompt`)."""
        if any(q.shape[0] != 1 for q, _, _ in exact.layers):
            raise ValueError("the exact prompt is one sequence that every row shares (batch 1)")
        self.states = []
        self.windows = list(exact.windows) or [None] * len(exact.layers)
        for layer, (q, k, v) in enumerate(exact.layers):
            if exact.masses and exact.masses[layer] is not None:
                remember_mass(q, k, exact.masses[layer])
            context = contexts[layer] if contexts is not None else PromptContext(layer, len(exact.layers))
            states: list[DecodeState] = []
            window: DecodeState | None = None  # the model's own window here: built once, every row that keeps it
            # shares it until `members_of` stacks them into one buffer
            for row in range(len(self.methods)):
                if self.keeps_window(row, layer) and window is not None:
                    states.append(window)
                    continue
                started = time.perf_counter()
                variant = self.variant_at(row, layer)
                variant = variant.for_prompt(context) if variant is not None else None
                states.append(layer_state(variant, q, k, v, self.room, self.own_decode(row, layer)))
                window = states[-1] if self.keeps_window(row, layer) else window
                self.build_s[row] += time.perf_counter() - started
            self.states.append(states)

    def members_of(self, layer: int) -> list[Member]:
        """The layer's rows as they step after the prompt (sorted once, at the first such call)."""
        while len(self.members) <= layer:
            index = len(self.members)
            groups: dict[tuple, list[int]] = {}
            stacks: dict[tuple, list[int]] = {}
            members = []
            windowed = [row for row in range(len(self.states[index])) if self.keeps_window(row, index)]
            if windowed:  # the model's own window in these rows: one buffer, evicting as it steps whatever the rule
                states = [self.states[index][row] for row in windowed]
                members.append(Member(windowed, type(states[0]).stack(states), batched=False, window=True))
            for row, state in enumerate(self.states[index]):
                if row in windowed:
                    continue
                quantize = self.methods[row].quantize
                if appends_after_prompt(state, self.rule):
                    k, v = state.kept()  # type: ignore[misc]
                    groups.setdefault((k.shape, v.shape, k.dtype, quantize), []).append(row)
                    continue
                if quantize != "none":
                    raise ValueError(f"{self.methods[row].label}: a {type(state).__name__} is not a set of kept "
                                     f"positions that only appends under the {self.rule} rule, so it cannot be "
                                     "quantized: drop quantize from this method")  # fmt: skip
                if self.rule == "kvpress":
                    state.close_context()
                key = state.stack_key()
                if key is None:
                    members.append(Member([row], state, batched=False))
                else:  # one method's rows (its variant's step, whatever their budgets)
                    stacks.setdefault((key, self.variant_at(row, index).name, self.own_decode(row, index)), []).append(row)
            for (*_, quantize), rows in groups.items():
                state = batched([self.states[index][r] for r in rows], self.room, quantize)
                members.append(Member(rows, state, batched=True))
            for rows in stacks.values():
                states = [self.states[index][r] for r in rows]
                state = states[0] if len(rows) == 1 else type(states[0]).stack(states)
                members.append(Member(rows, state, batched=False))
            self.members.append(members)
            self.states[index] = []  # the members hold them now
        return self.members[layer]

    def attend(self, query: Tensor, key: Tensor, value: Tensor, *, causal: bool, padding: Tensor | None,
               cross: bool, window: int | None = None) -> Tensor:
        self_attention_only(causal, padding, cross)
        layer, self.layer = self.layer, self.layer + 1
        if layer == len(self.states) and layer >= len(self.members):  # the prompt: each row's prefill
            self.windows.append(window)
            parts = [layer_prefill(self.variant_at(r, layer), *(x[r : r + 1] for x in (query, key, value)), self.room,
                                   self.own_decode(r, layer)) for r in range(query.shape[0])]  # fmt: skip
            self.states.append([state for _, state in parts])
            return torch.cat([out for out, _ in parts], dim=0)
        out = query.new_empty(*query.shape[:-1], value.shape[-1])
        place = {row: position for position, row in enumerate(self.alive)}  # a row's place in this call's batch
        for member in self.members_of(layer):
            places = [place[row] for row in member.rows]
            if places == list(range(places[0], places[0] + len(places))):  # side by side in the batch: views
                rows: slice | Tensor = slice(places[0], places[0] + len(places))
                q, k, v = query[rows], key[rows], value[rows]
            else:
                rows = torch.tensor(places, device=query.device)
                q, k, v = (x.index_select(0, rows) for x in (query, key, value))
            out[rows] = self.step_member(member, layer, q, k, v)
        return out

    def step_member(self, member: Member, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """A member's rows through t new tokens: q (m, h, t, d), k, v (m, g, t, d|e) -> (m, h, t, e)."""
        if member.batched:
            return attend_batched(member.state, q, k, v)
        row = member.rows[0]  # a stacked state's rows share their method (or the model's window)
        out, member.state = layer_step(self.variant_at(row, layer), member.state, q, k, v, self.own_decode(row, layer))
        return out

    def row_states(self, layer: int, row: int) -> tuple[DecodeState, int | None]:
        """A row's state at a layer, and its index inside a batched cache (None: its own state, a copy of its rows'
        when stacked); a row dropped by `retain` has none (KeyError)."""
        if layer < len(self.members) or self.states[layer]:
            for member in self.members_of(layer):
                if row in member.rows:
                    if member.batched:
                        return member.state, member.rows.index(row)
                    if len(member.rows) > 1:
                        return member.state.select_rows([member.rows.index(row)]), None
                    return member.state, None
        raise KeyError(f"row {row} holds no state at layer {layer} (its answer ended)")

    def row_bytes(self, row: int) -> tuple[int, int]:
        """(held, read by the next step) of one row's states over every layer: the positions a state that only appends
        holds (not the room it was given), what any other state holds and its next step reads."""
        held = read = 0
        for layer in range(max(len(self.states), len(self.members))):
            state, index = self.row_states(layer, row)
            if index is not None:  # a row of a batched cache (plain or quantized)
                held, read = held + row_held_bytes(state), read + row_held_bytes(state)
            else:
                held, read = held + state.held_bytes, read + state.read_bytes
        return held, read
