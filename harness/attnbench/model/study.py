"""`attnbench model`: each variant swapped into a local Hugging Face model, and what it does to the model.

Per variant setting and sequence length, against the exact model at that length (PyTorch SDPA in every layer,
through the same attention implementation, so nothing but the attention differs):
- every self-attention layer swapped: the hidden state after each layer and the final output (logits where
  the model has a language-modelling head), as relative error and cosine similarity; the loss on the text, its
  perplexity and the perplexity ratio against the exact model;
- optionally (`single_layers`), one layer swapped at a time: that layer's attention output against the exact
  one (its input exact), so a reader sees which layers tolerate the variant;
- optionally (`min_run_time`), the forward pass timed in turns with the exact one (paired speedup).
A hybrid model's sliding-window layers (Gemma 3: five of each six) keep their own window, exact, as the model does
(`attention.Routing`): "every layer" is then every global layer, and only those are swapped one at a time
(`swap_layout` says it in words).
Logits are never built whole (`attnbench.model.head`), so long sequences fit in memory. Two checks tie the
study to transformers itself: the native check (every length: exact attention through attnbench against the
model's own SDPA attention, final output and loss) and the head check (the sliced head and loss against
transformers' complete forward pass and its own loss). A variant that cannot serve the model (no causal form
for a decoder) is a row with its reason. Nothing is downloaded: the model is read from a local folder, without
remote code.

b - batch, n - tokens, h - heads, d - head dim, e - hidden size
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from attnbench.atomic import write_text_atomic
from attnbench.measure.timing import time_in_turns
from attnbench.model import attention as hf_attention
from attnbench.model.attention import IMPLEMENTATION, Routing
from attnbench.model.head import CapturedInput, head_input, head_of, loss_targets
from attnbench.plan.cells import VariantSpec
from attnbench.registry import registry
from attnbench.stats import paired_speedup, quantile

NATIVE_TOLERANCE = 1e-4  # exact attention through attnbench against the model's own: float rounding only
HEAD_CHECK_TOKENS = 512  # positions of the head check: transformers' complete forward builds their logits whole
MASKED_SHARE = 0.15  # masked-LM loss: the share of positions masked (seeded), as in BERT's pre-training


class ModelStudyError(ValueError):
    """The model, the tokens or a variant cannot be used; the message says what to do."""


@dataclass
class ModelRow:
    """One row of model.csv: a variant setting at one sequence length, how it was swapped, and one layer (or the
    whole model)."""

    variant: str
    label: str
    hparams: str  # JSON
    seq_len: int  # tokens: the first seq_len of the input, with the exact model at this length as the reference
    swap: str  # "all": every (global) self-attention layer swapped; "single": only `layer`
    layer: str  # "0", "1", …, or "final" (the model's output: logits with an LM head, else the last hidden state)
    status: str = "ok"
    reason: str = ""
    rel_error: float | None = None  # ||X - X*|| / ||X*||: hidden state (all), attention output (single), output
    cosine: float | None = None  # mean over tokens of cos(X_i, X*_i)
    loss: float | None = None  # final rows of a model with an LM head: the loss on the text with the variant
    loss_exact: float | None = None
    loss_change: float | None = None  # loss - loss_exact (nats per token)
    perplexity: float | None = None  # exp(loss)
    perplexity_exact: float | None = None  # exp(loss_exact)
    perplexity_ratio: float | None = None  # exp(loss_change)
    time_s: float | None = None  # final rows, when timed: median forward time with the variant (in turns)
    time_exact_s: float | None = None
    speedup: float | None = None  # paired, median over rounds of exact time / this time
    speedup_low: float | None = None
    speedup_high: float | None = None


MODEL_COLUMNS = [f.name for f in fields(ModelRow)]


def compare(output: Tensor, exact: Tensor) -> tuple[float, float]:
    """Relative Frobenius error and mean cosine over the last axis, in float64."""
    out, ref = output.detach().double(), exact.detach().double()
    rel = (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref).clamp(min=1e-300)).item()
    cosine = torch.nn.functional.cosine_similarity(out, ref, dim=-1, eps=1e-30).mean().item()
    return rel, cosine


# ---- the model and its input ---------------------------------------------------------------------


def load_model(model_dir: Path) -> tuple[nn.Module, str]:
    """The model with its head where it has one: ("causal-lm" | "masked-lm" | "base")."""
    from attnbench.model.capture import CaptureError, model_config

    try:
        config = model_config(model_dir, "attnbench model")
    except CaptureError as error:
        raise ModelStudyError(str(error)) from None
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    if getattr(config, "is_encoder_decoder", False):
        raise ModelStudyError(
            f"{config.model_type} is an encoder-decoder model: attnbench model studies encoders and decoders only"
        )
    architectures = " ".join(getattr(config, "architectures", None) or [])
    kind, loader = "base", AutoModel
    if "CausalLM" in architectures or "LMHeadModel" in architectures:
        kind, loader = "causal-lm", AutoModelForCausalLM
    elif "MaskedLM" in architectures or "ForPreTraining" in architectures:
        kind, loader = "masked-lm", AutoModelForMaskedLM
    try:
        model = loader.from_pretrained(  # float32 whatever the checkpoint's dtype: errors are not rounding
            str(model_dir),
            local_files_only=True,
            trust_remote_code=False,
            attn_implementation="sdpa",
            dtype=torch.float32,
        )
    except Exception as error:
        raise ModelStudyError(f"could not load {model_dir}: {type(error).__name__}: {error}") from None
    return model.eval(), kind


def is_causal_model(model: nn.Module) -> bool:
    """Whether its self-attention is causal (a decoder): read from its attention modules."""
    flags = [m.is_causal for m in model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
    return any(flags) or bool(getattr(model.config, "is_decoder", False))


def masked_inputs(ids: Tensor, mask_token_id: int | None, seed: int) -> tuple[Tensor, Tensor | None]:
    """(input ids, labels) for a masked-LM loss: MASKED_SHARE of the positions masked, labels elsewhere -100.
    The positions are drawn in order from the seed, so the first n of a longer sequence are masked alike."""
    if mask_token_id is None:
        return ids, None
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.rand(ids.shape, generator=generator) < MASKED_SHARE
    chosen[..., 0] = False  # keep the first token ([CLS])
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return torch.where(chosen, torch.full_like(ids, mask_token_id), ids), labels


def spec_problems(specs: list[VariantSpec]) -> list[str]:
    """Unknown variants or bad hyperparameters, each named (before any model is loaded)."""
    from attnbench.interface import VariantError

    problems = []
    for spec in specs:
        try:
            variant_class = registry.load(spec.name)
        except VariantError as error:
            problems.append(str(error))
            continue
        problems += [f"{spec.label()}: {p}" for p in variant_class.validate_hyperparams(dict(spec.params))]
    return problems


def swap_layout(config: Any) -> str | None:
    """A hybrid model's layers as the study swaps them (None without sliding-window layers): how many keep a
    window of how many positions, and the global layers a variant goes into."""
    from attnbench.model.layer_kinds import hybrid_layout

    if (layout := hybrid_layout(config)) is None:
        return None
    places = layout.places
    return (f"{layout.sliding} of its {layout.layers} self-attention layers attend through a sliding window of "
            f"{layout.sizes} positions and keep it, exact, in every pass (the model's own attention there); a variant "
            f"goes into its {len(places)} global layer{'s' if len(places) != 1 else ''}"
            + (f" ({', '.join(map(str, places))})" if places else ": none, so no variant changes anything"))


# ---- the study ------------------------------------------------------------------------------------


class KeptOutputs(list):
    """`Routing.outputs` that counts every self-attention call (the routing reads the layer from its length) but
    holds the outputs of the `kept` layers only, None for the others (all of them: (n, h, d) per layer)."""

    def __init__(self, kept: Collection[int] | None = None) -> None:
        super().__init__()
        self.kept = kept  # None: every layer

    def append(self, output: Tensor) -> None:
        super().append(output if self.kept is None or len(self) in self.kept else None)


@dataclass
class Forward:
    """What one forward pass gave: hidden states after each layer (when asked), the final output, the attention
    outputs the routing kept."""

    hidden: list[Tensor]  # (b, n, e) after layer 0, 1, …
    final: Tensor  # the head's input (b, n, e): the logits are its projection; a model without a head: last hidden
    attention: list[Tensor | None]  # (b, n, h, d) of each self-attention call, in layer order (None: not kept)


@dataclass(frozen=True)
class NativeCheck:
    """Exact attention through attnbench against the model's own SDPA attention, at one length: float rounding."""

    seq_len: int
    output_difference: float  # relative, of the final output (logits with an LM head)
    loss: float | None  # through attnbench
    loss_native: float | None  # with the model's own attention
    perplexity_difference: float | None  # |exp(loss - loss_native) - 1|: relative difference of the perplexities

    def worst(self) -> float:
        return max(self.output_difference, self.perplexity_difference or 0.0)


@dataclass(frozen=True)
class HeadCheck:
    """The sliced head and loss against transformers' complete forward pass (its logits, its loss) on a prefix."""

    tokens: int
    logits_difference: float  # relative
    loss: float | None  # sliced, ours
    loss_transformers: float | None  # transformers' own loss
    loss_difference: float | None  # relative

    def worst(self) -> float:
        return max(self.logits_difference, self.loss_difference or 0.0)


class ModelStudy:
    """The exact model and its swapped versions on one token sequence."""

    def __init__(
        self,
        model: nn.Module,
        kind: str,
        ids: Tensor,
        labels: Tensor | None,
        *,
        single_layers: bool = False,
        min_run_time: float | None = None,
    ) -> None:
        """Runs the exact model and the native check; ModelStudyError when its attention cannot be swapped
        faithfully. `single_layers`: also swap one layer at a time; `min_run_time`: time the forward pass in turns
        (seconds per pair; None: no timing)."""
        hf_attention.register()
        self.model, self.kind, self.ids, self.labels = model, kind, ids, labels
        self.single_layers, self.min_run_time = single_layers, min_run_time
        self.causal = is_causal_model(model)
        name = type(model).__name__
        declared = getattr(model.config, "num_hidden_layers", None)
        if isinstance(declared, int) and declared < 1:
            raise ModelStudyError(f"{name} has num_hidden_layers = {declared}: no attention layer to swap")
        self.projection = model.get_output_embeddings() if kind != "base" else None
        if kind != "base" and not isinstance(getattr(self.projection, "weight", None), Tensor):
            raise ModelStudyError(f"{name} has no vocabulary projection (output embeddings) to apply; not supported")
        self.head = None if self.projection is None else head_of(self.projection)
        self.targets = loss_targets(labels, self.causal) if labels is not None and kind != "base" else None
        try:
            self.model.set_attn_implementation(IMPLEMENTATION)
        except Exception as error:  # an architecture that does not take attention implementations
            raise ModelStudyError(f"{name} does not let its attention be swapped ({error}); not supported") from None
        self.exact = self.forward(Routing(outputs=KeptOutputs(None if single_layers else ())), hidden_states=True)
        self.layers = len(self.exact.attention)
        if self.layers == 0:
            raise ModelStudyError(
                f"{name} never called the swapped attention (its attention does not go through transformers' "
                "attention interface): nothing could be measured; not supported"
            )
        self.loss_exact = self.loss(self.exact.final)
        self.swappable = swappable_layers(model.config, self.layers)
        self.native = self.native_check()
        if not self.native.worst() < NATIVE_TOLERANCE:
            raise ModelStudyError(
                f"with exact attention through attnbench, {name}'s output differs from its own by "
                f"{self.native.output_difference:.2g} and its perplexity by "
                f"{self.native.perplexity_difference or 0.0:.2g} (relative): it uses an attention feature the "
                "variants do not model (soft-capping, sink logits): not supported"
            )

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[-1])

    def _arguments(self, ids: Tensor) -> dict[str, Any]:
        """The model's arguments for `ids`: no cache built (nothing is generated)."""
        arguments: dict[str, Any] = {"input_ids": ids}
        if getattr(self.model.config, "use_cache", False):
            arguments["use_cache"] = False
        return arguments

    def forward(self, routing: Routing, *, hidden_states: bool = False, ids: Tensor | None = None) -> Forward:
        """One forward pass with `routing` (the vocabulary projection left out: its input is the final output)."""
        hf_attention.ACTIVE = routing
        routing.outputs.clear()
        arguments = self._arguments(self.ids if ids is None else ids)
        if hidden_states:
            arguments["output_hidden_states"] = True
        capture = head_input(self.projection) if self.projection is not None else nullcontext(CapturedInput())
        with torch.no_grad(), capture as captured:
            output = self.model(**arguments)
        hidden = list(output.hidden_states[1:]) if hidden_states else []
        final = output.last_hidden_state if self.projection is None else captured.value
        if final is None:
            raise ModelStudyError(
                f"{type(self.model).__name__} never called its output embeddings on the hidden states: its logits "
                "cannot be taken a slice at a time; not supported"
            )
        return Forward(hidden, final, list(routing.outputs))

    def loss(self, final: Tensor) -> float | None:
        """The loss on the text (nats per token) of a final output: None without a language-modelling head."""
        return None if self.head is None or self.targets is None else self.head.loss(final, self.targets)

    def compare_final(self, final: Tensor, reference: Tensor) -> tuple[float, float]:
        """Relative error and cosine of a final output against another: their logits where the model has a head."""
        return compare(final, reference) if self.head is None else self.head.compare(final, reference)

    def native_check(self) -> NativeCheck:
        """The exact model through this implementation with `full` against the model's own SDPA attention: the
        final output and the loss, which should differ by float rounding only."""
        self.model.set_attn_implementation("sdpa")
        try:
            native = self.forward(Routing())
        finally:
            self.model.set_attn_implementation(IMPLEMENTATION)
        difference = self.compare_final(self.exact.final, native.final)[0]
        loss_native, perplexity = self.loss(native.final), None
        if self.loss_exact is not None and loss_native is not None:
            perplexity = abs(math.expm1(self.loss_exact - loss_native))
        return NativeCheck(self.seq_len, difference, self.loss_exact, loss_native, perplexity)

    def head_check(self, tokens: int = HEAD_CHECK_TOKENS) -> HeadCheck | None:
        """The sliced head and loss against transformers' complete forward pass, its logits built whole and its own
        loss, on the first `tokens` positions (model's own SDPA attention both ways). None without a head."""
        if self.head is None:
            return None
        m = min(tokens, self.seq_len)
        ids = self.ids[:, :m]
        labels = None if self.labels is None else self.labels[:, :m]
        self.model.set_attn_implementation("sdpa")
        try:
            with torch.no_grad():
                whole = self.model(**self._arguments(ids), labels=labels)
            sliced = self.forward(Routing(), ids=ids)
        finally:
            self.model.set_attn_implementation(IMPLEMENTATION)
        with torch.no_grad():  # float32: float64 copies of (m, v) logits would be the run's largest tensors
            ours = self.projection(sliced.final)
            logits = (torch.linalg.vector_norm(ours - whole.logits) / torch.linalg.vector_norm(whole.logits)).item()
        loss = loss_transformers = difference = None
        if labels is not None:
            loss = self.head.loss(sliced.final, loss_targets(labels, self.causal))
            loss_transformers = float(whole.loss)
            difference = abs(loss - loss_transformers) / max(abs(loss_transformers), 1e-300)
        return HeadCheck(m, logits, loss, loss_transformers, difference)

    def rows(self, spec: VariantSpec) -> list[ModelRow]:
        """The rows of one variant setting at this length: its reason when it cannot run, else every layer
        swapped (each layer's hidden state and the final output), then the single-layer swaps when asked."""
        base = dict(variant=spec.name, label=spec.label(), hparams=json.dumps(dict(spec.params)), seq_len=self.seq_len)
        try:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
        except Exception as error:
            return [ModelRow(**base, swap="all", layer="final", status="error", reason=f"could not build: {error}")]
        n = self.seq_len
        reason = variant.unsupported_reason(
            device=self.ids.device.type, dtype="float32", causal=self.causal, padded=False, n_q=n, n_k=n,
            backward=False,
        )
        if reason is not None:
            return [ModelRow(**base, swap="all", layer="final", status="unsupported", reason=reason)]
        try:
            return self._measure(variant, base)
        except Exception as error:  # one variant's failure is its row; the study goes on
            text = " ".join(f"{type(error).__name__}: {error}".split())
            return [ModelRow(**base, swap="all", layer="final", status="error", reason=text[:300])]

    def _measure(self, variant: Any, base: dict[str, Any]) -> list[ModelRow]:
        rows = []
        swapped = self.forward(Routing(everywhere=variant, outputs=KeptOutputs(())), hidden_states=True)
        if len(swapped.attention) != self.layers:
            raise RuntimeError(f"{len(swapped.attention)} attention calls, the exact model made {self.layers}")
        for layer, (hidden, exact) in enumerate(zip(swapped.hidden, self.exact.hidden)):
            rel, cosine = compare(hidden, exact)
            rows.append(ModelRow(**base, swap="all", layer=str(layer), rel_error=rel, cosine=cosine))
        swapped.hidden.clear()  # (b, n, e) per layer: not held through the rest
        rel, cosine = self.compare_final(swapped.final, self.exact.final)
        final = ModelRow(**base, swap="all", layer="final", rel_error=rel, cosine=cosine)
        loss = self.loss(swapped.final)
        if loss is not None and self.loss_exact is not None:
            final.loss, final.loss_exact, final.loss_change = loss, self.loss_exact, loss - self.loss_exact
            final.perplexity, final.perplexity_exact = math.exp(loss), math.exp(self.loss_exact)
            final.perplexity_ratio = math.exp(final.loss_change)
        del swapped
        if self.min_run_time is not None:
            final.time_exact_s, final.time_s, final.speedup, final.speedup_low, final.speedup_high = self._timing(
                variant, self.min_run_time
            )
        rows.append(final)
        if self.single_layers:
            for layer in self.swappable:
                single = self.forward(Routing(everywhere=variant, only_layer=layer, outputs=KeptOutputs({layer})))
                rel, cosine = compare(single.attention[layer], self.exact.attention[layer])
                rows.append(ModelRow(**base, swap="single", layer=str(layer), rel_error=rel, cosine=cosine))
        return rows

    def _timing(self, variant: Any, min_run_time: float) -> tuple[float, float, float, float, float]:
        """Forward passes of the exact and the swapped model in turns (the vocabulary projection, the same for
        both, left out): medians and the paired speedup."""

        def call(routing: Routing) -> Callable[[], None]:
            def forward() -> None:
                self.forward(routing)

            return forward

        samples = time_in_turns(
            {
                "exact": call(Routing(outputs=KeptOutputs(()))),
                "swapped": call(Routing(everywhere=variant, outputs=KeptOutputs(()))),
            },
            self.ids.device,
            min_rounds=5,
            min_run_time=min_run_time,
        )
        interval = paired_speedup(samples["exact"], samples["swapped"])
        exact, swapped = quantile(samples["exact"], 0.5), quantile(samples["swapped"], 0.5)
        return exact, swapped, interval.estimate, interval.low, interval.high


def swappable_layers(config: Any, layers: int) -> list[int]:
    """The self-attention calls a variant goes into: the global layers of a hybrid model (a sliding-window layer
    keeps its window), every one of the `layers` calls otherwise (an encoder, a decoder without windows)."""
    from attnbench.model.layer_kinds import global_layers, layer_windows

    windows = layer_windows(config)
    if len(windows) != layers or all(w is None for w in windows):
        return list(range(layers))
    return global_layers(config)


def write_rows(path: Path, rows: list[ModelRow]) -> None:
    """model.csv, replaced whole (`attnbench.atomic`): a full disk leaves the previous variants' rows."""
    import csv
    import io
    from dataclasses import asdict

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=MODEL_COLUMNS)
    writer.writeheader()
    writer.writerows(asdict(row) for row in rows)
    write_text_atomic(path, buffer.getvalue())
