"""RULER's tasks against RULER's own text: the templates, answer prefixes, budgets and metrics (strings copied below
from github.com/NVIDIA/RULER at c3f5e3b: scripts/data/synthetic/constants.py, scripts/eval/synthetic/constants.py,
scripts/synthetic.yaml), the prompts filled as its generators fill them, split where kvpress splits them, and the
metrics against a transcription of RULER's functions; with the real tokenizer (marked `model`), every task fits N."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from pathlib import Path

import pytest
from attnbench.generation.ruler import COMMON_WORDS, FREQ_WORDS, NIAH, RULER_TASKS, VARIABLE_TRACKING
from attnbench.generation.scoring import score
from attnbench.generation.tasks import TASKS, build_samples, probe_text

# scripts/data/synthetic/constants.py: TASKS[family] = (template, answer_prefix, tokens_to_generate)
RULER_CONSTANTS = {
    "niah": (
        """Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?""",
        """ The special magic {type_needle_v} for {query} mentioned in the provided text are""",
        128,
    ),
    "variable_tracking": (
        """Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.""",
        """ Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, they are: """,
        30,
    ),
    "common_words_extraction": (
        """Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?""",
        """ Answer: The top 10 words that appear most often in the list are:""",
        120,
    ),
    "freq_words_extraction": (
        """Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?""",
        """ Answer: According to the coded text above, the three most frequently appeared words are:""",
        50,
    ),
}  # fmt: skip
# scripts/eval/synthetic/constants.py: TASKS[family]["metric_fn"] (qa: string_match_part, left out here)
RULER_METRICS = {"niah": "string_match_all", "variable_tracking": "string_match_all",
                 "common_words_extraction": "string_match_all", "freq_words_extraction": "string_match_all"}  # fmt: skip
# scripts/synthetic.yaml, less qa_1 and qa_2
RULER_MIX = {
    "niah_single_1": ("niah", {"type_haystack": "noise", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_single_2": ("niah", {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_single_3": ("niah", {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_multikey_1": ("niah", {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 4, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_multikey_2": ("niah", {"type_haystack": "needle", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_multikey_3": ("niah", {"type_haystack": "needle", "type_needle_k": "uuids", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}),
    "niah_multivalue": ("niah", {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 4, "num_needle_q": 1}),
    "niah_multiquery": ("niah", {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 4}),
    "vt": ("variable_tracking", {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}),
    "cwe": ("common_words_extraction", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    "fwe": ("freq_words_extraction", {"alpha": 2.0}),
}  # fmt: skip
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."  # scripts/data/synthetic/niah.py
# kvpress's evaluation/benchmarks/ruler/create_huggingface_dataset.py: where a RULER prompt's question starts
QUESTION_PATTERNS = {
    "niah": re.compile(r"What (?:is|are all) the special magic"),
    "variable_tracking": re.compile(r"Question: Find all variables that are assigned the value"),
    "common_words_extraction": re.compile(r"Question: What are the 10 most common words in the above list\?"),
    "freq_words_extraction": re.compile(r"Question: Do not provide any explanation\."),
}


def postprocess_pred(predict_str: str) -> str:  # RULER's scripts/eval/evaluate.py, transcribed
    predict_str = predict_str.strip()
    np_pattern = re.compile(r"[\x00-\x1f]")
    return np_pattern.sub("\n", predict_str).strip()


def string_match_part(preds, refs):  # RULER's scripts/eval/synthetic/constants.py, transcribed
    return round(sum([max([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) for pred, ref in zip(preds, refs)]) / len(preds) * 100, 2)


def string_match_all(preds, refs):  # the same file
    return round(sum([sum([1.0 if r.lower() in pred.lower() else 0.0 for r in ref]) / len(ref) for pred, ref in zip(preds, refs)]) / len(preds) * 100, 2)


def encode(text: str) -> list[int]:
    return [ord(c) for c in text]


def decode(ids) -> str:
    return "".join(map(chr, ids))


def test_families_are_rulers_constants() -> None:
    for family in (NIAH, VARIABLE_TRACKING, COMMON_WORDS, FREQ_WORDS):
        assert (family.template, family.answer_prefix, family.tokens_to_generate) == RULER_CONSTANTS[family.name]
        assert family.metric == RULER_METRICS[family.name]


def test_the_task_mix_is_rulers() -> None:
    names = {"haystack": "type_haystack", "key_kind": "type_needle_k", "value_kind": "type_needle_v", "keys": "num_needle_k",
             "values": "num_needle_v", "queries": "num_needle_q", "chains": "num_chains", "hops": "num_hops",
             "freq_cw": "freq_cw", "freq_ucw": "freq_ucw", "common": "num_cw", "alpha": "alpha"}  # fmt: skip
    assert [spec.name for spec in RULER_TASKS] == list(RULER_MIX)
    for spec in RULER_TASKS:
        family, args = RULER_MIX[spec.name]
        ours = {names[key]: value for key, value in vars(spec.args).items() if key in names}
        if spec.name == "vt":  # ours tracks variables in the noise haystack only
            ours["type_haystack"] = "noise"
        assert spec.family.name == family and {k: ours[k] for k in args} == args, spec.name
        assert TASKS[spec.name] is spec and spec.answer_tokens == RULER_CONSTANTS[family][2]
    assert TASKS["passkey"].answer_tokens == 8 and TASKS["niah_single_1"].args.needle == NEEDLE


def expected_ends(task: str, query: str, num_v: int = 5) -> tuple[str, str]:
    """RULER's template and answer prefix around {context}, filled as its generator fills them (niah.py's rewrite for
    one value asked)."""
    family, args = RULER_MIX[task]
    template, prefix, _ = RULER_CONSTANTS[family]
    template, kind = template + prefix, args.get("type_needle_v", "")
    if family == "niah" and args["num_needle_q"] * args["num_needle_v"] == 1:
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
        kind = kind[:-1]
    before, after = template.split("{context}")
    return before.format(type_needle_v=kind), after.format(type_needle_v=kind, query=query, num_v=num_v)


@pytest.mark.parametrize("task", list(RULER_MIX))
def test_prompts_are_rulers_templates_split_where_kvpress_splits(task: str) -> None:
    (sample,) = build_samples(task, 8192 if task == "cwe" else 4096, 1, encode, seed=2)  # a character a token
    family = RULER_MIX[task][0]
    context, question = decode(sample.context), decode(sample.question)
    match = QUESTION_PATTERNS[family].match(question)
    assert match is not None and not QUESTION_PATTERNS[family].search(context[-200:])  # the question starts it
    query = {"niah": lambda: question.split(" for ")[1].split(" mentioned")[0],
             "variable_tracking": lambda: question.split("the value ")[1].split(" ")[0]}.get(family, lambda: "")()  # fmt: skip
    before, after = expected_ends(task, query)
    assert (context + question).endswith(after) and "\n" + question in after
    assert before in context and (context.startswith(before) or family in ("variable_tracking", "common_words_extraction"))
    assert (sample.metric, sample.answer_tokens) == (RULER_METRICS[family], RULER_CONSTANTS[family][2])


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_3", "niah_multikey_3", "niah_multivalue", "niah_multiquery"])
def test_needles_are_rulers_sentences_and_the_answers_their_values(task: str) -> None:
    (sample,) = build_samples(task, 3000, 1, encode, seed=4)
    context, question = decode(sample.context), decode(sample.question)
    args = TASKS[task].args
    asked = question.split(" for ")[1].split(" mentioned")[0].replace(", and ", ", ").split(", ")
    assert len(asked) == args.queries and len(sample.answers) == args.queries * args.values
    pairs = re.findall(r"One of the special magic (\w+) for (\S+) is: (\S+)\.(?:\n| |$)", context)
    values_of = {}
    for kind, key, value in pairs:
        assert kind == args.value_kind
        values_of.setdefault(key, []).append(value)
    assert sorted(v for key in asked for v in values_of[key]) == sorted(sample.answers)  # a key's values anywhere
    if args.value_kind == "uuids":
        assert all(re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", v) for v in sample.answers)
    else:
        assert all(re.fullmatch(r"[1-9]\d{6}", v) for v in sample.answers)


def test_variable_tracking_asks_the_whole_chain_after_a_worked_example() -> None:
    (sample,) = build_samples("vt", 4096, 1, encode, seed=1)
    context, question = decode(sample.context), decode(sample.question)
    value = question.split("the value ")[1].split(" ")[0]
    names = sample.answers
    assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", name) for name in names)
    task = context[context.rindex("Memorize and track"):]
    assert f"VAR {names[0]} = {value}\n" in task
    for earlier, later in itertools.pairwise(names):
        assert f"VAR {later} = VAR {earlier} \n" in task  # RULER's trailing space kept
    assert task.index(names[0] + " =") < task.index(names[-1] + " =")
    example = context[: context.rindex("Memorize and track")]
    assert example.startswith("Memorize and track") and example.endswith("\n\n")
    shown = example.split("they are: ")[1].split()
    assert len(shown) == 5 and all(re.fullmatch(r"[A-Z]{3}", name) for name in shown)  # 3-letter names, answered


@pytest.mark.parametrize("n, common, other", [(2048, 6, 1), (8192, 30, 3)])  # RULER's regimes: below N=4096, above
def test_common_words_are_the_ten_repeated_most(n: int, common: int, other: int) -> None:
    (sample,) = build_samples("cwe", n, 1, encode, seed=0)
    context = decode(sample.context)
    listed = context[context.rindex("most often.\n") + len("most often.\n"):].strip()
    words = re.findall(r"\d+\. (\w+)", listed)
    counts = Counter(words)
    assert {counts[w] for w in sample.answers} == {common} and len(sample.answers) == 10
    assert set(counts.values()) == {common, other} and words == listed.split()[1::2]
    assert context.count("Answer: The top 10 words that appear most often in the list are: 1. ") == 1  # the example


def test_frequent_words_follow_zipf_and_the_answer_skips_the_noise_word() -> None:
    (sample,) = build_samples("fwe", 4096, 1, encode, seed=0)
    context = decode(sample.context)
    words = context.split("coded words. ")[1].split()
    ranked = [word for word, _ in Counter(words).most_common()]
    assert ranked[0] == "..." and tuple(ranked[1:4]) == sample.answers
    counts = Counter(words)
    assert counts["..."] > 2 * counts[sample.answers[0]] > 2 * counts[sample.answers[1]]


@pytest.mark.parametrize(
    "answer, references",
    [(" 4119073.", ("4119073",)), ("4119", ("4119073",)), ("The Key is ABC", ("abc", "xyz")), ("", ("1",)),
     ("A B and c", ("a", "b", "c", "d")), ("NONE", ("x", "y")), ("tab\there", ("tab\there",))],
)  # fmt: skip
def test_scores_are_rulers_metrics(answer: str, references: tuple) -> None:
    pred = postprocess_pred(answer)  # evaluate.py cleans each prediction before its metric
    assert round(100 * score(answer, references), 2) == string_match_all([pred], [references])
    assert round(100 * score(answer, references, "string_match_all"), 2) == string_match_all([pred], [references])
    assert 100 * score(answer, references, "string_match_part") == string_match_part([pred], [references])


def test_metric_examples_and_an_unknown_metric() -> None:
    assert score("The Key is ABC", ("abc", "xyz"), "string_match_all") == 0.5
    assert score("The Key is ABC", ("abc", "xyz"), "string_match_part") == 1.0
    assert score("nothing", ("abc", "xyz"), "string_match_part") == 0.0
    assert score("\x01 4119073\x02", ("4119073",)) == 1.0  # RULER's clean-up: control characters out, stripped
    with pytest.raises(ValueError, match="unknown metric 'exact'"):
        score("a", ("a",), "exact")


@pytest.mark.model
@pytest.mark.parametrize("n", [1024, 4096])
def test_every_task_fits_n_with_the_real_tokenizer(model_dir: Path, n: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    def tokens(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    for task, spec in TASKS.items():
        if task == "continuation":
            continue
        text = probe_text(task)
        assert tokenizer.decode(tokens(text)) == text, task
        for sample in build_samples(task, n, 2, tokens, seed=0):
            total = len(sample.context) + len(sample.question) + spec.answer_tokens
            assert n - 80 <= total <= n, (task, total)  # filled to N, less than one haystack unit short
            context = tokenizer.decode(sample.context)
            if task not in ("cwe", "fwe", "vt"):  # their answers are counted or chained, not stated
                assert all(answer in context for answer in sample.answers), task


def test_a_near_miss_of_a_rows_key_is_refused_and_other_keys_are_left_alone(tmp_path) -> None:
    """`metirc` would silently score the row with the default metric: refused with the key it meant; a data set's own
    columns (id, task, length) pass."""
    from attnbench.generation.tasks import TaskError, read_jsonl

    good = tmp_path / "good.jsonl"
    good.write_text('{"context": "c", "question": "q", "answers": ["a"], "id": 3, "task": "x", "length": 9}\n')
    assert read_jsonl(good)[0]["id"] == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "c", "question": "q", "answers": ["a"], "metirc": "string_match_part"}\n'
                   '{"context": "c", "question": "q", "answers": ["a"], "answer_prefx": "A:"}\n')
    with pytest.raises(TaskError, match=r"line 1: unknown key 'metirc': did you mean 'metric'\?.*line 2: unknown key "
                                        r"'answer_prefx': did you mean 'answer_prefix'\?"):
        read_jsonl(bad)
