"""The one interface every attention variant implements, built-in or plugin.

b - batch, h - heads, i - query position, j - key position, d - head dim, e - value dim

A variant is called like `torch.nn.functional.scaled_dot_product_attention`:
q (b, h, i, d), k (b, h, j, d), v (b, h, j, e) -> (b, h, i, e), scale 1/sqrt(d).
`key_padding_mask` is (b, j) bool, True where the key is padding (nn.MultiheadAttention's convention).
Causal attention needs Nq == Nk: query i sees keys j <= i. A query that sees no key outputs zeros.
"""

from __future__ import annotations

import difflib
import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar, Hashable, TypeVar

import torch
from torch import Tensor

ALL_DTYPES = ("float64", "float32", "float16", "bfloat16")


class VariantError(ValueError):
    """A variant was asked for something it cannot do, or built with bad hyperparameters."""


class UnsupportedOptionError(VariantError):
    """The call used an option (causal, padding, Nq != Nk, device, dtype, backward) the variant does not declare."""


@dataclass(frozen=True)
class Capabilities:
    """What a variant can do; the harness asks these before calling, and records `unsupported` cells."""

    causal: bool = True
    key_padding_mask: bool = True
    cross_attention: bool = True  # Nq != Nk
    backward: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ALL_DTYPES
    subquadratic_memory: bool = False  # never holds an Nq x Nk matrix
    # decode with grouped-query attention: `prefill` and `step` take k, v with g heads for q's h (h a multiple of g),
    # keep one state per key/value head and select per key/value head; a variant without it is handed k, v repeated
    # to h heads (`expand_kv_heads`), so its state is per query head
    grouped_kv: bool = False
    # decode (generation against a state) is declared by implementing `prefill` and `step`; notes["decode"] says
    # why a variant has no decode form
    notes: dict[str, str] = field(default_factory=dict)  # option -> why it is unsupported


class DecodeState:
    """What a variant keeps between decode steps: a KV cache, a ring buffer, an RNN state, selection metadata.

    Subclasses are dataclasses; every tensor field (and every tensor in a list or tuple field) is part of the state.
    `nbytes` is what the state holds (each storage once, its whole allocation: a cache's room for later tokens
    included), `read_bytes` what a step must read of it (a cache's filled part; a selection may read less). The harness
    restarts a generation from a `clone` of the prefilled state.
    """

    def tensors(self) -> list[Tensor]:
        """Every tensor the state holds, a nested state's (a field that is itself a DecodeState) included."""
        found: list[Tensor] = []
        for item in (getattr(self, f.name) for f in fields(self)):  # type: ignore[arg-type]
            for part in item if isinstance(item, (list, tuple)) else [item]:
                found += part.tensors() if isinstance(part, DecodeState) else [part] if isinstance(part, Tensor) else []
        return found

    @property
    def nbytes(self) -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.tensors()}
        return sum(storages.values())

    @property
    def read_bytes(self) -> int:
        return self.nbytes

    @property
    def held_bytes(self) -> int:
        """What the state holds of positions seen (a cache's room for later tokens left out): `nbytes` unless a
        state says otherwise."""
        return self.nbytes

    evicts = False  # its own steps drop kept positions (a sliding window, H2O); else it only appends or is fixed

    def kept(self) -> tuple[Tensor, Tensor] | None:
        """The positions the state keeps, as keys (b, g, n, d) and values (b, g, n, e) in any order, when it is a
        set of kept positions (a KV cache, a window, heavy hitters); None for anything else (an RNN state, pages
        read by selection). What kvpress's budget rule freezes once the context ends."""
        return None

    def close_context(self) -> None:
        """The context has ended and, under kvpress's budget rule, every later position is kept and read whole: a
        state that selects what it reads (Quest's pages) ranks only the context's from now on. Nothing for others."""

    def stack_key(self) -> Hashable | None:
        """States of several batch rows with one key (not None) can step as one (`stack`): a generation's rows of one
        method at several budgets. None (the default): the state steps alone."""
        return None

    @classmethod
    def stack(cls, states: list["DecodeState"]) -> "DecodeState":
        """One state of the given states' rows, in order (their `stack_key`s equal)."""
        raise NotImplementedError(f"{cls.__name__} does not stack")

    def select_rows(self, rows: list[int]) -> "DecodeState":
        """The state of these batch rows alone, in this order (a generation drops the rows whose answers ended)."""
        raise NotImplementedError(f"{type(self).__name__} cannot select rows")

    def clone(self) -> "DecodeState":
        """A copy whose tensors share nothing with this state's (a step may write into its buffers)."""

        def copied(item: Any) -> Any:
            if isinstance(item, (Tensor, DecodeState)):
                return item.clone()
            return type(item)(copied(x) for x in item) if isinstance(item, (list, tuple)) else item

        return replace(self, **{f.name: copied(getattr(self, f.name)) for f in fields(self)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class PromptContext:
    """What a KV-cache method may know of the model around one layer's prompt, beyond its q/k/v: given by the in-model
    generation (`attnbench.generation`), absent (None) in a per-call decode run on synthetic inputs. A method that
    needs a field it is not given says so (`AttentionVariant.needs_model`)."""

    layer: int = 0  # this self-attention layer's index
    layers: int = 1  # the model's self-attention layers
    rotary: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None  # positions (n,) -> cos, sin (n, d): the model's
    # rotary embedding, rotate-half convention (q_rot = q cos + rotate_half(q) sin): what un-rotates the prompt's q
    out_proj: Tensor | None = None  # the layer's output projection weight (hidden, h * e): CriticalKV's ||W_o v||
    question: int = 0  # of the prompt's last positions, how many are the question (question-aware protocol)
    pass_scores: Tensor | None = None  # (b, g, n) per position, from a model-level pass of its own (KVzip's repeat)


@dataclass(frozen=True)
class Hyperparameter:
    """A declared hyperparameter: its default, its type, the values it may take, and what it means."""

    default: Any
    doc: str
    kind: type = int
    minimum: float | None = None
    choices: tuple[Any, ...] | None = None
    optional: bool = False  # None is allowed (e.g. "derive from N")

    def check(self, name: str, value: Any) -> str | None:
        """Return a message describing what is wrong with `value`, or None when it is valid."""
        if value is None:
            return None if self.optional else f"{name}: must be set (got None)"
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.kind) or (self.kind is not bool and isinstance(value, bool)):
            return f"{name}: expected {self.kind.__name__}, got {type(value).__name__} {value!r}"
        if self.kind is float and not math.isfinite(value):
            return f"{name}: must be a finite number, got {value!r}"
        if self.choices is not None and value not in self.choices:
            hint = did_you_mean(value, [str(c) for c in self.choices]) if isinstance(value, str) else ""
            return f"{name}: {value!r} is not one of {', '.join(map(repr, self.choices))}.{hint}".rstrip(".")
        if self.minimum is not None and value < self.minimum:
            return f"{name}: {value!r} is below the minimum {self.minimum}"
        return None


@dataclass(frozen=True)
class Shape:
    """The sizes of one attention call, for cost models."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    value_dim: int
    causal: bool = False
    dtype_bytes: int = 4


@dataclass(frozen=True)
class Cost:
    """Analytic cost of one forward call: floating-point operations and bytes of main-memory traffic.

    FLOPs count the work the algorithm does, not only the useful part: masked scores it computes, padding
    up to whole blocks, hashing and projections. `matmul_flops` is the part done in matmuls (two per
    multiply-add, as torch's FlopCounterMode counts them; `attnbench.measure.flops.count_matmul_flops` measures
    it), None when a variant does not give it; `flops` is that plus softmax and elementwise work. `useful_flops`
    is the work the method needs where an implementation does more (a band's blocks padded past its window):
    the roofline is taken from it, so waste counts against the implementation; None: all of `flops` is needed.
    """

    flops: float
    bytes_moved: float
    working_bytes: float  # largest intermediate the algorithm holds at once, besides inputs and output
    matmul_flops: float | None = None
    # the most a forward and backward call holds at once (what autograd saves for the backward and the
    # gradients it builds); None: twice `working_bytes`
    backward_working_bytes: float | None = None
    useful_flops: float | None = None

    @property
    def needed_flops(self) -> float:
        """The work the method needs: `useful_flops` where given, else `flops`."""
        return self.flops if self.useful_flops is None else self.useful_flops


BACKWARD_WORK = 3.0  # a forward and backward call does about three forward calls' work (the guard, the roofline)


def mode_work(mode: str) -> float:
    """How many forward calls' work one call of `mode` does: 1 for "fwd", BACKWARD_WORK for "fwd+bwd"."""
    return BACKWARD_WORK if mode == "fwd+bwd" else 1.0


_kept_caches: list[Any] = []
_F = TypeVar("_F", bound=Callable[..., Any])


def kept_between_calls(maxsize: int = 64) -> Callable[[_F], _F]:
    """`functools.lru_cache` for state a variant keeps between calls at module level (patterns, masks).

    Declared this way, the harness can empty it to measure what a first call builds (the `state` memory
    column) apart from what every call needs (the per-call peak). State kept on the instance needs nothing:
    the harness measures a fresh instance.
    """

    def wrap(fn: _F) -> _F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)
        _kept_caches.append(cached)
        # under torch.compile the cache is read as in eager (dynamo would trace through it and rebuild the state
        # inside the graph on every call): one graph break at the call, the kept tensors the graph's inputs
        kept = torch.compiler.disable(cached, recursive=True)
        functools.update_wrapper(kept, cached)
        kept.cache_clear, kept.cache_info = cached.cache_clear, cached.cache_info
        return kept  # type: ignore[return-value]

    return wrap


def kept_on_instance(method: _F) -> _F:
    """A variant's method whose result is drawn once per instance and arguments, then reused (projections, rotations,
    kernels drawn from the seed): the memo lives on the instance (the harness measures a fresh instance's first call
    as its state). Under torch.compile it runs as in eager, one graph break at the call: a memo that a first call
    fills would otherwise change dynamo's guards and recompile the variant at its next call."""

    @functools.wraps(method)
    def kept(self: Any, *args: Any) -> Any:
        memo = self.__dict__.setdefault("_kept_on_instance", {})
        key = (method.__name__, *args)
        if key not in memo:
            memo[key] = method(self, *args)
        return memo[key]

    return torch.compiler.disable(kept)  # type: ignore[return-value]


def clear_kept_state() -> None:
    """Empty every `kept_between_calls` cache."""
    for cache in _kept_caches:
        cache.cache_clear()


def did_you_mean(word: str, options: list[str]) -> str:
    """' Did you mean: x?' when `word` is close to one of `options`, else ''."""
    close = difflib.get_close_matches(word, options, n=3, cutoff=0.6)
    return f" Did you mean: {', '.join(close)}?" if close else ""


class AttentionVariant(ABC):
    """Base class of all variants. Subclasses set the class attributes and implement `forward`."""

    name: ClassVar[str]
    family: ClassVar[str]  # "exact" | "band" | "strided" | "lsh" | "low-rank" | "linear" | ...
    exact: ClassVar[bool]  # exact softmax on its own support (full, band, strided)
    supports: ClassVar[Capabilities] = Capabilities()
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {}
    # decode: True when each step equals the last row of the causal forward over everything so far (exact patterns,
    # recurrent forms of linear ones); False for methods that choose what to keep while generating (H2O, Quest)
    decode_equals_forward: ClassVar[bool] = True
    # False for a different operator that is not an approximation of softmax (gated and delta-rule linear attention,
    # a trained operator): its error columns still show its distance from softmax, but the verdict never recommends it
    # on that error
    approximates_softmax: ClassVar[bool] = True

    def __init__(self, seed: int = 0, **hyperparams: Any) -> None:
        problems = self.validate_hyperparams(hyperparams)
        if problems:
            raise VariantError(f"Invalid hyperparameters for variant '{self.name}': " + "; ".join(problems))
        self.seed = seed
        self.hparams: dict[str, Any] = {
            key: hyperparams.get(key, spec.default) for key, spec in self.hyperparameters.items()
        }
        for key, value in self.hparams.items():
            setattr(self, key, value)

    @classmethod
    def validate_hyperparams(cls, hyperparams: dict[str, Any]) -> list[str]:
        """Every problem with `hyperparams` as one message each (unknown names, types, ranges)."""
        problems = []
        known = list(cls.hyperparameters)
        for key, value in hyperparams.items():
            spec = cls.hyperparameters.get(key)
            if spec is None:
                listing = ", ".join(known) if known else "none"
                problems.append(f"unknown hyperparameter '{key}'.{did_you_mean(key, known)} Known: {listing}")
            elif (message := spec.check(key, value)) is not None:
                problems.append(message)
        return problems

    # ---- capabilities -------------------------------------------------------------------------

    def unsupported_reason(
        self,
        *,
        device: str,
        dtype: torch.dtype | str,
        causal: bool,
        padded: bool,
        n_q: int,
        n_k: int,
        backward: bool = False,
        decode: bool = False,
        in_model: bool = False,
    ) -> str | None:
        """Why a call with these options cannot run, or None when it can. Nothing is computed. `decode`: generation
        one token at a time (`prefill` then `step`), which is causal by definition; `in_model`: inside a model's
        generation, where a method may read the model around each layer (`needs_model`)."""
        caps = self.supports
        dtype_name = str(dtype).removeprefix("torch.")
        device_type = torch.device(device).type
        checks = [
            (device_type in caps.devices, "device", f"device '{device_type}' (supported: {', '.join(caps.devices)})"),
            (dtype_name in caps.dtypes, "dtype", f"dtype {dtype_name} (supported: {', '.join(caps.dtypes)})"),
            (not causal or caps.causal, "causal", "causal attention"),
            (not padded or caps.key_padding_mask, "key_padding_mask", "a key padding mask"),
            (n_q == n_k or caps.cross_attention, "cross_attention", f"Nq != Nk ({n_q} vs {n_k})"),
            (not backward or caps.backward, "backward", "backward (autograd)"),
            (not decode or self.decodes(), "decode", "decode (generation one token at a time against a state)"),
        ]
        for ok, option, what in checks:
            if not ok:
                note = caps.notes.get(option)
                return f"{self.name} does not support {what}" + (f": {note}" if note else "")
        if causal and n_q != n_k:
            return f"causal attention needs Nq == Nk (got {n_q} and {n_k})"
        return None

    def causal_options(
        self, *, device: str, dtype: torch.dtype | str, padded: bool = False, n: int = 8, backward: bool = False
    ) -> list[bool]:
        """The values of `causal` a full-sequence call with these options may take (Nq = Nk = n): [False, True],
        [True] for a causal-only variant (a recurrence), [] when neither (decode only, or an option it refuses)."""
        options = dict(device=device, dtype=dtype, padded=padded, n_q=n, n_k=n, backward=backward)
        return [causal for causal in (False, True) if self.unsupported_reason(causal=causal, **options) is None]

    # ---- the call -----------------------------------------------------------------------------

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """Attention output (b, h, i, e); checks shapes and declared capabilities, then runs `forward`."""
        check_shapes(q, k, v, key_padding_mask)
        reason = self.unsupported_reason(
            device=q.device.type,
            dtype=q.dtype,
            causal=causal,
            padded=key_padding_mask is not None,
            n_q=q.shape[-2],
            n_k=k.shape[-2],
            backward=torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
        )
        if reason is not None:
            raise UnsupportedOptionError(reason)
        return self.forward(q, k, v, causal=causal, key_padding_mask=key_padding_mask)

    @abstractmethod
    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        """The computation proper; inputs are already checked."""

    # ---- decode: generation one token at a time (optional) -----------------------------------------

    @classmethod
    def decodes(cls) -> bool:
        """The variant has an incremental form: it implements `prefill` and `step`."""
        return cls.step is not AttentionVariant.step

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The prompt, causal: its outputs (b, h, n, e) and the state a `step` continues from, with room for `room`
        steps before a buffer must grow. q (b, h, n, d) is given for methods that select with the prompt's
        queries (SnapKV). The outputs are what the method computes over the prompt (for most, its causal forward).
        With `supports.grouped_kv`, k (b, g, n, d) and v (b, g, n, e) may have g heads, h a multiple of g."""
        raise UnsupportedOptionError(f"{self.name} has no decode form")

    def prefill_state(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> DecodeState:
        """The state `prefill` leaves, without the prompt's outputs: what generation inside a model needs when the
        prompt's attention is computed exactly elsewhere, once for every method (a KV-cache method compressing at the
        end of an exact prefill, kvpress's protocol). This default calls `prefill` and drops its outputs; a variant
        overrides it to skip that work."""
        return self.prefill(q, k, v, room=room)[1]

    needs_model: ClassVar[str | None] = None  # why a per-call run cannot score (an extra pass of the model): generate only
    # a generation grid sets its cache from a share through `budget` (positions kept per head), at least
    # `smallest_budget` (kvpress's presses: `attnbench.variants.press.ScoredPress`)
    budget_knob: ClassVar[bool] = False
    # it scores the prompt by the attention mass each key receives (`attnbench.ops.prompt_mass`): a model's exact
    # prefill takes the masses from its own pass (H2O, ObservedAttention), counted as this method's cost
    scores_prompt_mass: ClassVar[bool] = False

    @classmethod
    def smallest_budget(cls, hparams: dict[str, Any]) -> int:
        """With `budget_knob`: the fewest positions it can keep (a window it always keeps, plus one)."""
        return 1

    def for_prompt(self, context: PromptContext) -> "AttentionVariant":
        """This variant as it meets one layer's prompt inside a model (`PromptContext`): itself unless it reads the
        model around the layer (a layer's budget, the rotary embedding, the output projection, an extra pass)."""
        return self

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """One new token: q, k, v (b, h, 1, d) -> its output (b, h, 1, e) and the state with the token in it (the
        same object updated in place, or a new one). The token sees itself and what the state kept before it.
        With `supports.grouped_kv`, k and v have the g heads the prefill's had."""
        raise UnsupportedOptionError(f"{self.name} has no decode form")

    def steps(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """t new tokens, each as `step` takes it (the tokens before it in the chunk seen): q (b, h, t, d), k, v as
        `step`'s with t positions -> (b, h, t, e) and the state. This default steps one token at a time; a variant whose
        state takes a chunk at once (Quest's pages) overrides it, with equal outputs."""
        outs = []
        for t in range(q.shape[-2]):
            out, state = self.step(state, *(x[..., t : t + 1, :] for x in (q, k, v)))
            outs.append(out)
        return torch.cat(outs, dim=-2), state

    def support_mask(self, n_q: int, n_k: int, causal: bool) -> Tensor | None:
        """For exact-pattern variants: the dense (i, j) bool pattern, True where query i sees key j.

        A pattern that differs by head is (p, i, j): head h uses pattern[h % p]. Only for self-checks at
        small N. Approximate variants return None.
        """
        return None

    def support_for(
        self, q: Tensor, k: Tensor, *, causal: bool, key_padding_mask: Tensor | None = None
    ) -> Tensor | None:
        """(b|1, h|1, i, j) bool: the keys each query attends to for these inputs, key padding not applied.

        A static pattern gives its `support_mask` over the heads (this default). A variant whose support depends on
        q and k (block top-k selection) overrides it to return the support it chose, so the self-check and the
        dropped mass judge what it attended to. Dense by definition: small N only. None for approximate variants.
        """
        pattern = self.support_mask(q.shape[-2], k.shape[-2], causal)
        if pattern is None:
            return None
        if pattern.dim() == 3:  # one pattern per head, cycling: head h uses pattern[h % p]
            return pattern[torch.arange(q.shape[1]) % pattern.shape[0]][None].to(q.device)
        return pattern[None, None].to(q.device)

    @property
    def reads_keys(self) -> bool:
        """False for variants that derive keys from the queries (e.g. shared-QK LSH) and ignore the k given."""
        return True

    @property
    def compiles_itself(self) -> bool:
        """True when the variant's call is compiled code already (FlexAttention): `compile = true` would compile it
        twice, and its guards (a new mask function each call) would recompile it every call."""
        return False

    @property
    def cpu_memory_trackable(self) -> bool:
        """False when the work runs in compiled kernels whose allocations the CPU tensor tracker cannot see
        (and which must not run under a TorchDispatchMode); the harness then leaves CPU memory unmeasured."""
        return True

    def cost(self, shape: Shape) -> Cost:
        """Analytic cost; the default is dense attention's. Sub-quadratic variants override it."""
        return dense_attention_cost(shape)

    def label(self) -> str:
        """Name plus non-default hyperparameters, e.g. `band(window=128)`."""
        changed = {k: v for k, v in self.hparams.items() if v != self.hyperparameters[k].default}
        if not changed:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in changed.items())})"

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.hparams.items())
        return f"{type(self).__name__}({params}{', ' if params else ''}seed={self.seed})"


def declaration_problems(cls: type[AttentionVariant]) -> list[str]:
    """What is wrong with a variant class's declaration, checked when it is registered (before any work)."""
    declared = set(AttentionVariant.__annotations__)  # name, family, exact, ...: class variables without a value
    reserved = {"seed", "hparams"} | declared | {name for name in dir(AttentionVariant) if not name.startswith("_")}
    problems = [
        f"hyperparameter '{key}' uses a reserved name (it would overwrite the variant's own `{key}`); rename it"
        for key in cls.hyperparameters
        if key in reserved
    ]
    if cls.exact and not has_own_support(cls):
        problems.append(
            "declares exact = True but does not implement support_mask(n_q, n_k, causal) (or, for a support chosen "
            "from q and k, support_for(q, k, causal=, key_padding_mask=)) for its self-check"
        )
    return problems


CHOSEN_SUPPORT_CHECK_LEN = 1100  # a support chosen from q and k is also checked here: 18 blocks of 64 to choose from


def chooses_support(cls: type[AttentionVariant]) -> bool:
    """The variant picks its support from q and k (it overrides `support_for`): its self-checks then also run at
    CHOSEN_SUPPORT_CHECK_LEN, where a selection of blocks is a real choice rather than every block."""
    return cls.support_for is not AttentionVariant.support_for


def has_own_support(cls: type[AttentionVariant]) -> bool:
    """The class says what it attends to: a static `support_mask` or a per-input `support_for`."""
    return cls.support_mask is not AttentionVariant.support_mask or chooses_support(cls)


def query_group(q: Tensor, k: Tensor) -> int:
    """How many query heads share each key/value head: q (b, h, ., d), k (b, g, ., d) -> h / g (1 without GQA)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise VariantError(f"{heads} query heads cannot share {kv_heads} key/value heads (h must be a multiple of g)")
    return heads // kv_heads


def expand_kv_heads(x: Tensor, group: int) -> Tensor:
    """k or v (b, g, n, d) repeated for the `group` query heads sharing each head: (b, g * group, n, d), query head
    i reading key/value head i // group (transformers' `repeat_kv`)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def check_shapes(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
    """Raise a clear error unless q, k, v and the mask have the interface's layout."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise VariantError(
            f"q, k, v must be 4-D (b, h, n, d); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, h, _, d = q.shape
    if k.shape[:2] != (b, h) or v.shape[:2] != (b, h) or k.shape[-1] != d or k.shape[-2] != v.shape[-2]:
        raise VariantError(
            f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            "expected q (b, h, Nq, d), k (b, h, Nk, d), v (b, h, Nk, dv)"
        )
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise VariantError("q, k and v must share one dtype and one device")
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (b, k.shape[-2]):
            raise VariantError(
                f"key_padding_mask must be bool of shape (b, Nk) = ({b}, {k.shape[-2]}); "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )


SAVED_SCORE_COPIES = 3  # a backward through softmax holds the saved weights, their gradient and the scores'


def saved_scores_bytes(pairs: float, shape: Shape) -> float:
    """What a backward through softmax attention over `pairs` computed scores holds at once, besides the forward's
    working set: SAVED_SCORE_COPIES arrays of one value per score."""
    return SAVED_SCORE_COPIES * pairs * shape.dtype_bytes


def softmax_attention_flops(pairs: float, shape: Shape) -> tuple[float, float]:
    """(matmul, other) FLOPs of softmax attention over `pairs` computed (query, key) scores: q . k and
    weights . v in matmuls, and about 5 per score for scaling, max, exp, sum and division."""
    return 2 * pairs * (shape.head_dim + shape.value_dim), 5 * pairs


def dense_attention_cost(shape: Shape) -> Cost:
    """FLOPs and bytes of softmax(QK^T)V done densely: two matmuls plus the softmax (causal: j <= i only).

    Its working memory is the (b, h, Nq, Nk) score matrix: the default a variant inherits, so that the memory
    guard never takes a plugin that does not say otherwise for free. A variant that holds less overrides it.
    """
    s = shape
    pairs = s.batch * s.heads * s.n_q * s.n_k
    if s.causal:
        pairs = pairs * (s.n_q + 1) / (2 * s.n_q)
    matmul, other = softmax_attention_flops(pairs, s)
    io = s.batch * s.heads * (s.n_q * s.head_dim + s.n_k * (s.head_dim + s.value_dim) + s.n_q * s.value_dim)
    scores = s.batch * s.heads * s.n_q * s.n_k * s.dtype_bytes
    return Cost(flops=matmul + other, bytes_moved=io * s.dtype_bytes, working_bytes=scores, matmul_flops=matmul)


def default_scale(head_dim: int) -> float:
    """SDPA's softmax scale, 1/sqrt(d)."""
    return 1.0 / math.sqrt(head_dim)
