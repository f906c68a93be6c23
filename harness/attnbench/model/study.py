"""`attnbench model`: each variant swapped into a local Hugging Face model, and what it does to the model.

Per variant setting, three views against the exact model (PyTorch SDPA in every layer, through the same
attention implementation, so nothing but the attention differs):
- every self-attention layer swapped: the hidden state after each layer and the final output (logits where
  the model has a language-modelling head), as relative error and cosine similarity; the loss on the text
  and its change (perplexity ratio); the forward pass timed in turns with the exact one (paired speedup);
- one layer swapped at a time: that layer's attention output against the exact one (its input is exact),
  so a reader sees which layers tolerate the variant.
A variant that cannot serve the model (no causal form for a decoder) is a row with its reason. Nothing is
downloaded: the model is read from a local folder, without remote code.

b - batch, n - tokens, h - heads, d - head dim, e - hidden size
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor, nn

from attnbench.atomic import write_text_atomic
from attnbench.measure.timing import time_in_turns
from attnbench.model import attention as hf_attention
from attnbench.model.attention import IMPLEMENTATION, Routing
from attnbench.plan.cells import VariantSpec
from attnbench.registry import registry
from attnbench.stats import paired_speedup, quantile

NATIVE_TOLERANCE = 1e-4  # exact attention through attnbench against the model's own: float rounding only
MASKED_SHARE = 0.15  # masked-LM loss: the share of positions masked (seeded), as in BERT's pre-training


class ModelStudyError(ValueError):
    """The model, the tokens or a variant cannot be used; the message says what to do."""


@dataclass
class ModelRow:
    """One row of model.csv: a variant setting, how it was swapped, and one layer (or the whole model)."""

    variant: str
    label: str
    hparams: str  # JSON
    swap: str  # "all": every self-attention layer swapped; "single": only `layer`
    layer: str  # "0", "1", …, or "final" (the model's output: logits with an LM head, else the last hidden state)
    status: str = "ok"
    reason: str = ""
    rel_error: float | None = None  # ||X - X*|| / ||X*||: hidden state (all), attention output (single), output
    cosine: float | None = None  # mean over tokens of cos(X_i, X*_i)
    loss: float | None = None  # final rows of a model with an LM head: the loss on the text with the variant
    loss_exact: float | None = None
    loss_change: float | None = None  # loss - loss_exact (nats per token)
    perplexity_ratio: float | None = None  # exp(loss_change)
    time_s: float | None = None  # final rows: median forward time with the variant (in turns with the exact model)
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
    """(input ids, labels) for a masked-LM loss: MASKED_SHARE of the positions masked, labels elsewhere -100."""
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


# ---- the study ------------------------------------------------------------------------------------


@dataclass
class Forward:
    """What one forward pass gave: hidden states after each layer, the output, the loss, attention outputs."""

    hidden: list[Tensor]  # (b, n, e) after layer 0, 1, …
    final: Tensor  # logits (b, n, vocab) with an LM head, else the last hidden state
    loss: float | None
    attention: list[Tensor]  # (b, n, h, d) of each self-attention call, in layer order


class ModelStudy:
    """The exact model and its swapped versions on one token sequence."""

    def __init__(self, model: nn.Module, kind: str, ids: Tensor, labels: Tensor | None) -> None:
        """Runs the exact model; ModelStudyError when its attention cannot be swapped faithfully."""
        hf_attention.register()
        self.model, self.kind, self.ids, self.labels = model, kind, ids, labels
        self.causal = is_causal_model(model)
        name = type(model).__name__
        declared = getattr(model.config, "num_hidden_layers", None)
        if isinstance(declared, int) and declared < 1:
            raise ModelStudyError(f"{name} has num_hidden_layers = {declared}: no attention layer to swap")
        try:
            self.model.set_attn_implementation(IMPLEMENTATION)
        except Exception as error:  # an architecture that does not take attention implementations
            raise ModelStudyError(f"{name} does not let its attention be swapped ({error}); not supported") from None
        self.exact = self.forward(Routing())
        self.layers = len(self.exact.attention)
        if self.layers == 0:
            raise ModelStudyError(
                f"{name} never called the swapped attention (its attention does not go through transformers' "
                "attention interface): nothing could be measured; not supported"
            )
        self.native_difference = self.native_check()
        if not self.native_difference < NATIVE_TOLERANCE:
            raise ModelStudyError(
                f"with exact attention through attnbench, {name}'s output differs from its own by "
                f"{self.native_difference:.2g} (relative): it uses an attention feature the variants do not model "
                "(a sliding window, soft-capping, sink logits): not supported"
            )

    def forward(self, routing: Routing) -> Forward:
        hf_attention.ACTIVE = routing
        routing.outputs.clear()
        arguments: dict[str, Any] = {"input_ids": self.ids, "output_hidden_states": True}
        if self.kind != "base" and self.labels is not None:
            arguments["labels"] = self.labels
        if getattr(self.model.config, "use_cache", False):
            arguments["use_cache"] = False
        with torch.no_grad():
            output = self.model(**arguments)
        hidden = list(output.hidden_states[1:])
        final = output.logits if self.kind != "base" else hidden[-1]
        loss = float(output.loss) if getattr(output, "loss", None) is not None else None
        return Forward(hidden, final, loss, list(routing.outputs))

    def native_check(self) -> float:
        """Relative error of the final output through this implementation with exact `full` against the
        model's own SDPA attention: should be float rounding."""
        self.model.set_attn_implementation("sdpa")
        try:
            with torch.no_grad():
                output = self.model(input_ids=self.ids, output_hidden_states=True)
            native = output.logits if self.kind != "base" else output.hidden_states[-1]
        finally:
            self.model.set_attn_implementation(IMPLEMENTATION)
        return compare(self.exact.final, native)[0]

    def rows(self, spec: VariantSpec, *, min_run_time: float) -> list[ModelRow]:
        base = dict(variant=spec.name, label=spec.label(), hparams=json.dumps(dict(spec.params)))
        try:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
        except Exception as error:
            return [ModelRow(**base, swap="all", layer="final", status="error", reason=f"could not build: {error}")]
        n = self.ids.shape[-1]
        reason = variant.unsupported_reason(
            device="cpu", dtype="float32", causal=self.causal, padded=False, n_q=n, n_k=n, backward=False
        )
        if reason is not None:
            return [ModelRow(**base, swap="all", layer="final", status="unsupported", reason=reason)]
        try:
            return self._measure(variant, base, min_run_time)
        except Exception as error:  # one variant's failure is its row; the study goes on
            text = " ".join(f"{type(error).__name__}: {error}".split())
            return [ModelRow(**base, swap="all", layer="final", status="error", reason=text[:300])]

    def _measure(self, variant: Any, base: dict[str, str], min_run_time: float) -> list[ModelRow]:
        rows = []
        swapped = self.forward(Routing(everywhere=variant))
        if len(swapped.attention) != self.layers:
            raise RuntimeError(f"{len(swapped.attention)} attention calls, the exact model made {self.layers}")
        for layer, (hidden, exact) in enumerate(zip(swapped.hidden, self.exact.hidden)):
            rel, cosine = compare(hidden, exact)
            rows.append(ModelRow(**base, swap="all", layer=str(layer), rel_error=rel, cosine=cosine))
        rel, cosine = compare(swapped.final, self.exact.final)
        final = ModelRow(**base, swap="all", layer="final", rel_error=rel, cosine=cosine)
        if swapped.loss is not None and self.exact.loss is not None:
            change = swapped.loss - self.exact.loss
            final.loss, final.loss_exact, final.loss_change = swapped.loss, self.exact.loss, change
            final.perplexity_ratio = math.exp(change)
        final.time_exact_s, final.time_s, final.speedup, final.speedup_low, final.speedup_high = self._timing(
            variant, min_run_time
        )
        rows.append(final)
        for layer in range(self.layers):
            single = self.forward(Routing(everywhere=variant, only_layer=layer))
            rel, cosine = compare(single.attention[layer], self.exact.attention[layer])
            rows.append(ModelRow(**base, swap="single", layer=str(layer), rel_error=rel, cosine=cosine))
        return rows

    def _timing(self, variant: Any, min_run_time: float) -> tuple[float, float, float, float, float]:
        """Forward passes of the exact and the swapped model in turns: medians and the paired speedup."""
        exact_routing, swapped_routing = Routing(), Routing(everywhere=variant)

        def call(routing: Routing) -> Callable[[], None]:
            def forward() -> None:
                hf_attention.ACTIVE = routing
                routing.outputs.clear()
                with torch.no_grad():
                    self.model(input_ids=self.ids, **({"use_cache": False} if self.causal else {}))

            return forward

        samples = time_in_turns(
            {"exact": call(exact_routing), "swapped": call(swapped_routing)},
            torch.device("cpu"),
            min_rounds=5,
            min_run_time=min_run_time,
        )
        interval = paired_speedup(samples["exact"], samples["swapped"])
        exact, swapped = quantile(samples["exact"], 0.5), quantile(samples["swapped"], 0.5)
        return exact, swapped, interval.estimate, interval.low, interval.high


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
