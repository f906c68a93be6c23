"""The real decoder generating with several methods at once, one per batch row, greedy.

A prompt is prefilled once exactly (`ExactPrompt`) and shared by every method whose prompt is exact; the methods with
their own prefill run one more forward pass over it, batched. Then the rows move together, one token per row per
forward pass, at the same positions: the tokens that follow the prompt for everyone (the question, when it comes
after the compression: kvpress's question-agnostic protocol), then either teacher-forced tokens (a continuation,
scored by its log-likelihood) or greedy ones (an answer). Positions: every token keeps its place in the text
(position ids 0, 1, … as the exact model): a kept key keeps the rotary position it was encoded at, as kvpress does
(StreamingLLM instead renumbers the positions inside its cache; here a window keeps the original ones).

b - batch (methods), n - tokens, v - vocabulary
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.generation.context import layer_contexts
from attnbench.generation.layers import ExactPrompt, Method, MethodRows
from attnbench.generation.repeat_pass import RepeatPrompt, RepeatRouter, repeat_scores
from attnbench.model import attention as hf_attention
from attnbench.model.attention import IMPLEMENTATION
from attnbench.ops import synchronize


@dataclass
class RowResult:
    """What one method did with one prompt."""

    tokens: list[int] = field(default_factory=list)  # greedy tokens, up to and without the stop token
    nll: list[float] = field(default_factory=list)  # teacher-forced: -log p of each forced token
    cache_bytes: int = 0  # what its states hold after the prompt (every layer)
    read_bytes: int = 0  # what its first step reads of them
    final_cache_bytes: int = 0  # what they hold after its last token
    prefill_s: float = 0.0  # its prompt: the shared exact pass and building its states, or its own prefill (batched)
    logits: list[Tensor] = field(default_factory=list)  # with keep_logits: (v,) before each greedy token


PHASES = ("exact prefill", "own prefills", "prompt masses", "repeat pass", "state builds", "question", "steps")
# "prompt masses": H2O's and ObservedAttention's score of the prompt, taken during the exact prefill from its kernel's
# log-sum-exp, but a cost of their rows; "repeat pass": KVzip's pass of the model repeating the prompt (`repeat_pass`), a cost of its rows
LOOP = 16  # a reply whose last LOOP tokens are one token has fallen into a greedy loop: it is cut there


def clock(device: torch.device) -> float:
    """The time once the device's queued work is done (a GPU's kernels run after the call that queues them)."""
    synchronize(device)
    return time.perf_counter()


def looping(tokens: list[int]) -> bool:
    """The reply ends in LOOP copies of one token (e.g. "6666…"): greedy decoding repeats it to the budget, and a
    run of one token cannot bring in a reference string it does not already hold (every built-in answer holds
    fewer than LOOP equal tokens in a row), so stopping changes no score and spares up to ~110 forward passes."""
    return len(tokens) >= LOOP and len(set(tokens[-LOOP:])) == 1


class InModelDecoder:
    """A Hugging Face causal LM whose self-attention goes through attnbench's implementation to a router."""

    def __init__(self, model: nn.Module, stop_ids: set[int],
                 end_ids: set[int] = frozenset(),  # type: ignore[assignment]
                 repeat: RepeatPrompt | None = None) -> None:  # fmt: skip
        """`stop_ids` end an answer once it has begun (a newline); `end_ids` (end of text) end it even before;
        `repeat`: the repeat requests' tokens, for a method scored by a pass repeating the prompt (KVzip)."""
        hf_attention.register()
        model.set_attn_implementation(IMPLEMENTATION)
        self.model, self.stop_ids, self.end_ids, self.repeat = model, stop_ids | end_ids, end_ids, repeat
        self.phases: dict[str, float] = {}  # the last run's seconds per phase

    def forward(self, router: ExactPrompt | MethodRows | RepeatRouter, ids: Tensor, start: int,
                every: bool = False) -> Tensor:  # fmt: skip
        """ids (b, n) at positions start.. -> the last position's logits (b, v) in float32 (`every`: each position's,
        (b, n, v))."""
        hf_attention.ACTIVE = router
        if isinstance(router, MethodRows):
            router.layer = 0
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
        with torch.no_grad():
            out = self.model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=0 if every else 1)
        return out.logits.float() if every else out.logits[:, -1].float()

    def run(
        self,
        methods: list[Method],
        prompt: Tensor,
        *,
        follow: Tensor | None = None,
        new_tokens: int = 0,
        forced: Tensor | None = None,
        keep_logits: bool = False,
        rule: str = "kvpress",
        after_question: Callable[[MethodRows, list[int]], None] | None = None,
        stop_lines: bool = True,
        question_tokens: int = 0,
    ) -> list[RowResult]:
        """Each method through the prompt (n,), then `follow` (t,) for every row, then `forced` (f,) teacher-forced or
        `new_tokens` greedy, under the budget `rule` (`attnbench.generation.kept`): one RowResult per method, in
        order. An answer ends at end of text, or with `stop_lines` at its first newline once it has begun (every
        built-in answer is one line), or when it loops (`looping`). `question_tokens`: how many of the prompt's last
        tokens are the question (question-aware: what a question-aware press reads, `PromptContext.question`). `after_question(rows, order)` is called once every row has taken the question (before the first answer
        token; rows are then dropped from the batch as their answers end). Kept until the next run: `phases`, seconds per
        phase (`PHASES`)."""
        follow = prompt.new_zeros(0) if follow is None else follow
        forced = prompt.new_zeros(0) if forced is None else forced
        room = len(follow) + len(forced) + new_tokens
        order = sorted(range(len(methods)), key=lambda i: not methods[i].shares_exact_prompt)  # shared rows first
        shared = [methods[i] for i in order if methods[i].shares_exact_prompt]
        own = [methods[i] for i in order if not methods[i].shares_exact_prompt]
        rows, logits, prefill_s = MethodRows(shared, room, rule), [], []
        phases = dict.fromkeys(PHASES, 0.0)
        if shared:
            started = clock(prompt.device)
            scored = [m.variant.scores_prompt_mass and m.decodes for m in shared]  # rows scoring the prompt's masses
            everywhere = any(mine and m.layers == "all" for mine, m in zip(scored, shared))  # masses in windows too
            exact = ExactPrompt(with_masses=any(scored), masses_in_windows=everywhere)
            exact_logits = self.forward(exact, prompt[None], 0)
            phases["prompt masses"] = exact.masses_s
            phases["exact prefill"] = clock(prompt.device) - started - exact.masses_s  # one exact pass, shared
            repeats = [m.decodes and getattr(m.variant, "repeat_pass", False) for m in shared]  # KVzip's rows
            pass_scores, started = None, clock(prompt.device)
            if any(repeats):
                if self.repeat is None:
                    raise ValueError("kvzip needs the repeat requests' tokens: InModelDecoder(..., "
                                     "repeat=RepeatPrompt.of(encode)) with the model's tokenizer")  # fmt: skip
                pass_scores = repeat_scores(self.forward, exact, prompt, self.repeat)
            phases["repeat pass"] = clock(prompt.device) - started
            started = clock(prompt.device)
            rows.from_exact(exact, layer_contexts(self.model, len(exact.layers), question_tokens, pass_scores))
            phases["state builds"] = clock(prompt.device) - started
            del exact, pass_scores
            logits.append(exact_logits.expand(len(shared), -1))
            scoring_s = [phases["prompt masses"] * mine + phases["repeat pass"] * again  # H2O's, KVzip's
                          for mine, again in zip(scored, repeats)]  # fmt: skip
            prefill_s += [phases["exact prefill"] + built + paid for built, paid in zip(rows.build_s, scoring_s)]
        if own:
            started, own_rows = clock(prompt.device), MethodRows(own, room, rule)
            logits.append(self.forward(own_rows, prompt[None].expand(len(own), -1), 0))
            phases["own prefills"] = clock(prompt.device) - started
            prefill_s += [phases["own prefills"]] * len(own)
            rows = rows.join(own_rows)
        next_logits = torch.cat(logits)
        results = [RowResult(prefill_s=s) for s in prefill_s]
        for row, result in enumerate(results):
            result.cache_bytes, result.read_bytes = rows.row_bytes(row)
        position = len(prompt)
        started = clock(prompt.device)
        if len(follow):  # one forward pass, the rows that append together, each other row stepping in turn
            next_logits = self.forward(rows, follow[None].expand(len(order), -1), position)
            position += len(follow)
        phases["question"] = clock(prompt.device) - started
        if after_question is not None:
            after_question(rows, order)
        started = clock(prompt.device)
        if len(forced):  # teacher-forced: the tokens are known, so one forward pass takes them all but the last
            logits = next_logits[:, None]
            if len(forced) > 1:
                later = self.forward(rows, forced[None, :-1].expand(len(order), -1), position, every=True)
                logits = torch.cat([logits, later], dim=1)  # (b, f, v): the logits before each forced token
                position += len(forced) - 1
            losses = F.cross_entropy(logits.flatten(0, 1), forced.repeat(len(order)), reduction="none")
            for result, row_losses in zip(results, losses.view(len(order), -1).tolist()):
                result.nll.extend(row_losses)
        alive = list(range(len(order)))  # the rows still answering, in the batch's order
        for index in range(new_tokens):
            chosen = next_logits.argmax(dim=-1)  # (alive,) greedy
            ended = []
            for place, token in enumerate(chosen.tolist()):  # a newline before any other token starts the answer's line
                row = alive[place]
                if token in self.end_ids or (stop_lines and token in self.stop_ids and bool(results[row].tokens)):
                    ended.append(row)
                    continue
                results[row].tokens.append(token)
                if keep_logits:
                    results[row].logits.append(next_logits[place].clone())
                if looping(results[row].tokens):
                    ended.append(row)
            if len(ended) == len(alive) or index == new_tokens - 1:
                break
            if ended:  # finished rows leave the batch: what they hold is what they end with
                for row in ended:
                    results[row].final_cache_bytes = rows.row_bytes(row)[0]
                places = [place for place, row in enumerate(alive) if row not in ended]
                alive = [alive[place] for place in places]
                rows.retain(alive)
                chosen = chosen[torch.tensor(places, device=chosen.device)]
            next_logits = self.forward(rows, chosen[:, None], position)
            position += 1
        phases["steps"] = clock(prompt.device) - started
        for row in alive:
            results[row].final_cache_bytes = rows.row_bytes(row)[0]
        in_order: list[RowResult] = [RowResult()] * len(methods)
        for row, index in enumerate(order):
            in_order[index] = results[row]
        self.phases = phases
        return in_order
