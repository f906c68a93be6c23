"""A generation grid: tasks × N × samples × protocols, and the methods with their shares of the cache kept, from a TOML
file or a shipped grid (configs/generation/), checked whole before any work (every problem listed at once).

Keys: `tasks` (built-in names, `jsonl:PATH` for a user's file), `seq_lens`, `samples` (per task and N), `protocols`
("question-agnostic": the context compressed, then the question, kvpress's default; "question-aware": the question
inside the prompt, so a method that reads the prompt's last queries sees it), `keep` (shares of the prompt's cache),
`methods` (the variants grammar of a sweep, or the papers' names, ALIASES, each taking its paper's parameter names as
well, PAPER_PARAMETERS; each table also taking `prefill` = "dense" | "own", `decode` = "own" |
"exact" (its sparse prefill, then exact decoding), `dense_layers`, `label` and `quantize` = "none" | "kivi-4" |
"kivi-2": what the method keeps after the prompt held in KIVI's quantized cache, `attnbench.generation.kept`),
`block` (samples per unit of work: one Ray task or one in-process step), `continuation_tokens`, `seed`,
`stop` ("newline", the default: an answer ends at its first newline once begun, or at end of text, but a user's row
whose answers may take more than one line runs on, `user_tasks.needs_lines`; "end-of-text": only there or at its
budget, for multi-line answers), `budget_rule` ("kvpress", the default: the context compressed once when it ends, the question and the answer appended
for every method; "fixed-total": every method at its share throughout, `attnbench.generation.kept`), `model` (the model
it runs on when `--model` is not given: a known model's name, `attnbench.model.known`, or a folder).

The unit of work is (task, N, protocol, a block of samples): every method runs inside it, batched, on prompts built
once; each finished unit appends its rows, so a resume runs only units with a missing row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnbench.generation.budgets import OWN_KNOBS, at_share, clamp_note, knob_of
from attnbench.generation.kept import BUDGET_RULES, QUANTIZE
from attnbench.generation.layers import DECODES, LAYERS, PREFILLS
from attnbench.generation.tasks import ALIASES as TASK_ALIASES
from attnbench.generation.tasks import TASKS, TaskError, read_jsonl
from attnbench.interface import Hyperparameter, did_you_mean
from attnbench.plan.cells import VariantSpec
from attnbench.plan.config import ConfigError, name_problem, parse_variants
from attnbench.plan.shipped import grid_descriptions as shipped_descriptions
from attnbench.paper_names import ALIASES, download_refusal  # the papers' names (re-exported here)
from attnbench.plan.shipped import read_grid_toml
from attnbench.registry import Registry
from attnbench.registry import registry as default_registry

GRIDS = "generation"  # the folder of shipped grids inside attnbench.configs
DEFAULT_GRID = "generation"
PROTOCOLS = ("question-agnostic", "question-aware")
JSONL = "jsonl:"
DESCRIPTIVE = ("name", "description", "measured_run_time")
KEYS = DESCRIPTIVE + ("tasks", "seq_lens", "samples", "protocols", "keep", "methods", "block", "continuation_tokens",
                      "seed", "answer_tokens", "budget_rule", "stop", "model")  # fmt: skip
STOPS = ("newline", "end-of-text")
METHOD_KEYS = ("prefill", "dense_layers", "label", "decode", "quantize", "protocols", "hybrid_layers")


@dataclass(frozen=True)
class PaperParameter:
    """A parameter of a paper's own code, as its alias takes it: the variant's hyperparameter it sets and from what.
    `value` maps the given whole number onto it, reading the variant's other hyperparameters (resolved); None: as
    given."""

    sets: str
    doc: str
    minimum: int = 0
    value: Callable[[int, dict[str, Any]], Any] | None = None

    def problem(self, name: str, given: Any) -> str | None:
        """What is wrong with a given value (a whole number >= minimum), said with the paper's name."""
        return Hyperparameter(None, self.doc, int, minimum=self.minimum).check(name, given)


QUEST_PARAMETERS = {  # the names of Quest's code: its kernels' page_size, its evaluation's token_budget
    "page_size": PaperParameter("block_size", "tokens per page (Quest's page_size)", 1),
    "token_budget": PaperParameter(  # one rule with the share's: budgets.OWN_KNOBS["topk"]
        "top_k", "tokens a step reads per query head, in whole pages, its current page among them (Quest's "
        "token_budget): top_k = token_budget // page_size - 1 ranked pages, one fewer with a forced first page", 1,
        OWN_KNOBS["topk"].value,
    ),
}  # fmt: skip
PAPER_PARAMETERS: dict[str, dict[str, PaperParameter]] = {  # an alias -> its paper's names, mapped in this order
    "quest": QUEST_PARAMETERS,
    "quest-first-page": QUEST_PARAMETERS,
    # streaming_llm/kv_cache.py's StartRecentKVCache: a step sees start_size + recent_size earlier keys and itself
    "streamingllm": {
        "start_size": PaperParameter("sinks", "the first tokens, always kept (StreamingLLM's start_size)"),
        "recent_size": PaperParameter("window", "recent tokens kept before the current one (StreamingLLM's recent_size)"),
    },
    # kvpress's ChunkKVPress's own name (chunkkv_press.py)
    "chunkkv": {"chunk_length": PaperParameter("chunk", "positions per chunk (ChunkKVPress's chunk_length)", 1)},
}
NO_QUESTION = "no question"  # a continuation's protocol: nothing follows its context but the text itself


@dataclass(frozen=True)
class MethodSpec:
    """A method of the grid: the variant setting (its knob left to the share where it has one and it is not set),
    how it meets the prompt, the first layers kept exact, and whether what it keeps is quantized."""

    variant: VariantSpec
    prefill: str
    dense_layers: int = 0
    name: str = ""  # a short name for tables and plots (`quest`), else the label below
    decode: str = "own"  # its variant's decode form, or "exact": exact decoding after its (sparse) prefill
    quantize: str = "none"  # what it keeps after the prompt quantized (`kept.QUANTIZE`: "kivi-4", "kivi-2")
    protocols: tuple[str, ...] = ()  # the grid's protocols it runs under (empty: every one; kvpress runs some presses
    # question-aware only)
    layers: str = "global"  # a hybrid model's layers it goes into (`layers.LAYERS`): its global ones, or "all"

    def runs_under(self, protocol: str | None) -> bool:
        """It runs in a unit of this protocol (None, or a continuation's, which has no question: always)."""
        return not self.protocols or protocol is None or protocol == NO_QUESTION or protocol in self.protocols

    @property
    def swept(self) -> bool:
        """Its cache follows the grid's shares (a knob the table does not set; exact decoding keeps every key)."""
        knob = knob_of(self.variant.name)
        return knob is not None and knob.parameter not in dict(self.variant.params) and self.decode == "own"

    def label(self) -> str:
        """The variant's label, its quantization, and how it sits in the model where that is not its default:
        `topk(score=minmax) [first 2 layers exact]`, `snapkv + kivi-2`."""
        if self.name:
            return self.name
        extra = [f"{self.prefill} prefill"] if self.prefill != default_prefill(self.variant.name) else []
        extra += [f"first {self.dense_layers} layers exact"] if self.dense_layers else []
        extra += ["exact decoding"] if self.decode == "exact" else []
        extra += ["every layer"] if self.layers == "all" else []
        quantized = f" + {self.quantize}" if self.quantize != "none" else ""
        return self.variant.label() + quantized + (f" [{', '.join(extra)}]" if extra else "")


def default_prefill(name: str, registry: Registry = default_registry) -> str:
    """A KV-cache method (a knob on its cache, or the kv-cache family: KIVI) and full meet an exact prompt; any other
    its own prefill."""
    if knob_of(name, registry) is not None or name == "full":
        return "dense"
    try:
        return "dense" if registry.load(name).family == "kv-cache" else "own"
    except Exception:  # unknown or broken: the grid's checks say so
        return "own"


@dataclass(frozen=True)
class Setting:
    """One row's method: a MethodSpec at one share (None: not swept), its hyperparameters resolved."""

    method: MethodSpec
    share: float | None
    hparams: tuple[tuple[str, Any], ...]

    def label(self) -> str:
        return self.method.label() if self.share is None else f"{self.method.label()} @ {self.share:g}"


@dataclass(frozen=True)
class Unit:
    """What one worker runs: every method on a block of samples of one task at one N, under one protocol."""

    task: str
    seq_len: int
    protocol: str
    samples: tuple[int, ...]

    def name(self) -> str:
        length = f"N={self.seq_len}" if self.seq_len else "its rows' own lengths"
        which = f"sample {self.samples[0]}" if len(self.samples) == 1 else f"samples {self.samples[0]}-{self.samples[-1]}"
        return f"{self.task} {length} {self.protocol} {which}"


@dataclass(frozen=True)
class GenerationGrid:
    name: str
    tasks: tuple[str, ...]
    seq_lens: tuple[int, ...]
    samples: int
    protocols: tuple[str, ...]
    keep: tuple[float, ...]
    methods: tuple[MethodSpec, ...]
    block: int = 5
    continuation_tokens: int = 64
    answer_tokens: int | None = None  # caps every task's own answer budget (RULER's tokens_to_generate); None: none
    seed: int = 0
    budget_rule: str = BUDGET_RULES[0]
    stop: str = STOPS[0]
    jsonl_rows: dict[str, int] = field(default_factory=dict, compare=False)  # a user's task -> its rows
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    model: str | None = None  # the model it runs on when --model is not given: a known name or a folder (None: SmolLM2)

    def units(self) -> list[Unit]:
        """Every unit, by N, task, protocol, then sample block. A continuation has no question (one unit, protocol
        NO_QUESTION); a user's rows have their own lengths (N 0: the rows', once) and are its samples."""
        out = []
        for task in self.tasks:
            lengths = (0,) if task.startswith(JSONL) else self.seq_lens
            count = self.jsonl_rows.get(task, self.samples)
            protocols = (NO_QUESTION,) if task == "continuation" else self.protocols
            for n in lengths:
                for protocol in protocols:
                    for start in range(0, count, self.block):
                        out.append(Unit(task, n, protocol, tuple(range(start, min(count, start + self.block)))))
        return sorted(out, key=lambda unit: unit.seq_len)  # by N (a stable sort: the tasks' order within one)

    def settings(self, n: int, registry: Registry = default_registry, reserve: int = 0,
                 protocol: str | None = None) -> list[Setting]:  # fmt: skip
        """Every method at every share for a prompt of n tokens (a method without a knob once); `reserve`: the tokens
        that follow it, which the fixed-total rule leaves room for (`budgets.at_share`); `protocol`: only the methods
        that run under it (None: every method)."""
        out = []
        for method in self.methods:
            if not method.runs_under(protocol):
                continue
            hparams = registry.create(method.variant.name, **dict(method.variant.params)).hparams
            if not method.swept:
                out.append(Setting(method, None, tuple(sorted(hparams.items()))))
                continue
            for share in self.keep:
                out.append(Setting(method, share, tuple(sorted(at_share(method.variant.name, hparams, share, n, reserve).items()))))
        return out


def clamp_notes(grid: GenerationGrid, registry: Registry = default_registry) -> list[str]:
    """Each swept method's share that its smallest setting overrides at some N of the grid, said once."""
    notes = []
    for method in grid.methods:
        if not method.swept:
            continue
        hparams = registry.create(method.variant.name, **dict(method.variant.params)).hparams
        for n in grid.seq_lens:
            for share in grid.keep:
                note = clamp_note(method.variant.name, hparams, share, n, method.label())
                if note is not None and note not in notes:
                    notes.append(note)
    return notes


def row_key(unit: Unit, sample: int, setting: Setting) -> str:
    """A stable key of one row: resume matches rows by it."""
    method = setting.method
    key = [unit.task, unit.seq_len, unit.protocol, sample, method.variant.name, dict(method.variant.params),
           method.prefill, method.dense_layers, method.decode, setting.share]  # fmt: skip
    if method.quantize != "none":  # only when set: the keys of rows that do not quantize stay as they were
        key.append({"quantize": method.quantize})
    if method.layers != "global":
        key.append({"hybrid_layers": method.layers})
    return json.dumps(key)


# ---- reading a grid ----------------------------------------------------------------------------------------------


def grid_descriptions() -> dict[str, tuple[str, str]]:
    """Shipped grid name -> (its description, its measured run time)."""
    return shipped_descriptions(GRIDS)


def read_grid(name_or_path: str, registry: Registry = default_registry, **overrides: Any) -> GenerationGrid:
    """A shipped grid by name or a TOML file, `overrides` (None: not given; a flag's problem names the flag)
    applied, checked whole."""
    raw, source = read_grid_toml(name_or_path, GRIDS, "generation grid")
    model = raw.get("model")
    if isinstance(model, str) and Path(name_or_path).is_file() and ("/" in model or model.startswith(".")):
        raw["model"] = str((Path(name_or_path).parent / Path(model).expanduser()).resolve())  # the file's folder's
    given = {key: value for key, value in overrides.items() if value is not None}
    named = list(given)  # the flags as given (--hybrid-layers rewrites the methods)
    if "hybrid_layers" in given:  # --hybrid-layers: every method's (a table's own `hybrid_layers` replaced)
        layers = given.pop("hybrid_layers")
        methods = given.get("methods", raw.get("methods", []))
        tables = [m if isinstance(m, dict) else {"name": m} for m in (methods if isinstance(methods, list) else [methods])]
        given["methods"] = [t if _exact(t) else {**t, "hybrid_layers": layers} for t in tables]
    if given:  # the grid as run is no longer the file's: its description and measured time do not describe it
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in named)
        raw = {**{k: v for k, v in raw.items() if k != "measured_run_time"}, **given,
               "description": f"{raw['name']} with {flags} given on the command line"}  # fmt: skip
    return parse_grid(raw, source, registry, flags=set(given))


def _flag(key: str, flags: set[str]) -> str:
    return f"--{key.replace('_', '-')}" if key in flags else key


def _numbers(raw: dict[str, Any], key: str, kind: type, least: float, most: float | None = None,
             single: bool = False) -> tuple[tuple, list[str]]:  # fmt: skip
    values = raw.get(key)
    values = values if isinstance(values, list) else [values]
    good = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and (kind is float or isinstance(v, int))
            and v >= least and (most is None or v <= most)]  # fmt: skip
    if len(good) != len(values) or not good or (single and isinstance(raw.get(key), list)):
        bound = f"in [{least}, {most}]" if most is not None else f">= {least}"
        what = f"a {'number' if kind is float else 'whole number'} {bound}"
        return (), [f"{key}: expected {what}{'' if single else ' or a non-empty list of them'}, got {raw.get(key)!r}"]
    return tuple(dict.fromkeys(kind(v) for v in good)), []


def parse_grid(raw: dict[str, Any], source: str = "grid", registry: Registry = default_registry,
               flags: set[str] = frozenset()) -> GenerationGrid:  # type: ignore[assignment]
    """Check a grid's keys and values (ConfigError lists every problem, a flag's by the flag) and resolve it."""
    problems: list[str] = []

    def add(key: str, found: list[str]) -> None:
        problems.extend(f"{_flag(key, flags)}{p[len(key):]}" if p.startswith(key) else p for p in found)

    for key in raw:
        if key not in KEYS:
            problems.append(f"{key}: unknown key (known: {', '.join(KEYS)}).{did_you_mean(key, list(KEYS))}")
    problems += [f"{key}: missing" for key in ("tasks", "seq_lens", "methods") if key not in raw]
    seq_lens, found = _numbers(raw, "seq_lens", int, 16) if "seq_lens" in raw else ((), [])
    add("seq_lens", found)
    samples, found = _numbers({"samples": raw.get("samples", 10)}, "samples", int, 1, single=True)
    add("samples", found)
    block, found = _numbers({"block": raw.get("block", 5)}, "block", int, 1, single=True)
    add("block", found)
    keep, found = _numbers({"keep": raw.get("keep", [0.5, 0.25, 0.125, 0.0625])}, "keep", float, 1e-6, 1.0)
    add("keep", found)
    forced, found = _numbers({"continuation_tokens": raw.get("continuation_tokens", 64)}, "continuation_tokens", int, 1, single=True)
    add("continuation_tokens", found)
    answer, found = ((None,), []) if raw.get("answer_tokens") is None else _numbers(
        {"answer_tokens": raw["answer_tokens"]}, "answer_tokens", int, 1, single=True)
    add("answer_tokens", found)
    seed, found = _numbers({"seed": raw.get("seed", 0)}, "seed", int, 0, single=True)
    add("seed", found)
    rule = raw.get("budget_rule", BUDGET_RULES[0])
    if rule not in BUDGET_RULES:
        hint = did_you_mean(str(rule), list(BUDGET_RULES))
        problems.append(f"{_flag('budget_rule', flags)}: {rule!r} is not one of {', '.join(BUDGET_RULES)}.{hint}")
    stop = raw.get("stop", STOPS[0])
    if stop not in STOPS:
        problems.append(f"{_flag('stop', flags)}: {stop!r} is not one of {', '.join(STOPS)}.{did_you_mean(str(stop), list(STOPS))}")
    protocols = raw.get("protocols", [PROTOCOLS[0]])
    protocols = protocols if isinstance(protocols, list) else [protocols]
    if not protocols:
        problems.append(f"{_flag('protocols', flags)}: empty; name {' or '.join(PROTOCOLS)}")
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            hint = did_you_mean(str(protocol), list(PROTOCOLS))
            problems.append(f"{_flag('protocols', flags)}: {protocol!r} is not one of {', '.join(PROTOCOLS)}.{hint}")
    tasks, jsonl_rows = _tasks(raw.get("tasks"), problems, _flag("tasks", flags)) if "tasks" in raw else ((), {})
    methods = _methods(raw.get("methods"), registry, problems, _flag("methods", flags)) if "methods" in raw else ()
    for method in methods:
        if method.protocols and not set(method.protocols) & set(protocols):
            problems.append(f"{_flag('methods', flags)}: {method.label()} runs under {', '.join(method.protocols)} "
                            f"alone, none of the grid's protocols ({', '.join(map(str, protocols))})")  # fmt: skip
    problems += oversized(methods, seq_lens, registry, _flag("methods", flags))
    problems += unquantizable(methods, str(rule), registry, _flag("methods", flags))
    if (problem := name_problem(str(raw.get("name", "")))) is not None:
        problems.append(f"name: {problem}")
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        problems.append(f"model: expected a known model's name (e.g. \"Gemma-3-270M\") or a model folder, got {model!r}")
    if problems:
        raise ConfigError(source, problems)
    return GenerationGrid(
        str(raw["name"]), tasks, seq_lens, samples[0], tuple(dict.fromkeys(protocols)), keep, methods, block[0],
        forced[0], answer[0], seed[0], str(rule), str(stop), jsonl_rows, raw, model=model,
    )  # fmt: skip


def _tasks(raw: Any, problems: list[str], where: str) -> tuple[tuple[str, ...], dict[str, int]]:
    items = raw if isinstance(raw, list) else [raw]
    tasks, rows = [], {}
    for item in items:
        if not isinstance(item, str) or not item:
            problems.append(f"{where}: expected task names, got {item!r}")
        elif item == JSONL:
            problems.append(f"{where}: jsonl: needs a path, e.g. jsonl:mine.jsonl")
        elif item.startswith(JSONL):
            item = JSONL + str(Path(item[len(JSONL):]).resolve())  # absolute: a resume or report from anywhere
            try:
                rows[item] = len(read_jsonl(Path(item[len(JSONL):])))
                tasks.append(item)
            except TaskError as error:
                problems.append(f"{where}: {error}")
        elif item not in TASKS:
            known = ", ".join(TASKS)
            problems.append(f"{where}: unknown task {item!r} (known: {known}, or jsonl:PATH).{did_you_mean(item, list(TASKS))}")
        else:
            tasks.append(item)
    if not items:
        problems.append(f"{where}: empty; name at least one task")
    for alias, name in TASK_ALIASES.items():  # one task twice would count its samples twice in every pooled figure
        if alias in tasks and name in tasks:
            problems.append(f"{where}: {alias} and {name} are one task ({alias} is its earlier name): give one of them")
    return tuple(dict.fromkeys(tasks)), rows


def _exact(table: dict[str, Any]) -> bool:
    """A method table that is the exact model (full, unquantized): it keeps the model's own windows."""
    return table.get("name") == "full" and table.get("quantize", "none") == "none"


def _methods(raw: Any, registry: Registry, problems: list[str], where: str) -> tuple[MethodSpec, ...]:
    """The sweep's variant grammar, each table's `prefill` and `dense_layers` taken out first; every method must be
    able to generate causally on the CPU."""
    items = raw if isinstance(raw, list) else [raw]
    placed, stripped = [], []
    for index, item in enumerate(items):
        table = item if isinstance(item, dict) else {"name": item}
        if isinstance(table.get("name"), str) and table["name"] not in method_names(registry):
            problems.append(f"{where}: {unknown_method(table['name'], registry)}")
            continue
        if table.get("name") in ALIASES:  # the paper's name, and what a table changes of its setting: quest(top_k=3)
            table = _alias_table(table, registry, problems, where)
        name = table.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}[{index}]: a [[methods]] table needs a `name` (the variant, or "
                            f"{' or '.join(ALIASES)}), got {item!r}")  # fmt: skip
            continue
        prefill = table.get("prefill", default_prefill(name) if isinstance(name, str) else "dense")
        dense = table.get("dense_layers", 0)
        label = table.get("label", "")
        decode = table.get("decode", "own")
        quantize = table.get("quantize", "none")
        runs_under = table.get("protocols", [])
        layers = table.get("hybrid_layers", "global")
        at = f"{where}[{index}] ({name})"
        if layers not in LAYERS:
            problems.append(f"{at}: hybrid_layers must be one of {', '.join(map(repr, LAYERS))} (a hybrid model's "
                            f"global layers, or its sliding-window layers too), got {layers!r}")  # fmt: skip
            layers = "global"
        if not isinstance(runs_under, list) or not all(p in PROTOCOLS for p in runs_under):
            problems.append(f"{at}: protocols must be a list of {', '.join(PROTOCOLS)} (the grid's protocols it runs "
                            f"under; none: all), got {runs_under!r}")  # fmt: skip
            runs_under = []
        if quantize not in QUANTIZE:
            hint = did_you_mean(str(quantize), list(QUANTIZE))
            problems.append(f"{at}: quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}.{hint}".rstrip("."))
        if not isinstance(label, str):
            problems.append(f"{at}: label must be text, got {label!r}")
            label = ""
        if prefill not in PREFILLS:
            problems.append(f"{at}: prefill must be one of {', '.join(PREFILLS)}, got {prefill!r}")
        if _exact(table) and layers != "global":
            problems.append(f"{at}: full keeps the model's own sliding windows (it is the exact model); drop "
                            "hybrid_layers from it")  # fmt: skip
        if name == "full" and (prefill != "dense" or decode != "own"):
            problems.append(f"{at}: full is the exact model, always run with its exact prompt and KV cache; drop "
                            "prefill/decode from it")  # fmt: skip
        if decode not in DECODES:
            problems.append(f"{at}: decode must be one of {', '.join(DECODES)}, got {decode!r}")
        elif decode == "exact" and prefill == "dense":
            problems.append(f"{at}: decode = \"exact\" after an exact prompt is the exact model (full); give prefill = "
                            "\"own\" (its sparse prefill, then exact decoding)")  # fmt: skip
        if not isinstance(dense, int) or isinstance(dense, bool) or dense < 0:
            problems.append(f"{at}: dense_layers must be a whole number >= 0, got {dense!r}")
        stripped.append({k: v for k, v in table.items() if k not in METHOD_KEYS})
        placed.append((prefill, dense, label, decode, quantize, tuple(runs_under), layers))
    methods = []
    for (prefill, dense, label, decode, quantize, runs_under, layers), table in zip(placed, stripped):
        specs, found = parse_variants([table], registry, where)
        problems += found
        for spec in specs:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
            why = variant.unsupported_reason(device="cpu", dtype="float32", causal=True, padded=False, n_q=64, n_k=64,
                                             decode=variant.decodes(), in_model=True)  # fmt: skip
            if why is not None:
                problems.append(f"{where}: {spec.label()} cannot generate inside the model (causal, CPU): {why}")
            elif not variant.decodes() and prefill == "dense":
                problems.append(f"{where}: {spec.label()} has no decode form: with prefill = \"dense\" it would be exact "
                                "decoding (full); give prefill = \"own\" (its sparse prefill, then exact decoding)")
            else:
                own = decode == "own" and variant.decodes()  # a variant without a decode form decodes exactly
                methods.append(MethodSpec(spec, prefill, dense, label if len(specs) == 1 else "", "own" if own else "exact",
                                          quantize, runs_under, layers))  # fmt: skip
    if isinstance(raw, list) and not raw:
        problems.append(f"{where}: empty; name at least one method (full gives the exact model's own answers)")
    exact = MethodSpec(VariantSpec("full"), "dense")
    methods = list(dict.fromkeys([exact, *methods]))  # the exact model always: its accuracy stands beside every figure
    problems += same_settings(methods, where)
    labels = [m.label() for m in methods]
    clashes = sorted({label for label in labels if labels.count(label) > 1})
    if clashes:
        problems.append(f"{where}: two methods are labelled {', '.join(map(repr, clashes))} (the exact model is "
                        "`full`): give each its own label, or drop the repeat")  # fmt: skip
    return tuple(methods)


def oversized(methods: tuple[MethodSpec, ...], seq_lens: tuple[int, ...], registry: Registry, where: str) -> list[str]:
    """A knob set by hand to keep more positions than the longest context (`band(window=100000)` at N = 512): it
    keeps everything, as the exact model does, while its buffers are sized by the knob (a run out of memory). A user's
    rows (no N) are not checked."""
    if not seq_lens:
        return []
    longest, problems = max(seq_lens), []
    for method in methods:
        knob = knob_of(method.variant.name, registry)
        params = dict(method.variant.params)
        if knob is None or knob.parameter not in params:
            continue
        own = {k: spec.default for k, spec in registry.load(method.variant.name).hyperparameters.items()} | params
        per = own.get("block_size", 1) if knob.reads_only else 1  # Quest's top_k counts pages
        if params[knob.parameter] * per > longest:
            problems.append(f"{where}: {method.label()}: {knob.parameter}={params[knob.parameter]} keeps more than the "
                            f"longest context (N={longest}): that is the exact model (full); give at most "
                            f"{longest // per}")  # fmt: skip
    return problems


def unquantizable(methods: tuple[MethodSpec, ...], rule: str, registry: Registry, where: str) -> list[str]:
    """A method with `quantize` whose state cannot become a quantized cache after the prompt: that takes a set of
    kept positions, one count for every head, which only appends from then on (`kept.appends_after_prompt`) — the
    exact model's cache, exact decoding's, what an eviction method kept (a window and H2O under kvpress's rule only:
    under fixed-total they evict as they step)."""
    problems = []
    for method in methods:
        name, params = method.variant.name, dict(method.variant.params)
        if method.quantize == "none" or method.decode == "exact" or (name == "full" and params.get("kv_cache", True)):
            continue
        knob = knob_of(name, registry)
        if params.get("heads") == "adaptive" or (knob is not None and knob.of_length):
            why = ("its heads keep different numbers of positions (AdaKV's adaptive heads, DuoAttention's streaming "
                   "heads: a ragged cache), a quantized cache one number for every head")  # fmt: skip
        elif knob is None or knob.reads_only or knob.of_share:
            why = ("its state is not a set of kept positions (quantize composes with full, exact decoding and the "
                   "methods that keep positions: a window, H2O, the presses)")  # fmt: skip
        elif rule == "fixed-total" and not knob.appends:
            why = ("under the fixed-total rule it evicts as it steps, and a quantized cache only appends: give "
                   "budget_rule = \"kvpress\" (compressed once, then appended) or drop quantize")  # fmt: skip
        else:
            continue
        problems.append(f"{where}: {method.label()} cannot be quantized: {why}")
    return problems


def same_settings(methods: list[MethodSpec], where: str = "methods") -> list[str]:
    """Two methods under different labels that run one setting (`streamingllm` and `band(sinks=4)`,
    `quest(token_budget=64)` and `quest(top_k=3)`): their rows would share keys and the report keep one label."""
    seen: dict[tuple, str] = {}
    problems = []
    for method in methods:
        setting = (VariantSpec(method.variant.name, tuple(sorted(method.variant.params))), method.prefill,
                   method.dense_layers, method.decode, method.quantize, method.layers)  # fmt: skip
        if setting in seen and seen[setting] != method.label():
            problems.append(f"{where}: {seen[setting]} and {method.label()} are one setting: give one of them")
        seen.setdefault(setting, method.label())
    return problems


# ---- the papers' names -------------------------------------------------------------------------------------------


def method_names(registry: Registry = default_registry) -> list[str]:
    """Every name a grid's methods may take: the registry's variants, then the papers' names (ALIASES)."""
    return [*registry.names(), *ALIASES]


def unknown_method(name: str, registry: Registry = default_registry) -> str:
    """The problem of a method name that is neither a variant nor a paper's name: the closest names, then all (a
    press that needs downloaded weights: why it is not offered)."""
    if (refusal := download_refusal(name)) is not None:
        return refusal
    papers = ", ".join(f"{alias} ({setting['name']})" for alias, setting in ALIASES.items())
    return (f"unknown method {name!r}.{did_you_mean(name, method_names(registry))} Available: "
            f"{', '.join(registry.names())}; the papers' names, settings of a variant: {papers} (`attnbench list`)")  # fmt: skip


def alias_method(alias: str) -> MethodSpec:
    """What a paper's name runs when a table changes nothing: its variant's setting and how it sits in the model."""
    name, dense = ALIASES[alias]["name"], ALIASES[alias].get("dense_layers", 0)
    setting = {k: v for k, v in ALIASES[alias].items() if k not in ("name", "dense_layers")}
    return MethodSpec(VariantSpec(name, tuple(setting.items())), default_prefill(name), dense)


def alias_parameters_text(alias: str, registry: Registry = default_registry) -> str:
    """The names an alias takes, said in its terms: its paper's, then its variant's own, then the grid's keys."""
    variant = ALIASES[alias]["name"]
    papers = ", ".join(PAPER_PARAMETERS.get(alias, {})) or "none"
    own = ", ".join(registry.load(variant).hyperparameters)
    return f"{alias} takes its paper's {papers}; or {variant}'s own {own}; and {', '.join(METHOD_KEYS)}"


def _alias_table(table: dict[str, Any], registry: Registry, problems: list[str], where: str) -> dict[str, Any]:
    """An alias's table as its variant's: the alias's setting, what the table changes of it (its paper's parameter
    names mapped onto the variant's, in PAPER_PARAMETERS' order; the variant's own names as they are), labelled with
    the change as given (`quest(token_budget=64)`). A wrong name or value is answered in the alias's terms and left
    out."""
    alias, setting = table["name"], ALIASES[table["name"]]
    papers = PAPER_PARAMETERS.get(alias, {})
    own = registry.load(setting["name"]).hyperparameters
    given = {k: v for k, v in table.items() if k not in ("name", "label")}
    changed = {k: v for k, v in given.items() if k not in ("protocols", "quantize", "hybrid_layers")}  # where it
    # runs, not what
    label = alias + (f"({', '.join(f'{k}={v}' for k, v in changed.items())})" if changed else "")
    label += f" + {given['quantize']}" if given.get("quantize", "none") != "none" else ""
    label += " [every layer]" if given.get("hybrid_layers", "global") == "all" else ""
    at = f"{where}: {label}"
    out = {**setting, "label": table.get("label", label)}
    for key, value in given.items():
        if key in own or key in METHOD_KEYS:
            out[key] = value
        elif key not in papers:
            hint = did_you_mean(key, [*papers, *own])
            problems.append(f"{at}: unknown parameter {key!r}.{hint} {alias_parameters_text(alias, registry)}")
    resolved = {k: spec.default for k, spec in own.items()} | out
    for key, parameter in papers.items():
        if key not in given:
            continue
        if parameter.sets in given:
            problems.append(f"{at}: {key} is {parameter.sets} in {setting['name']}'s terms: give one of them")
        elif (problem := parameter.problem(key, given[key])) is not None:
            problems.append(f"{at}: {problem}")
        elif parameter.sets == "top_k" and given[key] < resolved["block_size"]:  # less than the current page alone
            problems.append(f"{at}: token_budget must be at least the page size ({resolved['block_size']}: a step "
                            f"reads its current page whole), got {given[key]}")  # fmt: skip
        else:
            value = given[key] if parameter.value is None else parameter.value(given[key], resolved)
            out[parameter.sets] = resolved[parameter.sets] = value
    return out
