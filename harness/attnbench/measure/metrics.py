"""Error of a variant's output against exact softmax attention, in numbers a reader can interpret.

b - batch, h - heads, i - query position, e - value dim
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from attnbench.inputs.catalogue import Inputs
from attnbench.inputs.needles import needle_hits
from attnbench.measure.reference import Reference


@dataclass(frozen=True)
class ErrorMetrics:
    """How far an output O is from the exact output O*.

    rel_fro:    ||O - O*||_F / ||O*||_F. Misleading alone when O* is near zero (flat attention).
    max_abs:    max |O - O*| over all entries.
    row_cosine: mean over query rows of cos(O_i, O*_i); 1 is perfect.
    vs_uniform: ||O - O*||_F / ||U - O*||_F, U = uniform average of V over each query's visible keys.
                0 is exact, 1 is no better than ignoring Q and K altogether; readable on its own.
    """

    rel_fro: float
    max_abs: float
    row_cosine: float
    vs_uniform: float

    def as_row(self) -> dict[str, float]:
        return {f"err_{key}": value for key, value in asdict(self).items()}


def error_metrics(output: Tensor, reference: Reference) -> ErrorMetrics:
    """Compare `output` (b, h, i, e) with the float64 reference; computed in float64."""
    out = output.detach().to(torch.float64)
    exact = reference.output
    diff = out - exact
    diff_norm = torch.linalg.vector_norm(diff).item()
    cosine = torch.nn.functional.cosine_similarity(out, exact, dim=-1, eps=1e-30)  # (b, h, i)
    return ErrorMetrics(
        rel_fro=diff_norm / max(torch.linalg.vector_norm(exact).item(), 1e-300),
        max_abs=diff.abs().max().item(),
        row_cosine=cosine.mean().item(),
        vs_uniform=diff_norm / max(torch.linalg.vector_norm(reference.uniform - exact).item(), 1e-300),
    )


def needle_fields(output: Tensor, inputs: Inputs, *, causal: bool, first_position: int = 0) -> dict[str, float | int]:
    """A row's recall columns on a `needles` input: the pairs planted, the probes (b * h * pairs: each head's query
    of each pair) and the share whose output is nearest, by cosine, to its planted value. {} for other inputs."""
    if inputs.needles is None:
        return {}
    hits = needle_hits(
        output.detach(),
        inputs.v,
        inputs.needles,
        causal=causal,
        key_padding_mask=inputs.key_padding_mask,
        first_position=first_position,
    )  # (b, h, p)
    return {
        "needle_pairs": inputs.needles.pairs,
        "needle_probes": hits.numel(),
        "needle_accuracy": hits.double().mean().item(),
    }
