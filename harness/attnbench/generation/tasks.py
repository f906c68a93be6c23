"""The built-in generation tasks by name, built offline from shipped text and a seed; a user's JSONL tasks are
`user_tasks.py`, the answer metrics `scoring.py`.

- RULER's synthetic mix (`ruler.py`, its templates, answer prefixes, budgets and metrics; `generators.py`):
  `niah_single_1` (a 7-digit value in the noise haystack), `niah_single_2` (the same in the essay haystack: our
  shipped Python tutorial prose stands in for Paul Graham's essays), `niah_single_3` (a uuid value),
  `niah_multikey_1` (four keys, one asked), `niah_multikey_2` (a haystack of distractor needles), `niah_multikey_3`
  (the same with uuid keys and values), `niah_multivalue` (four values of the asked key, all to be named),
  `niah_multiquery` (four keys asked), `vt` (variable tracking: every variable a value reaches through a chain of
  assignments), `cwe` (the 10 most common words of a numbered list), `fwe` (the three most frequent coded words).
  RULER's qa_1 and qa_2 are left out: they need SQuAD and HotpotQA, which we neither ship nor download.
- `niah_single` and `niah_multikey`, the names of earlier grids, are aliases of niah_single_1 and niah_multikey_1
  (the same samples; their rows keep the name asked).
- `passkey`: a 5-digit pass key in the noise haystack (Mohtashami & Jaggi 2023; Quest's Table 1), not a RULER task.
- `continuation`: a stretch of a real text (the Python tutorial shipped for calibration) and its next tokens, scored
  by their teacher-forced log-likelihood against the exact model's.

N counts the context, the question and the task's own answer budget, as RULER counts a task's length; a grid's
`answer_tokens` caps what is generated without changing the prompt. The asked needle of sample i of S lies at depth
i / (S - 1) of the haystack (0 = first, 1 = last), so depths spread over 0-100%.
"""

from __future__ import annotations

import dataclasses
import functools
import random

from attnbench.generation.generators import GENERATORS
from attnbench.generation.ruler import NOISE, RULER_TASKS, Family, Niah, TaskSpec
from attnbench.generation.sample import MAX_ANSWER_TOKENS, Encode, Sample, TaskError
from attnbench.generation.scoring import METRICS, STRING_MATCH_ALL, STRING_MATCH_PART, score
from attnbench.generation.user_tasks import jsonl_samples, needs_lines, read_jsonl
from attnbench.generation.words import shipped_text

__all__ = [
    "ALIASES", "HAYSTACK", "MAX_ANSWER_TOKENS", "METRICS", "STRING_MATCH_ALL", "STRING_MATCH_PART", "TASKS", "Encode",
    "Sample", "TaskError", "TaskSpec", "build_samples", "jsonl_samples", "needs_lines", "probe_text", "read_jsonl",
    "score", "text_tokens",
]  # fmt: skip

HAYSTACK = NOISE  # RULER's "noise" haystack, the sentences of the passkey test
CONTINUATION_TEXT = "python_tutorial.txt"  # shipped in attnbench.model.texts

PASSKEY = Family(  # Mohtashami & Jaggi 2023 (landmark attention), in RULER's shape: question, then answer prefix
    "passkey",
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there.\n{context}\nWhat is the pass key?",
    " The pass key is", 8, STRING_MATCH_ALL, "What ",
)  # fmt: skip
ALIASES = {"niah_single": "niah_single_1", "niah_multikey": "niah_multikey_1"}  # earlier grids' names
_SPECS = (
    *RULER_TASKS,
    TaskSpec("passkey", PASSKEY, Niah("noise", digits=5, needle="The pass key is {value}. Remember it. {value} is the "
                                      "pass key.", singular=False)),
    TaskSpec("continuation"),
)  # fmt: skip
TASKS: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}
TASKS.update({alias: TASKS[name] for alias, name in ALIASES.items()})


def probe_text(task: str) -> str:
    """A built-in task's fixed text (template, answer prefix, a needle, a haystack sentence), for checking that a
    tokenizer gives it back unchanged; "" for continuation (the shipped text itself)."""
    spec = TASKS[task]
    if spec.family is None:
        return ""
    text = spec.family.template + spec.family.answer_prefix + NOISE
    if isinstance(spec.args, Niah):
        text += spec.args.needle.format(type_needle_v="numbers", key="amber-anchor", value="1234567")
    return text


def continuation_sample(total: int, tokens: int, index: int, encode: Encode, seed: int) -> Sample:
    """A stretch of the shipped text and its next `tokens`, `total` tokens in all, starting at a seeded offset."""
    ids = text_tokens(encode)
    n = total - tokens
    if len(ids) < total or n < 1:
        raise TaskError(f"the continuation text has {len(ids)} tokens: it cannot give {total} ({tokens} to continue)")
    start = random.Random(f"continuation/{total}/{index}/{seed}").randrange(len(ids) - total + 1)
    following = tuple(ids[start + n : start + n + tokens])
    return Sample("continuation", index, ids[start : start + n], [], continuation=following)


@functools.lru_cache(maxsize=4)
def text_tokens(encode: Encode) -> list[int]:
    """The shipped continuation text, tokenized once per tokenizer."""
    return encode(shipped_text(CONTINUATION_TEXT))


def build_samples(task: str, n: int, samples: int, encode: Encode, *, seed: int = 0, continuation_tokens: int = 128,
                  indices: range | None = None, answer_tokens: int | None = None) -> list[Sample]:  # fmt: skip
    """Samples `indices` (default all) of a built-in task at length n: the context, the question and the task's own
    answer budget (or the continuation) fit n tokens, as RULER counts a task's length. `answer_tokens`, when given,
    caps each answer's budget (what the decoder generates), not the prompt."""
    spec = TASKS[task]
    chosen = range(samples) if indices is None else indices
    if spec.family is None:
        return [continuation_sample(n, continuation_tokens, i, encode, seed) for i in chosen]
    built = [GENERATORS[type(spec.args)](spec, n, i, samples, encode, seed) for i in chosen]
    budget = spec.answer_tokens if answer_tokens is None else min(spec.answer_tokens, answer_tokens)
    return [dataclasses.replace(sample, task=task, answer_tokens=budget) for sample in built]
