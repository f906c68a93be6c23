"""What a task hands the decoder: a `Sample` (token ids, the answers a reply must hold, how it is scored and how many
tokens it may take), and the error a task raises when it cannot be built or read."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnbench.generation.scoring import STRING_MATCH_ALL

Encode = Callable[[str], list[int]]  # text -> token ids, without special tokens
MAX_ANSWER_TOKENS = 128  # the largest answer budget: RULER's largest tokens_to_generate (niah)


class TaskError(ValueError):
    """A task cannot be built or read; the message says what to fix."""


@dataclass(frozen=True)
class Sample:
    """One prompt of a task: the context (what is compressed), the question after it (ending with the answer's
    prefix, which the model completes), the answers a correct reply contains and the metric that scores them
    (`scoring.score`), the answer's budget in tokens, or the tokens of a continuation; ids are the tokenizer's."""

    task: str
    index: int
    context: list[int]
    question: list[int]
    answers: tuple[str, ...] = ()
    continuation: tuple[int, ...] = ()
    depth: float | None = None  # where the asked needle lies, 0..1 (None: a task without one)
    answer_tokens: int = 12  # greedy tokens the answer may take
    metric: str = STRING_MATCH_ALL  # "string_match_all" | "string_match_part"
