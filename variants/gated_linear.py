"""The linear attentions models are trained with today: RetNet, GLA, DeltaNet and Gated DeltaNet.

Each is a recurrence over a state of d x e per head (`gated_kernels.py`): chunkwise for the full-sequence call and
the prompt, recurrent for each generated token. They are different operators from softmax attention, not
approximations of it (`approximates_softmax = False`): their error columns show how far they are from softmax, and
the verdict never recommends them on that error.

- `retnet` (Sun et al. 2023): a fixed decay per head, gamma_h = 1 - 2^(-5-h), as the paper (and fla's
  `naive_retention`); no normalization.
- `gla` (Yang et al. 2024): a decay per key dimension, alpha_t = sigmoid(k_t W1 W2)^(1/tau), low-rank (d -> 16 -> d)
  with tau = 16, as the paper's gate.
- `deltanet` (Schlag et al. 2021; Yang et al. 2024): the delta rule on L2-normalised q and k, writing strength
  beta_t = sigmoid(k_t . w).
- `gated-deltanet` (Yang et al. 2025): the delta rule with a scalar decay alpha_t = sigmoid(k_t . w_a)^(1/tau) and
  beta_t as DeltaNet's. The decay's form is GLA's (tau = 16), not the paper's Mamba2-style exp(-A softplus(.)): what
  matters to the kernel is a scalar log decay per position and head, which either gives.

The published layers compute gates and beta from the token's hidden state through trained projections. Here they
come from the token's key through seeded random projections (each matrix's entries N(0, 1 / its rows), drawn in turn
from the variant's seed): the kernels and their cost are the published ones, the gate values are not a trained
model's. The kernels take gates explicitly, for a plugin with its
own. Causal only (they are recurrences). A padded position neither writes to the state nor decays it.

b - batch, h - heads, n - position, d - head dim, e - value dim
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar

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
    kept_on_instance,
)
from attnbench.kernels import usable
from attnbench.kernels.recurrent_steps import delta_step, gated_linear_step
from attnbench.variants.decoding import RecurrentState
from attnbench.variants.gated_kernels import (
    gated_delta_chunkwise,
    gated_delta_recurrent,
    gated_linear_chunkwise,
    gated_linear_recurrent,
    strong_chunk_bytes,
)
from attnbench.variants.recurrent_forms import accumulation_dtype
from torch import Tensor

CHUNK = Hyperparameter(64, "positions per chunk of the chunkwise form (parallel inside, a state carried across)", minimum=1)
NORMALIZER = Hyperparameter(16.0, "tau: the gate is sigmoid(.)^(1/tau); larger keeps more of the past", float, minimum=1)
CAUSAL_ONLY = Capabilities(
    cross_attention=False,
    subquadratic_memory=True,
    notes={"cross_attention": "a recurrence over one sequence: Nq == Nk"},
)


class GatedRecurrence(AttentionVariant):
    """What the four share: causal only; a chunkwise forward and a recurrent step over one state (b, h, d, e); the
    gates of one call from the keys (`gates`), zeroed at padding. Subclasses give `gates` and say which operator
    (`delta_rule`)."""

    family = "gated-linear"
    exact = False
    approximates_softmax = False
    supports = CAUSAL_ONLY
    hyperparameters: ClassVar[dict[str, Hyperparameter]] = {"chunk_size": CHUNK}
    delta_rule: ClassVar[bool] = False  # the delta rule (beta, a scalar g) rather than gated linear (gk)

    @kept_on_instance
    def projections(self, shapes: tuple[tuple[int, int], ...], device: torch.device, dtype: torch.dtype) -> list[Tensor]:
        """Seeded matrices of these (rows, columns), entries N(0, 1 / rows), drawn in turn from one generator seeded
        with the variant's seed: the same for every call at these sizes."""
        generator = torch.Generator().manual_seed(self.seed)
        drawn = [torch.randn(r, c, generator=generator, dtype=torch.float64) * r**-0.5 for r, c in shapes]
        return [weights.to(device, dtype) for weights in drawn]

    def unsupported_reason(self, **options: Any) -> str | None:
        if not options.get("causal") and not options.get("decode"):
            return f"{self.name} is causal only: a recurrence over the positions so far"
        return super().unsupported_reason(**options)

    def gates(self, k: Tensor) -> dict[str, Tensor | None]:
        """The kernel's gates for keys k (b, h, n, d), in float32 or wider: {"gk": (b, h, n, d | 1)} (gated linear)
        or {"beta": (b, h, n), "g": (b, h, n) or None} (the delta rule)."""
        raise NotImplementedError

    def _inputs(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> tuple[Tensor, ...]:
        gates = self.gates(k)
        if key_padding_mask is not None:  # padding writes nothing (k, v, beta 0) and decays nothing (gates 0)
            padded = key_padding_mask[:, None, :]  # (b, 1, n)
            k, v = k.masked_fill(padded[..., None], 0.0), v.masked_fill(padded[..., None], 0.0)
            gates = {
                name: None if g is None else g.masked_fill(padded if g.dim() == 3 else padded[..., None], 0.0)
                for name, g in gates.items()
            }
        return q, k, v, gates

    def _run(self, chunkwise: bool, q: Tensor, k: Tensor, v: Tensor, gates: dict, **options: Any) -> tuple:
        if self.delta_rule:
            kernel: Callable[..., tuple] = gated_delta_chunkwise if chunkwise else gated_delta_recurrent
            return kernel(q, k, v, gates["beta"], gates["g"], l2_normalize_qk=True, **options)
        kernel = gated_linear_chunkwise if chunkwise else gated_linear_recurrent
        return kernel(q, k, v, gates["gk"], **options)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool, key_padding_mask: Tensor | None) -> Tensor:
        q, k, v, gates = self._inputs(q, k, v, key_padding_mask)
        return self._run(True, q, k, v, gates, chunk_size=self.chunk_size)[0]

    def prefill(self, q: Tensor, k: Tensor, v: Tensor, *, room: int = 0) -> tuple[Tensor, DecodeState]:
        """The chunkwise forward over the prompt and its final state (b, h, d, e): constant in N."""
        q_, k_, v_, gates = self._inputs(q, k, v, None)
        out, state = self._run(True, q_, k_, v_, gates, chunk_size=self.chunk_size, output_final_state=True)
        return out, RecurrentState(state, k.shape[-2])

    def step(self, state: DecodeState, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, DecodeState]:
        """One token through the recurrent form, from the state so far. Fused (float32 on the CPU, one token): the
        state updated in place by one C call (`fused_step`). Eager: the recurrent kernel, a new state."""
        if not isinstance(state, RecurrentState):
            raise UnsupportedOptionError(f"{self.name} cannot step from a {type(state).__name__}")
        tokens = k.shape[-2]  # one, as the protocol steps; several work too (eager)
        if tokens == 1 and usable(q, k, v, state.state):
            out = self.fused_step(state.state, q, k, v)
        else:
            q, k, v, gates = self._inputs(q, k, v, None)
            out, state.state = self._run(False, q, k, v, gates, initial_state=state.state, output_final_state=True)
        state.length += tokens
        return out, state

    def fused_step(self, state: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """One token q, k (b, h, 1, d), v (b, h, 1, e) through the operator's C step, the state (b, h, d, e) float32
        updated in place -> (b, h, 1, e): the gates from `gates` (torch ops), handed to the kernel. A subclass whose
        gates the kernel computes itself from k (GLA's, the delta rule's projections) overrides it: one call."""
        gates = {name: None if g is None else g.float() for name, g in self.gates(k).items()}
        scale = q.shape[-1] ** -0.5
        if self.delta_rule:
            return delta_step(q, k, v, state, scale=scale, beta=gates["beta"], g=gates["g"])
        return gated_linear_step(q, k, v, state, scale=scale, gk=gates["gk"])

    def gate_matmul_flops(self, n: int, head_dim: int) -> float:
        """The matmul FLOPs of the gates' seeded projection of n keys, per batch and head (0: none)."""
        return 0

    def cost(self, shape: Shape) -> Cost:
        gates = self.gate_matmul_flops(shape.n_k, shape.head_dim)
        return recurrence_cost(shape, self.chunk_size, delta_rule=self.delta_rule, gate_matmul=gates)


def _decay_gate(logits: Tensor, normalizer: float) -> Tensor:
    """log(sigmoid(x)^(1/tau)): a log decay in (-inf, 0)."""
    return F.logsigmoid(logits).div_(normalizer)  # in place: a fresh tensor, and division saves nothing


class RetNet(GatedRecurrence):
    """Retention: a fixed decay gamma_h = 1 - 2^(-5-h) per head (head h of the call)."""

    name = "retnet"

    @kept_on_instance
    def log_decays(self, heads: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """log gamma_h for heads 0..h-1: (1, h, 1, 1), computed once (a decode step then costs no op for its gate)."""
        log_gamma = torch.log1p(-torch.exp2(-5.0 - torch.arange(heads, device=device, dtype=dtype)))  # (h,)
        return log_gamma[None, :, None, None]

    def gates(self, k: Tensor) -> dict[str, Tensor | None]:
        log_gamma = self.log_decays(k.shape[1], k.device, accumulation_dtype(k.dtype))
        return {"gk": log_gamma.expand(k.shape[0], -1, k.shape[2], 1)}

    def fused_step(self, state: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The kept decays handed to the kernel as they are, (1, h, 1, 1): one call."""
        gk = self.log_decays(k.shape[1], k.device, k.dtype)
        return gated_linear_step(q, k, v, state, scale=k.shape[-1] ** -0.5, gk=gk)


GATE_RANK = 16  # GLA's gate projection is low-rank: d -> 16 -> d (the paper's)


class GLA(GatedRecurrence):
    """Gated linear attention: a decay per key dimension from the key, sigmoid(k W1 W2)^(1/tau), W1 (d, 16) and
    W2 (16, d) as the paper's low-rank gate."""

    name = "gla"
    hyperparameters = {"chunk_size": CHUNK, "gate_normalizer": NORMALIZER}

    def gates(self, k: Tensor) -> dict[str, Tensor | None]:
        work = accumulation_dtype(k.dtype)
        d = k.shape[-1]
        down, up = self.projections(((d, GATE_RANK), (GATE_RANK, d)), k.device, work)
        logits = (k.to(work) @ down) @ up  # (b, h, n, 16), then (b, h, n, d)
        return {"gk": _decay_gate(logits, self.gate_normalizer)}

    def fused_step(self, state: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The gate's low-rank projection and log sigmoid inside the kernel: one call."""
        d = k.shape[-1]
        low_rank = self.projections(((d, GATE_RANK), (GATE_RANK, d)), k.device, k.dtype)
        return gated_linear_step(q, k, v, state, scale=d**-0.5, low_rank=tuple(low_rank),
                                 normalizer=self.gate_normalizer)  # fmt: skip

    def gate_matmul_flops(self, n: int, head_dim: int) -> float:
        return 2 * n * GATE_RANK * 2 * head_dim

    def cost(self, shape: Shape) -> Cost:
        """Gated linear attention's, and room for chunks whose decays run past float range (gates strong enough:
        `gate_normalizer` near 1, long chunks), worked a few at a time: what the guard must allow for, whether or not
        a call's gates take that path."""
        base = super().cost(shape)
        strong = strong_chunk_bytes(min(self.chunk_size, max(shape.n_q, 1)), shape.head_dim, max(shape.dtype_bytes, 4))
        return replace(base, working_bytes=base.working_bytes + strong)


class DeltaNet(GatedRecurrence):
    """The delta rule on L2-normalised q and k, writing strength beta = sigmoid(k . w)."""

    name = "deltanet"
    delta_rule = True
    decayed: ClassVar[bool] = False  # a scalar decay of the state each step (Gated DeltaNet)

    def gates(self, k: Tensor) -> dict[str, Tensor | None]:
        work = accumulation_dtype(k.dtype)
        (weights,) = self.projections(((k.shape[-1], 2),), k.device, work)
        logits = k.to(work) @ weights  # (b, h, n, 2): beta's, then the decay's
        beta = torch.sigmoid(logits[..., 0])
        g = _decay_gate(logits[..., 1], self.gate_normalizer) if self.decayed else None
        return {"beta": beta, "g": g}  # q and k are L2-normalised in the kernel

    def fused_step(self, state: Tensor, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """beta and the decay from k's projection inside the kernel: one call."""
        d = k.shape[-1]
        (weights,) = self.projections(((d, 2),), k.device, k.dtype)
        normalizer = self.gate_normalizer if self.decayed else 1.0
        return delta_step(q, k, v, state, scale=d**-0.5, weights=weights, decayed=self.decayed, normalizer=normalizer)

    def gate_matmul_flops(self, n: int, head_dim: int) -> float:
        return 2 * n * head_dim * 2  # beta's and the decay's columns


class GatedDeltaNet(DeltaNet):
    """The delta rule with a scalar decay alpha = sigmoid(k . w_a)^(1/tau) and DeltaNet's beta."""

    name = "gated-deltanet"
    decayed = True
    hyperparameters = {"chunk_size": CHUNK, "gate_normalizer": NORMALIZER}


def recurrence_cost(shape: Shape, chunk: int, *, delta_rule: bool, gate_matmul: float = 0) -> Cost:
    """The chunkwise forward's work (gated_kernels.py), over the sequence padded to whole chunks, per batch and head:
    gated linear: the pair scores q k^T, their product with v, each chunk's write to the state and each position's
    read of the state before its chunk; the delta rule: k k^T, the triangular solve (C^2 (d + e) per chunk), q k^T,
    and per chunk W S, (Q e^b) S, scores U and the state's update. `gate_matmul`: the gates' projection, per batch
    and head."""
    s = shape
    bh, d, e = s.batch * s.heads, s.head_dim, s.value_dim
    chunk = max(1, min(chunk, s.n_q))  # the kernels cut a chunk longer than the sequence to its length
    padded = -(-s.n_q // chunk) * chunk
    chunks = padded // chunk
    accumulate = max(s.dtype_bytes, 4)
    if delta_rule:
        matmul = padded * (4 * chunk * d + 2 * chunk * e + 6 * d * e)  # k k^T, q k^T, scores U; W S, (Q e^b) S, K^T U
        solve = padded * chunk * (d + e)
        other = padded * (3 * chunk + 4 * (d + e)) + chunks * 2 * d * e  # decay matrices, scaling; state decay
        held = padded * (2 * chunk + 3 * (d + e)) + chunks * d * e  # k k^T and scores; chunked copies; the state
    else:
        matmul = 2 * padded * (chunk * d + chunk * e + 2 * d * e)  # q k^T, scores v; writes, reads of the state
        solve = 0
        other = padded * (2 * chunk + 6 * d) + chunks * 2 * d * e  # decay pairs; e^b, e^-b scaling; state decay
        held = padded * (chunk + 3 * d + 2 * e) + 2 * chunks * d * e  # scores; chunked q k v, decays; states
    io = bh * (2 * s.n_q * d + s.n_k * e + s.n_q * e) * s.dtype_bytes
    return Cost(
        flops=bh * (gate_matmul + matmul + solve + other),
        bytes_moved=io,
        working_bytes=bh * held * accumulate,
        matmul_flops=bh * (gate_matmul + matmul),
    )
