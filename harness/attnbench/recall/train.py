"""Train the MQAR model with one mixer on CPU and score its recall on held-out examples.

Every step draws a fresh batch from a seeded stream (the same spec gives the same batches), so the model cannot
memorise examples: it must learn to recall. AdamW, warm-up then a constant rate, a cosine decay over the last part
(`learning_rate_factor`). Training stops early once the last `stop_window` batches were recalled at `stop_accuracy`
on average (each scored before its update); a training that never gets there runs `max_steps`. The test set is drawn
from another seed than the training stream.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from attnbench.recall.model import RecallLM, make_attention
from attnbench.recall.mqar import MQARData, MQARTask, multiquery_ar
from attnbench.registry import Registry
from torch import Tensor


BATCH_TOKENS = 2048  # tokens per batch when `batch` is not given: 32 examples at N = 64, 8 at N = 256
VOCAB_PER_POSITION = 4  # the vocabulary when `vocab` is not given: 4 N (256 at N = 64, 1024 at N = 256)
# the best of 3e-3, 5e-3 and 1e-2 at N = 64, P = 4 (seed 0, 800 steps): 5e-3 for softmax and the delta rule
# (gated-deltanet 98% at 5e-3, 90% at 1e-2); 1e-2 for the mixers without it (linear 87% at 1e-2, 57% at 5e-3;
# retnet 58% and 23%; gla 66% and 23%)
DEFAULT_LR = 5e-3
VARIANT_LR = {"linear": 1e-2, "retnet": 1e-2, "gla": 1e-2}


@dataclass(frozen=True)
class TrainSpec:
    """One training: the mixer, the task, the model and the optimiser; `params` the variant's hyperparameters (a
    dict is kept as sorted items, so a spec is hashable). The fields left None are derived from the others:

    - `vocab`: VOCAB_PER_POSITION * seq_len. A filler token repeats a query's key before the query (a distractor) for
      about 4% of the queries at any N (Zoology keeps vocab > N; its 8192 leaves fewer distractors, but on CPU every
      token's embedding must learn whether it is a key or a value, and at 4 x the tokens the recurrent mixers learned
      far less often within the step budget: deltanet at N = 64, P = 4 recalled 18%, 18%, 94% on seeds 0-2 with
      vocab 1024, over 95% on each with 256);
    - `batch`: BATCH_TOKENS // seq_len examples, so a step costs about the same at every N;
    - `lr`: the variant's in VARIANT_LR, else DEFAULT_LR."""

    variant: str = "full"
    params: tuple[tuple[str, Any], ...] | Mapping[str, Any] = ()
    seq_len: int = 64
    pairs: int = 4
    vocab: int | None = None
    alpha: float = 0.01
    d_model: int = 64
    heads: int = 1
    layers: int = 2
    mlp_ratio: int = 2
    seed: int = 0
    max_steps: int = 800
    batch: int | None = None
    lr: float | None = None
    weight_decay: float = 0.1
    warmup_steps: int = 50
    decay_fraction: float = 0.2
    test_examples: int = 1000
    stop_accuracy: float = 0.995
    stop_window: int = 20
    threads: int = 1

    def __post_init__(self) -> None:
        params = self.params.items() if isinstance(self.params, Mapping) else self.params
        object.__setattr__(self, "params", tuple(sorted(params)))
        self.task  # checks the task's sizes now

    @property
    def task(self) -> MQARTask:
        return MQARTask(self.seq_len, self.pairs, self.vocab_size, self.alpha)

    @property
    def vocab_size(self) -> int:
        return self.vocab if self.vocab is not None else VOCAB_PER_POSITION * self.seq_len

    @property
    def batch_examples(self) -> int:
        return self.batch if self.batch is not None else max(1, BATCH_TOKENS // self.seq_len)

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else VARIANT_LR.get(self.variant, DEFAULT_LR)


@dataclass(frozen=True)
class TrainResult:
    """What one training gave: recall on the test set, and what it cost."""

    spec: TrainSpec
    accuracy: float  # fraction of the test queries whose value was the top prediction
    queries: int  # test queries scored
    train_seconds: float  # wall time of the training steps only (model building and test not included)
    steps: int  # optimiser steps taken (fewer than max_steps when stopped early)
    final_loss: float  # the last training batch's loss (nan: the training diverged and stopped)
    parameters: int
    state_bytes: int | None  # what the mixers keep to decode a length-N prompt (RecallLM.state_bytes)
    train_accuracy: float = math.nan  # mean recall over the last stop_window training batches


def build_model(spec: TrainSpec, registry: Registry | None = None) -> RecallLM:
    """The model for `spec`, its weights from torch's global seed; layer i's mixer built with seed spec.seed + i
    (a variant's seeded projections differ between layers)."""
    registry = registry or Registry()
    params = dict(spec.params)
    mixers = [make_attention(spec.variant, params, spec.seed + i, spec.seq_len, registry) for i in range(spec.layers)]
    return RecallLM(spec.vocab_size, spec.d_model, spec.heads, mixers, spec.mlp_ratio)


def learning_rate_factor(step: int, spec: TrainSpec) -> float:
    """Warm-up, stable, decay: linear warm-up over warmup_steps, constant until the last decay_fraction of max_steps,
    then a cosine to zero. A constant rate escapes the loss plateau before recall sooner than one decaying from the
    start, and a training that reaches recall stops early, inside the stable part."""
    if step < spec.warmup_steps:
        return (step + 1) / spec.warmup_steps
    decay_steps = max(1, round(spec.decay_fraction * spec.max_steps))
    progress = (step - (spec.max_steps - decay_steps)) / decay_steps
    return 0.5 * (1 + math.cos(math.pi * min(1.0, max(0.0, progress))))


def recall_loss(model: RecallLM, data: MQARData) -> tuple[Tensor, Tensor]:
    """The mean cross-entropy at the query positions and the number of queries recalled exactly."""
    queries = data.queries  # (b, n)
    logits = model.logits_at(data.inputs, queries)  # (m, vocab)
    targets = data.labels[queries]  # (m,)
    return F.cross_entropy(logits, targets), (logits.argmax(-1) == targets).sum()


@torch.no_grad()
def evaluate(model: RecallLM, data: MQARData, batch: int) -> int:
    """How many of `data`'s queries the model recalls exactly, `batch` examples at a time."""
    model.eval()
    correct = 0
    for start in range(0, data.inputs.shape[0], batch):
        part = MQARData(data.inputs[start : start + batch], data.labels[start : start + batch])
        correct += int(recall_loss(model, part)[1])
    return correct


def train_mqar(spec: TrainSpec, registry: Registry | None = None) -> TrainResult:
    """Train on spec.threads CPU threads (restored afterwards) and score on spec.test_examples held-out examples."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        return _train(spec, registry)
    finally:
        torch.set_num_threads(previous_threads)


def _train(spec: TrainSpec, registry: Registry | None) -> TrainResult:
    torch.manual_seed(spec.seed)
    model = build_model(spec, registry)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=spec.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(step, spec))
    stream = torch.Generator().manual_seed(2 * spec.seed)  # training batches; the test set uses 2 * seed + 1
    recent: deque[float] = deque(maxlen=spec.stop_window)  # recall of the last batches
    loss, steps = torch.tensor(math.nan), 0

    started = time.perf_counter()
    model.train()
    while steps < spec.max_steps:
        data = spec.task.sample(spec.batch_examples, stream)
        loss, correct = recall_loss(model, data)
        if not torch.isfinite(loss):
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        steps += 1
        recent.append(int(correct) / (spec.batch_examples * spec.pairs))
        if len(recent) == spec.stop_window and sum(recent) / len(recent) >= spec.stop_accuracy:
            break
    train_seconds = time.perf_counter() - started

    test = multiquery_ar(spec.task, spec.test_examples, seed=2 * spec.seed + 1)
    queries = int(test.queries.sum())
    return TrainResult(
        spec=spec,
        accuracy=evaluate(model, test, spec.batch_examples) / queries,
        queries=queries,
        train_seconds=train_seconds,
        steps=steps,
        final_loss=float(loss.detach()),
        parameters=sum(p.numel() for p in model.parameters()),
        state_bytes=model.state_bytes(spec.seq_len),
        train_accuracy=sum(recent) / len(recent) if recent else math.nan,
    )
