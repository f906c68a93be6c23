"""RULER's synthetic tasks as data (Hsieh et al. 2024, github.com/NVIDIA/RULER): each task is a family (a prompt
template, an answer prefix, an answer budget, a metric) and the arguments its generator takes.

Copied from RULER: the templates, answer prefixes and `tokens_to_generate` from `scripts/data/synthetic/constants.py`;
the metrics from `scripts/eval/synthetic/constants.py`; the needle sentence from `scripts/data/synthetic/niah.py`; the
task mix and its arguments from `scripts/synthetic.yaml`. Left out: qa_1 and qa_2 (SQuAD and HotpotQA documents, a
data set we neither ship nor download). The generators are `generation/generators.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.generation.sample import MAX_ANSWER_TOKENS
from attnbench.generation.scoring import STRING_MATCH_ALL


@dataclass(frozen=True)
class Family:
    """A RULER task family (a key of RULER's TASKS): its template ({context}, {query}, niah's {type_needle_v}, vt's
    {num_v}), the answer prefix appended to it, the answer budget, the metric, and where its question starts: the
    prompt is split there into the context (compressed) and the question, as kvpress splits RULER's prompts
    (`QUESTION_PATTERNS` of its evaluation/benchmarks/ruler/create_huggingface_dataset.py)."""

    name: str
    template: str
    answer_prefix: str
    tokens_to_generate: int
    metric: str
    question_start: str


NIAH = Family(
    "niah",
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} "
    "mentioned in the provided text?",
    " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    128, STRING_MATCH_ALL, "What ",
)  # fmt: skip
VARIABLE_TRACKING = Family(
    "variable_tracking",
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find "
    "all variables that are assigned the value {query} in the text above.",
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the "
    "value {query}, they are: ",
    30, STRING_MATCH_ALL, "Question: ",
)  # fmt: skip
COMMON_WORDS = Family(
    "common_words_extraction",
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that "
    "appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
    " Answer: The top 10 words that appear most often in the list are:",
    120, STRING_MATCH_ALL, "Question: ",
)  # fmt: skip
FREQ_WORDS = Family(
    "freq_words_extraction",
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What "
    "are the three most frequently appeared words in the above coded text?",
    " Answer: According to the coded text above, the three most frequently appeared words are:",
    50, STRING_MATCH_ALL, "Question: ",
)  # fmt: skip
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."  # niah.py's needle sentence
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."  # "noise" haystack


@dataclass(frozen=True)
class Niah:
    """niah.py's arguments: the haystack ("noise" sentences, an "essay", or "needle": distractor needles), what keys
    and values are ("words" | "numbers" | "uuids"), how many keys, values per key and keys asked."""

    haystack: str
    key_kind: str = "words"
    value_kind: str = "numbers"
    keys: int = 1  # num_needle_k
    values: int = 1  # num_needle_v
    queries: int = 1  # num_needle_q
    digits: int = 7  # a number value's digits (generate_random_number's default)
    needle: str = NEEDLE
    singular: bool = True  # RULER's rewrite of its plural template when one value is asked ("Some" -> "A", ...)


@dataclass(frozen=True)
class VariableTracking:
    """variable_tracking.py's arguments: chains of `hops` assignments in the noise haystack, after one worked
    example (RULER's `add_fewshot`, on by default in its main())."""

    chains: int = 1
    hops: int = 4
    example_tokens: int = 500  # the worked example's length (main(): max_seq_length=500)


@dataclass(frozen=True)
class CommonWords:
    """common_words_extraction.py's arguments: `common` words `freq_cw` times each among others `freq_ucw` times
    (below N=4096: 6 and 1), after one worked example."""

    freq_cw: int = 30
    freq_ucw: int = 3
    common: int = 10  # num_cw


@dataclass(frozen=True)
class FreqWords:
    """freq_words_extraction.py's arguments: coded words drawn by a Zipf law of exponent `alpha`; the three most
    frequent after the noise word '...' are the answer."""

    alpha: float = 2.0
    word_length: int = 6  # coded_wordlen
    tokens_per_word: int = 50  # vocab_size = (N - tokens_to_generate) // 50


Args = Niah | VariableTracking | CommonWords | FreqWords


@dataclass(frozen=True)
class TaskSpec:
    """A built-in task: its family and its generator's arguments (None for `continuation`, a stretch of real text
    and its next tokens)."""

    name: str
    family: Family | None = None
    args: Args | None = None

    @property
    def kind(self) -> str:
        """The family's name, or "continuation"."""
        return self.family.name if self.family else "continuation"

    @property
    def answer_tokens(self) -> int:
        """The answer's budget: the family's tokens_to_generate, at most MAX_ANSWER_TOKENS (0: no answer)."""
        return min(self.family.tokens_to_generate, MAX_ANSWER_TOKENS) if self.family else 0

    @property
    def metric(self) -> str:
        return self.family.metric if self.family else STRING_MATCH_ALL


RULER_TASKS = (  # scripts/synthetic.yaml, less qa_1 and qa_2
    TaskSpec("niah_single_1", NIAH, Niah("noise")),
    TaskSpec("niah_single_2", NIAH, Niah("essay")),
    TaskSpec("niah_single_3", NIAH, Niah("essay", value_kind="uuids")),
    TaskSpec("niah_multikey_1", NIAH, Niah("essay", keys=4)),
    TaskSpec("niah_multikey_2", NIAH, Niah("needle")),
    TaskSpec("niah_multikey_3", NIAH, Niah("needle", key_kind="uuids", value_kind="uuids")),
    TaskSpec("niah_multivalue", NIAH, Niah("essay", values=4)),
    TaskSpec("niah_multiquery", NIAH, Niah("essay", queries=4)),
    TaskSpec("vt", VARIABLE_TRACKING, VariableTracking()),
    TaskSpec("cwe", COMMON_WORDS, CommonWords()),
    TaskSpec("fwe", FREQ_WORDS, FreqWords(alpha=2.0)),
)
