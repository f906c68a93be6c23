"""Trained recall (attnbench.recall): the MQAR generator's invariants, the model with every variant that can be a
causal mixer on CPU, a training's bookkeeping, and the two sanity claims at the easy setting (slow): softmax
attention learns to recall, a mixer that sees nothing does not.

b - example, n - position, p - pair
"""

from __future__ import annotations

import pytest
import torch
from attnbench.interface import VariantError
from attnbench.recall import BLIND, IGNORE, MQARTask, TrainSpec, make_attention, multiquery_ar, train_mqar
from attnbench.recall.model import CONV_KERNEL, RecallLM
from attnbench.recall.execute import chance_of
from attnbench.recall.mqar import MQARData
from attnbench.report.mqar import CHANCE_SLACK
from attnbench.registry import BrokenVariantError, Registry

REGISTRY = Registry()
MIXER_OPTIONS = dict(device="cpu", dtype="float32", causal=True, padded=False, n_q=16, n_k=16, backward=True)


def loads(name: str) -> bool:
    """A broken plugin is the registry tests' business, not a mixer to train here."""
    try:
        REGISTRY.load(name)
    except BrokenVariantError:
        return False
    return True


USABLE = [name for name in REGISTRY.names() if loads(name)]
MIXERS = [name for name in USABLE if REGISTRY.create(name).unsupported_reason(**MIXER_OPTIONS) is None]
NOT_MIXERS = [name for name in USABLE if name not in MIXERS]
EASY = dict(seq_len=64, pairs=8)  # the easy setting of the sanity claims


def context_value(data: MQARData, pairs: int) -> torch.Tensor:
    """(m,): for every query, in `data.queries` order, the value that follows its key among the pairs."""
    rows, positions = data.queries.nonzero(as_tuple=True)
    keys = data.inputs[rows, positions]  # (m,)
    context = data.inputs[rows, : 2 * pairs]  # (m, 2p)
    slot = (context[:, 0::2] == keys[:, None]).int().argmax(dim=1)  # (m,) which pair
    return context[torch.arange(len(rows)), 2 * slot + 1]


# ---- the generator -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len, pairs, vocab", [(64, 4, 256), (64, 16, 64), (128, 16, 1024), (33, 8, 18)])
def test_examples_hold_pairs_then_their_queries(seq_len: int, pairs: int, vocab: int) -> None:
    task = MQARTask(seq_len, pairs, vocab)
    data = multiquery_ar(task, 200, seed=0)
    assert data.inputs.shape == data.labels.shape == (200, seq_len)
    assert data.inputs.dtype == data.labels.dtype == torch.int64
    assert int(data.inputs.min()) >= 0 and int(data.inputs.max()) < vocab

    keys, values = data.inputs[:, 0 : 2 * pairs : 2], data.inputs[:, 1 : 2 * pairs : 2]  # (b, p)
    assert all(int(k) in task.keys for k in keys.flatten()) and all(int(v) in task.values for v in values.flatten())
    assert (keys.sort(dim=1).values.diff(dim=1) > 0).all(), "keys repeat within an example"
    assert (values.sort(dim=1).values.diff(dim=1) > 0).all(), "values repeat within an example"

    queries = data.queries
    assert (queries.sum(dim=1) == pairs).all(), "one query per pair"
    assert not queries[:, : 2 * pairs].any(), "a query inside the pairs"
    rows, positions = queries.nonzero(as_tuple=True)
    assert ((positions - 2 * pairs) % 2 == 0).all(), "queries sit at every second position after the pairs"
    assert (data.labels[~queries] == IGNORE).all()
    assert torch.equal(data.labels[rows, positions], context_value(data, pairs)), "a label is not its key's value"
    asked = data.inputs[rows, positions].view(200, pairs).sort(dim=1).values
    assert torch.equal(asked, keys.sort(dim=1).values), "every key is asked once"


@pytest.mark.parametrize("alpha", [0.01, 0.5, 1.0])
def test_gaps_follow_the_power_law(alpha: float) -> None:
    """One pair: its query's gap is drawn from the power law itself (more pairs draw without replacement)."""
    task = MQARTask(seq_len=66, pairs=1, vocab=16, alpha=alpha)  # 32 gap slots
    data = multiquery_ar(task, 20_000, seed=1)
    gaps = (data.queries.int().argmax(dim=1) - 2) // 2
    observed = torch.bincount(gaps, minlength=task.gap_slots).double() / len(gaps)
    expected = task.gap_probabilities()
    assert float((observed - expected).abs().sum()) / 2 < 0.03  # total variation
    x, y = torch.arange(1, task.gap_slots + 1).double().log(), observed.log()  # log-log: a line of slope alpha - 1
    slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
    assert float(slope) == pytest.approx(alpha - 1, abs=0.1)


def test_same_seed_same_examples() -> None:
    task = MQARTask(64, 8, 256)
    first, again, other = (multiquery_ar(task, 50, seed=s) for s in (7, 7, 8))
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.inputs, other.inputs)


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(seq_len=30, pairs=8), "too short for 8 pairs"),
        (dict(seq_len=64, pairs=8, vocab=16), "too small for 8 distinct keys"),
        (dict(pairs=0), "pairs must be at least 1"),
        (dict(alpha=0.0), "alpha must be positive"),
    ],
)
def test_bad_sizes_are_refused_with_what_to_do(sizes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MQARTask(**sizes)


def test_smallest_sizes_are_accepted() -> None:
    multiquery_ar(MQARTask(seq_len=32, pairs=8, vocab=18), 3, seed=0)
    with pytest.raises(ValueError, match="examples must be at least 1"):
        multiquery_ar(MQARTask(), 0, seed=0)


# ---- the model -----------------------------------------------------------------------------------------------


def tiny_model(name: str, heads: int = 2) -> RecallLM:
    torch.manual_seed(0)
    mixers = [make_attention(name, {}, seed=i, seq_len=16, registry=REGISTRY) for i in range(2)]
    return RecallLM(vocab=32, width=16, heads=heads, mixers=mixers)


@pytest.mark.parametrize("name", MIXERS + [BLIND])
def test_model_runs_forward_and_backward_with_each_mixer(name: str) -> None:
    model = tiny_model(name)
    data = multiquery_ar(MQARTask(seq_len=16, pairs=2, vocab=32), 3, seed=0)
    logits = model(data.inputs)
    assert logits.shape == (3, 16, 32)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), data.labels.flatten())
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.blocks[0].mixer.to_qkv.weight.grad.abs().sum() > 0 or name == BLIND


@pytest.mark.parametrize("name", NOT_MIXERS)
def test_a_variant_that_cannot_be_a_causal_mixer_is_refused(name: str) -> None:
    with pytest.raises(VariantError, match=f"variant '{name}' cannot be an MQAR mixer"):
        make_attention(name, {}, seed=0, seq_len=16, registry=REGISTRY)


def test_blind_is_ours_and_takes_no_parameters() -> None:
    assert BLIND not in REGISTRY.names()
    with pytest.raises(VariantError, match="takes no parameters"):
        make_attention(BLIND, {"window": 4}, seed=0, seq_len=16, registry=REGISTRY)


def test_blind_mixer_sees_no_other_position() -> None:
    """Changing the tokens before the convolutions' reach changes nothing at the last position."""
    model = tiny_model(BLIND).eval()
    tokens = torch.randint(32, (1, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, : 16 - 2 * (CONV_KERNEL - 1) - 1] = (changed[0, :9] + 1) % 32
    with torch.no_grad():
        assert torch.equal(model(tokens)[0, -1], model(changed)[0, -1])
    assert not torch.equal(tiny_model("full").eval()(tokens)[0, -1], tiny_model("full").eval()(changed)[0, -1])


def test_state_bytes_is_a_cache_for_softmax_and_constant_for_a_recurrence() -> None:
    def state(name: str, n: int) -> int | None:
        return tiny_model(name, heads=1).state_bytes(n)

    assert state("full", 64) == 2 * state("full", 32) > 0  # keys and values of every position, both layers
    assert state("linear", 64) == state("linear", 32) > 0
    assert state(BLIND, 64) == 0


# ---- a training ----------------------------------------------------------------------------------------------


def test_spec_keeps_params_as_sorted_items_and_checks_the_task() -> None:
    spec = TrainSpec(variant="band", params={"window": 16, "sinks": 0})
    assert spec.params == (("sinks", 0), ("window", 16))
    assert hash(spec) == hash(TrainSpec(variant="band", params=(("window", 16), ("sinks", 0))))
    assert TrainSpec(seq_len=256).batch_examples == 8
    with pytest.raises(ValueError, match="too short"):
        TrainSpec(seq_len=16, pairs=8)


def test_training_reports_and_repeats_from_its_seed() -> None:
    spec = TrainSpec(max_steps=3, warmup_steps=2, test_examples=20, **EASY)
    threads = torch.get_num_threads()
    first, again = train_mqar(spec), train_mqar(spec)
    assert torch.get_num_threads() == threads, "the thread count is restored"
    assert first.steps == 3 and first.queries == 20 * spec.pairs and 0 <= first.accuracy <= 1
    assert first.train_seconds > 0 and first.parameters > 0
    assert first.state_bytes == 2 * 2 * spec.seq_len * spec.d_model * 4  # two layers' keys and values
    assert (first.final_loss, first.accuracy) == (again.final_loss, again.accuracy)


def test_an_unsupported_mixer_fails_before_training() -> None:
    with pytest.raises(VariantError, match="cannot be an MQAR mixer"):
        train_mqar(TrainSpec(variant=NOT_MIXERS[0], max_steps=1))


# ---- the sanity claims (a training each) ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_softmax_attention_learns_to_recall(seed: int) -> None:
    result = train_mqar(TrainSpec(variant="full", seed=seed, **EASY))
    assert result.accuracy >= 0.99, result
    assert result.steps < result.spec.max_steps, "it stopped early, recall reached"


@pytest.mark.slow
def test_a_mixer_that_sees_nothing_stays_near_chance() -> None:
    """Chance is 1 / the number of values; the convolutions add the queries within their reach."""
    spec = TrainSpec(variant=BLIND, **EASY)
    bound = chance_of(spec) + CHANCE_SLACK  # a guess among the values + the queries the convolutions reach
    result = train_mqar(spec)
    assert result.accuracy <= bound, (result.accuracy, bound)
