"""RULER's generators, one per task family, offline and seeded: a sample's prompt is the family's template and answer
prefix filled as RULER's scripts/data/synthetic/{niah,variable_tracking,common_words_extraction,
freq_words_extraction}.py fill them, split where the question starts (the context before, compressed; the question
and the answer prefix after), at the largest size whose context, question and answer budget fit N tokens (RULER
counts `len(tokens(input)) + tokens_to_generate`; RULER searches the size once per task, here per sample).

Departures, each forced by what we can ship or asked by our grid: keys, words and the essay come from
`generation/words.py` (no wonderwords, no Paul Graham essays); sentences are split at ., ! or ? and a space (no
nltk punkt); the asked needle of sample i of S lies at depth i / (S - 1) of the haystack (RULER draws depths at
random), the other needles at random places; every random draw, RULER's fixed-seed shuffles included, follows our
seed; the context and the question are tokenized apart (as they are fed), so N counts their two token lists.
"""

from __future__ import annotations

import math
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.generation.ruler import NOISE, CommonWords, FreqWords, Niah, TaskSpec, VariableTracking
from attnbench.generation.sample import Encode, Sample, TaskError
from attnbench.generation.words import common_words, essay_words, key_words

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Prompt:
    """A sample's text: the context, the question with its answer prefix (joined verbatim), what a reply must hold."""

    context: str
    question: str
    answers: tuple[str, ...]
    depth: float | None = None


Build = Callable[[int], "Prompt | None"]  # a size (haystack units, words) -> its prompt; None: no prompt that large


def split(spec: TaskSpec) -> tuple[str, str]:
    """The family's template and answer prefix, cut where its question starts: (context part, question part)."""
    family = spec.family
    assert family is not None
    template = family.template + family.answer_prefix
    at = template.rindex(family.question_start)
    return template[:at], template[at:]


def fit(spec: TaskSpec, total: int, encode: Encode, build: Build, least: int, guess_from: int = 32,
        budget: int | None = None, strict: bool = True) -> tuple[Prompt, list[int], list[int], int]:  # fmt: skip
    """The prompt of the largest size from `least` whose context, question and answer budget take at most `total`
    tokens, with its context and question ids and its size. When even `least` does not fit: TaskError, or (not
    `strict`, RULER's fallback to its smallest size) the prompt at `least`."""
    budget = spec.answer_tokens if budget is None else budget
    built: dict[int, tuple[Prompt, list[int], list[int], int] | None] = {}

    def tokens(size: int) -> int:
        if size not in built:
            prompt = build(size)
            if prompt is None:
                built[size] = None
            else:
                context, question = encode(prompt.context), encode(prompt.question)
                built[size] = (prompt, context, question, size)
        found = built[size]
        return math.inf if found is None else len(found[1]) + len(found[2]) + budget  # type: ignore[return-value]

    def fits(size: int) -> bool:
        return tokens(size) <= total

    smallest = tokens(least)
    if smallest > total and not strict:
        return built[least]  # type: ignore[return-value]
    if smallest > total:
        raise TaskError(f"{spec.name} needs more than {total} tokens: its smallest prompt and its {budget}-token "
                        f"answer take {smallest}")  # fmt: skip
    per_unit = max((tokens(least + guess_from) - smallest) / guess_from, 1e-3)
    guess = least + max(1, int((total - smallest) / per_unit))
    lo, hi = bracket(fits, least, guess)
    while hi - lo > 1:  # lo fits, hi does not
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if fits(middle) else (lo, middle)
    return built[lo]  # type: ignore[return-value]


def bracket(fits: Callable[[int], bool], least: int, guess: int) -> tuple[int, int]:
    """Sizes (lo, hi) around the estimate, lo fitting and hi not, by steps doubling away from `guess`."""
    step = max(1, (guess - least) // 32)
    if fits(guess):
        lo = guess
        while fits(lo + step):
            lo, step = lo + step, step * 2
        return lo, lo + step
    hi = guess
    while hi - step > least and not fits(hi - step):
        hi, step = hi - step, step * 2
    return max(least, hi - step), hi


def sample_of(spec: TaskSpec, index: int, fitted: tuple[Prompt, list[int], list[int], int]) -> Sample:
    prompt, context, question, _ = fitted
    return Sample(spec.name, index, context, question, prompt.answers, depth=prompt.depth,
                  answer_tokens=spec.answer_tokens, metric=spec.metric)  # fmt: skip


def seed_key(spec: TaskSpec, total: int, index: int, seed: int) -> str:
    return f"{spec.name}/{total}/{index}/{seed}"


def depth_of(index: int, samples: int) -> float:
    """Sample i of S asks the needle at depth i / (S - 1): depths spread over 0-100%."""
    return index / (samples - 1) if samples > 1 else 0.5


# ---- needles in a haystack (niah.py) -----------------------------------------------------------------------------


def random_value(rng: random.Random, kind: str, digits: int = 7) -> str:
    """niah.py's generate_random: a number of `digits` digits, an adjective-noun word, or a uuid4."""
    if kind == "numbers":
        return str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    if kind == "words":
        return rng.choice(key_words())
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def distinct_values(rng: random.Random, kind: str, count: int, taken: frozenset[str] = frozenset()) -> list[str] | None:
    """`count` values of a kind, none in `taken` nor repeated, drawn one after another (a longer list extends a
    shorter one); None when the kind has too few."""
    if kind == "words" and count > len(key_words()) - len(taken):
        return None
    out: list[str] = []
    seen = set(taken)
    while len(out) < count:
        value = random_value(rng, kind)
        if value not in seen:
            seen.add(value)
            out.append(value)
    return out


def haystack(args: Niah, size: int, rng: random.Random, keys: list[str]) -> tuple[list[str], str] | None:
    """niah.py's haystack of `size` units, as pieces a needle goes between, and their joiner: noise sentences (a
    line each), distractor needles of other keys (a line each), or the essay's first `size` words (repeated when
    short) cut into sentences."""
    if args.haystack == "noise":
        return [NOISE] * size, "\n"
    if args.haystack == "needle":
        values = random.Random(rng.getrandbits(64))  # apart from the keys': a longer haystack extends a shorter one
        others = distinct_values(rng, args.key_kind, size, frozenset(keys))
        if others is None:
            return None
        needle = args.needle.format
        return [needle(type_needle_v=args.value_kind, key=key, value=random_value(values, args.value_kind, args.digits))
                for key in others], "\n"  # fmt: skip
    words = essay_words()
    words = (words * (size // len(words) + 1))[:size]
    return SENTENCE_END.split(" ".join(words).strip()), " "


def niah_sample(spec: TaskSpec, total: int, index: int, samples: int, encode: Encode, seed: int) -> Sample:
    """niah.py: `keys` needles of `values` values each, `queries` of the keys asked, in a haystack."""
    args = spec.args
    assert isinstance(args, Niah)
    head, tail = split(spec)
    kind = args.value_kind
    if args.singular and args.queries * args.values == 1:  # niah.py's rewrite of its plural template
        head, tail = (part.replace("Some", "A").replace("are all", "is").replace("are", "is")
                      .replace("answers", "answer") for part in (head, tail))  # fmt: skip
        kind = kind[:-1]
    depth, key = depth_of(index, samples), seed_key(spec, total, index, seed)

    def build(size: int) -> Prompt | None:
        rng = random.Random(key)  # the needles and the question: the same at every size
        keys = distinct_values(rng, args.key_kind, max(args.keys, args.queries)) or []
        values = [[random_value(rng, args.value_kind, args.digits) for _ in range(args.values)] for _ in keys]
        asked = rng.sample(range(len(keys)), args.queries)
        needles = [args.needle.format(type_needle_v=args.value_kind, key=keys[i], value=value)
                   for i in asked + [i for i in range(len(keys)) if i not in asked] for value in values[i]]  # fmt: skip
        answers = [value for i in asked for value in values[i]]
        found = haystack(args, size, random.Random(key + "/haystack"), keys)
        if found is None:
            return None
        pieces, joiner = found
        places = random.Random(key + "/places")  # the asked needle (the first) at its depth, the others anywhere
        placed = [(round(depth * len(pieces)), needles[0])]
        placed += [(places.randrange(len(pieces) + 1), needle) for needle in needles[1:]]
        for place, needle in sorted(placed, key=lambda pair: -pair[0]):
            pieces.insert(place, needle)
        asked_keys = [keys[i] for i in asked]
        query = ", ".join(asked_keys[:-1]) + ", and " + asked_keys[-1] if len(asked_keys) > 1 else asked_keys[0]
        return Prompt(head.format(type_needle_v=kind, context=joiner.join(pieces)),
                      tail.format(type_needle_v=kind, query=query), tuple(answers), depth)  # fmt: skip

    fitted = fit(spec, total, encode, build, least=1, guess_from=64 if args.haystack == "essay" else 8)
    return sample_of(spec, index, fitted)


# ---- variable tracking (variable_tracking.py) --------------------------------------------------------------------


def chains(rng: random.Random, count: int, hops: int, letters: int) -> tuple[list[list[str]], list[list[str]]]:
    """`count` chains of `hops` assignments: each chain's variable names (distinct uppercase names of `letters`
    letters) and its lines, "VAR A = 12345" then "VAR B = VAR A " (RULER's trailing space kept)."""
    names: list[str] = []
    while len(names) < count * (hops + 1):
        name = "".join(rng.choices(string.ascii_uppercase, k=letters))
        if name not in names and name != "VAR":
            names.append(name)
    grouped = [names[i : i + hops + 1] for i in range(0, len(names), hops + 1)]
    lines = [[f"VAR {group[0]} = {rng.randint(10000, 99998)}"]
             + [f"VAR {group[j + 1]} = VAR {group[j]} " for j in range(hops)] for group in grouped]  # fmt: skip
    return grouped, lines


def vt_prompt(spec: TaskSpec, size: int, rng: random.Random, letters: int, before: str = "") -> Prompt:
    """variable_tracking.py's generate_input_output on the noise haystack: each chain's lines at sorted random
    places among `size` noise lines; the question asks the first chain's value."""
    args = spec.args
    assert isinstance(args, VariableTracking)
    head, tail = split(spec)
    names, lines = chains(rng, args.chains, args.hops, letters)
    sentences = [NOISE] * size
    for chain in lines:
        for j, place in enumerate(sorted(rng.sample(range(len(sentences)), len(chain)))):
            sentences.insert(place + j, chain[j])
    value = lines[0][0].split("=")[-1].strip()
    context = "\n".join(sentences).replace(". \n", ".\n")
    return Prompt(before + head.format(context=context), tail.format(query=value, num_v=args.hops + 1), tuple(names[0]))


def vt_sample(spec: TaskSpec, total: int, index: int, samples: int, encode: Encode, seed: int) -> Sample:
    """variable_tracking.py's main(): a worked example (3-letter names, fit to 500 tokens, its answer after it), a
    blank line, then the task (5-letter names); the reply must name every variable of the chain."""
    args = spec.args
    assert isinstance(args, VariableTracking)
    key = seed_key(spec, total, index, seed)
    example_build: Build = lambda size: vt_prompt(spec, size, random.Random(key + "/example"), letters=3)
    example, *_ = fit(spec, args.example_tokens, encode, example_build, least=args.hops + 1, guess_from=8, budget=0,
                      strict=False)  # fmt: skip
    shown = example.context + example.question + " " + " ".join(example.answers) + "\n\n"
    build: Build = lambda size: vt_prompt(spec, size, random.Random(key), letters=5, before=shown)
    return sample_of(spec, index, fit(spec, total, encode, build, least=args.hops + 1, guess_from=8))


# ---- common words (common_words_extraction.py) -------------------------------------------------------------------


def word_list(rng: random.Random, words: int, common_repeats: int, other_repeats: int,
              common: int) -> tuple[str, list[str]]:  # fmt: skip
    """get_example: `words` distinct words, the first `common` of them `common_repeats` times and the others
    `other_repeats` times, shuffled and numbered "1. w 2. w ..."; and the common ones."""
    chosen = rng.sample(common_words(), words)
    listed = chosen[:common] * common_repeats + chosen[common:] * other_repeats
    rng.shuffle(listed)
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(listed)), chosen[:common]


def cwe_sample(spec: TaskSpec, total: int, index: int, samples: int, encode: Encode, seed: int) -> Sample:
    """common_words_extraction.py: one worked example (20 words below N=4096, else 40) with its answer, a newline,
    then the list; the reply must name the 10 common words."""
    args = spec.args
    assert isinstance(args, CommonWords)
    head, tail = split(spec)
    small = total < 4096  # RULER switches on max_seq_length
    example = (20, 3, 1) if small else (40, 10, 3)
    repeats = (6, 1) if small else (args.freq_cw, args.freq_ucw)
    key, pool = seed_key(spec, total, index, seed), len(common_words())

    def build(size: int) -> Prompt | None:
        if size > pool:
            return None
        rng = random.Random(key)
        shown, answer = word_list(rng, *example, args.common)
        shown = head.format(context=shown) + tail + " " + " ".join(f"{i + 1}. {word}" for i, word in enumerate(answer))
        listed, common = word_list(rng, size, *repeats, args.common)
        return Prompt(shown + "\n" + head.format(context=listed), tail, tuple(common))

    fitted = fit(spec, total, encode, build, least=args.common, guess_from=64)
    if fitted[3] == pool:
        raise TaskError(f"cwe at N={total} would need more than the {pool} distinct words we ship: use a smaller N")
    return sample_of(spec, index, fitted)


# ---- frequent words (freq_words_extraction.py) -------------------------------------------------------------------


def zeta(s: float, terms: int = 1000) -> float:
    """Riemann's zeta at s > 1 (scipy.special.zeta in RULER): the sum's first terms and an Euler-Maclaurin tail."""
    return sum(k**-s for k in range(1, terms)) + terms ** (1 - s) / (s - 1) + terms**-s / 2


def fwe_sample(spec: TaskSpec, total: int, index: int, samples: int, encode: Encode, seed: int) -> Sample:
    """freq_words_extraction.py: (N - budget) // 50 coded words of 6 letters, the k-th most frequent drawn
    `words * k^-alpha / zeta(alpha)` times, the first of them '...'; the reply must name the next three."""
    args = spec.args
    assert isinstance(args, FreqWords)
    head, tail = split(spec)
    vocabulary_size = (total - spec.answer_tokens) // args.tokens_per_word
    if vocabulary_size < 4:
        raise TaskError(f"fwe needs N of at least {4 * args.tokens_per_word + spec.answer_tokens} tokens (four coded "
                        f"words), not {total}")  # fmt: skip
    key, normal = seed_key(spec, total, index, seed), zeta(args.alpha)

    def build(size: int) -> Prompt:
        rng = random.Random(key)
        vocabulary: list[str] = []
        while len(vocabulary) < vocabulary_size:
            word = "".join(rng.choices(string.ascii_lowercase, k=args.word_length))
            if word not in vocabulary:
                vocabulary.append(word)
        vocabulary = sorted(vocabulary)
        rng.shuffle(vocabulary)
        vocabulary[0] = "..."  # the top-ranked word is noise
        drawn = [word for k, word in enumerate(vocabulary, 1) for _ in range(int(size * k**-args.alpha / normal))]
        rng.shuffle(drawn)
        return Prompt(head.format(context=" ".join(drawn)), tail, tuple(vocabulary[1:4]))

    least = math.ceil(4**args.alpha * normal)  # the fourth word drawn at least once
    return sample_of(spec, index, fit(spec, total, encode, build, least=least, guess_from=256))


GENERATORS: dict[type, Callable[[TaskSpec, int, int, int, Encode, int], Sample]] = {
    Niah: niah_sample, VariableTracking: vt_sample, CommonWords: cwe_sample, FreqWords: fwe_sample,
}  # fmt: skip
