"""The body of `attnbench model`: arguments checked before any model loads, each length's memory estimated
before any forward pass, the study run length by length and variant by variant (model.csv rewritten after each,
so an interrupt keeps what finished), then the table and the report."""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time as clock
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from attnbench.exit_status import Exit
from attnbench.plan.cells import VariantSpec

if TYPE_CHECKING:
    from torch import Tensor

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")



def device_of(args: argparse.Namespace) -> str:
    """Where the study runs: --device (cpu unless asked)."""
    return getattr(args, "device", "cpu")

def requested_lengths(args: argparse.Namespace) -> list[int]:
    """--seq-len's lengths, each once, shortest first (given as `--seq-len 2048 4096` or `--seq-len 2048,4096`)."""
    return sorted({n for group in args.seq_len for n in group})


def argument_problems(args: argparse.Namespace, specs: list[VariantSpec]) -> tuple[list[str], str | None, Any]:
    """Every problem with the arguments, found without reading the model's weights or tokenizing; the text to
    tokenize and the model's config (None when it cannot be read)."""
    from attnbench.model.capture import CaptureError, model_config
    from attnbench.model.study import spec_problems

    problems = spec_problems(specs)
    lengths = requested_lengths(args)
    if not lengths or min(lengths) < 2:
        problems.append(f"--seq-len: every length must be >= 2, got {' '.join(map(str, lengths)) or 'none'}")
    if not 0 < args.min_run_time < math.inf:
        problems.append(f"--min-run-time must be a finite number > 0, got {args.min_run_time:g}")
    if args.memory_limit_gb is not None and not 0 < args.memory_limit_gb < math.inf:
        problems.append(f"--memory-limit-gb must be a finite number > 0, got {args.memory_limit_gb:g}")
    import torch

    if device_of(args) == "cuda" and not torch.cuda.is_available():
        problems.append("--device cuda: CUDA is not available here (a CPU build of torch, or no GPU)")
    if args.random_tokens is not None and args.random_tokens < 2:
        problems.append(f"--random-tokens must be >= 2, got {args.random_tokens}")
    if args.token_ids is not None and (len(args.token_ids) < 2 or min(args.token_ids) < 0):
        problems.append("--token-ids: give at least 2 ids, each >= 0")
    text = args.text
    if args.text_file is not None:
        try:
            text = args.text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            problems.append(f"--text-file {args.text_file}: cannot be read as UTF-8 text ({error})")
    if text is not None and not text.strip():
        problems.append("the text is empty")
    try:
        config = model_config(args.model_dir, "attnbench model")  # a local folder, its config.json readable
    except CaptureError as error:
        problems.append(str(error))
        config = None
    if config is not None and text is not None and not any((args.model_dir / n).is_file() for n in TOKENIZER_FILES):
        problems.append(f"{args.model_dir} has no tokenizer files for --text: use --token-ids or --random-tokens")
    if config is not None and (problem := no_global_layer(config)) is not None:
        problems.append(f"{args.model_dir}: {problem}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        problems.append(f"--out {args.out}: {error.strerror or error}")
    return problems, text, config


def no_global_layer(config: Any) -> str | None:
    """Why no variant could change the model (every layer keeps its sliding window: Mistral with a window), or
    None."""
    from attnbench.model.layer_kinds import global_layers, layer_windows

    windows = layer_windows(config)
    if not windows or global_layers(config):
        return None
    return (f"every one of its {len(windows)} layers attends through a sliding window of {windows[0]} positions, "
            "which the study keeps as the model's own (a variant goes into global layers only): no variant would "
            "change anything")


def swapped_where(layout: str | None, per_layer: bool) -> str:
    """Where a variant goes, as the progress line says it: every layer, or a hybrid model's global layers."""
    where = "every layer" if layout is None else "every global layer (the sliding-window layers keep their window)"
    return where + (f" + each {'global ' if layout else ''}layer alone" if per_layer else "")


def input_problems(config: Any, ids: Tensor, lengths: list[int]) -> list[str]:
    """What the model cannot take of the tokens at the lengths that will run: ids past its vocabulary, lengths past
    its positions."""
    problems = []
    vocabulary = getattr(config, "vocab_size", None)
    if vocabulary and int(ids.max()) >= vocabulary:
        problems.append(f"token id {int(ids.max())} is out of the model's vocabulary ({vocabulary} ids)")
    limit = getattr(config, "max_position_embeddings", None)
    beyond = [n for n in lengths if limit and n > limit]
    if beyond:
        problems.append(f"--seq-len {' '.join(map(str, beyond))}: the model has {limit} positions; lower --seq-len")
    if lengths[-1] < 2:
        problems.append(f"the input gives {lengths[-1]} token(s); attention needs at least 2")
    return problems


def text_source(args: argparse.Namespace) -> str:
    if args.text_file:
        return f"--text-file {args.text_file}"
    if args.text:
        return "--text"
    return "--token-ids" if args.token_ids else f"--random-tokens (seed {args.seed})"


def lengths_to_run(requested: list[int], available: int) -> list[int]:
    """The requested lengths, each cut to the tokens the input gives (a length past it runs at all of them)."""
    return sorted({min(n, available) for n in requested})


def memory_problems(model: object, lengths: list[int], specs: list[VariantSpec], args: argparse.Namespace,
                    causal: bool) -> tuple[list[str], dict]:  # fmt: skip
    """The lengths whose estimated peak exceeds the memory limit, each with its figures; and the estimates."""
    from attnbench.measure.group import memory_limit
    from attnbench.model.memory import ModelShape, estimated_peak_bytes
    from attnbench.model.study import HEAD_CHECK_TOKENS
    from attnbench.plan.config import Settings
    from attnbench.registry import registry

    variants = [registry.create("full")]  # the exact model's
    for spec in specs:
        try:
            variant = registry.create(spec.name, seed=0, **dict(spec.params))
        except Exception:  # its row says why
            continue
        if variant.unsupported_reason(device=device_of(args), dtype="float32", causal=causal, padded=False,
                                      n_q=lengths[-1], n_k=lengths[-1], backward=False) is None:  # fmt: skip
            variants.append(variant)
    limit, source = memory_limit(Settings(memory_limit_gb=args.memory_limit_gb), device_of(args))
    if args.memory_limit_gb is not None:
        source = f"--memory-limit-gb {args.memory_limit_gb:g}"
    shape = ModelShape.of(model)
    estimates = {n: estimated_peak_bytes(shape, n, variants, causal=causal, single_layers=args.per_layer,
                                         head_check_tokens=HEAD_CHECK_TOKENS if n == lengths[0] else 0)
                 for n in lengths}  # fmt: skip
    gib = 2**30
    problems = [
        f"--seq-len {n}: estimated peak memory {estimate / gib:.1f} GiB exceeds the limit {limit / gib:.1f} GiB "
        f"({source}): lower --seq-len" + (", leave out --per-layer" if args.per_layer else "")
        + " or set --memory-limit-gb"
        for n, estimate in estimates.items()
        if estimate > limit
    ]
    return problems, {"limit_bytes": limit, "limit_source": source, "estimated_peak_bytes": estimates}


def model_command(args: argparse.Namespace, width: int) -> int:
    """`attnbench model`: check every argument before the model loads and every length's memory before any
    forward pass; at each length, swap each variant setting into the model (every layer, a hybrid model's global
    ones; each layer alone with
    --per-layer; timed with --time), write model.csv after each, then the table (`width` columns) and the
    report. Returns the exit status."""
    from attnbench.measure.machine import machine_info
    from attnbench.model.capture import CaptureError, _tokens
    from attnbench.model.report import write_model_report
    from attnbench.model.study import (
        NATIVE_TOLERANCE,
        ModelStudy,
        ModelStudyError,
        is_causal_model,
        load_model,
        masked_inputs,
        swap_layout,
        write_rows,
    )
    from attnbench.runfolder.folder import new_run_dir, write_json_atomic

    try:
        try:
            specs = list(dict.fromkeys(VariantSpec.parse(args.variants)))
        except ValueError as error:
            raise ModelStudyError(f"--variants: {error}") from None
        problems, text, config = argument_problems(args, specs)
        if problems:
            raise ModelStudyError("; ".join(problems))
        ids = _tokens(args.model_dir, config, text=text, token_ids=args.token_ids,
                      random_tokens=args.random_tokens, seed=args.seed)  # fmt: skip
        available = int(ids.shape[-1])
        requested = requested_lengths(args)
        lengths = lengths_to_run(requested, available)
        problems = input_problems(config, ids, lengths)
        if problems:
            raise ModelStudyError("; ".join(problems))
        if lengths[-1] < requested[-1]:
            print(f"attnbench: the input gives {available} tokens: --seq-len "
                  f"{' '.join(str(n) for n in requested if n > available)} cut to {available}",
                  file=sys.stderr)  # fmt: skip
        print(f"attnbench: loading {args.model_dir}…", file=sys.stderr, flush=True)
        model, kind = load_model(args.model_dir)
        model = model.to(device_of(args))
        too_big, memory = memory_problems(model, lengths, specs, args, is_causal_model(model))
        if too_big:
            raise ModelStudyError("; ".join(too_big))
    except (ModelStudyError, CaptureError) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    labels = ids
    if kind == "masked-lm":
        from transformers import AutoTokenizer

        try:
            mask_id = AutoTokenizer.from_pretrained(str(args.model_dir), local_files_only=True).mask_token_id
        except Exception:
            mask_id = None
        ids, labels = masked_inputs(ids, mask_id, args.seed)  # drawn in order: each length's are the longest's first

    def study_at(n: int) -> ModelStudy:
        timing = args.min_run_time if args.time else None
        return ModelStudy(model, kind, ids[:, :n].to(device_of(args)),
                          None if labels is None else labels[:, :n].to(device_of(args)),
                          single_layers=args.per_layer, min_run_time=timing)  # fmt: skip

    def exact_at(n: int) -> ModelStudy:
        began = clock.perf_counter()
        print(f"attnbench: [{n} tokens] the exact model and its native check…", file=sys.stderr, end="", flush=True)
        try:
            return study_at(n)
        finally:
            print(f" {clock.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)

    started = clock.perf_counter()
    try:
        study = exact_at(lengths[0])
        head = study.head_check()
        if head is not None and not head.worst() < NATIVE_TOLERANCE:
            raise ModelStudyError(
                f"{type(model).__name__}'s logits, a slice of positions at a time, differ from transformers' own by "
                f"{head.logits_difference:.2g} (loss: {head.loss_difference or 0.0:.2g}, relative): its head does more "
                "than its output embeddings' projection (soft-capping, a logit scale); not supported"
            )
    except ModelStudyError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    run_dir = new_run_dir(args.out, f"model-{args.model_dir.resolve().name}")
    layout = swap_layout(model.config)  # None: no sliding-window layer
    if layout is not None:
        print(f"attnbench: {args.model_dir.name}: {layout}", file=sys.stderr)
    meta = {
        "command": args.command_line,
        "started": clock.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {"dir": str(args.model_dir), "type": model.config.model_type, "kind": kind, "layers": study.layers,
                  "causal": study.causal, "layout": layout},  # fmt: skip
        "seq_lens": lengths,
        "tokens_available": available,
        "text_source": text_source(args),
        "per_layer": args.per_layer,
        "timed": args.time,
        "head_check": None if head is None else asdict(head),
        "native_check": {},  # per length: exact attention through attnbench against the model's own SDPA
        "native_tolerance": NATIVE_TOLERANCE,
        "memory": memory,
        "dtype": "float32",
        "machine": machine_info([device_of(args)]),
    }
    passes = swapped_where(layout, args.per_layer) + (", timed" if args.time else "")
    print(f"attnbench: {len(specs)} variant setting(s) × {len(lengths)} length(s) ({', '.join(map(str, lengths))} "
          f"tokens), {passes} -> {run_dir}/", file=sys.stderr)  # fmt: skip
    rows = []
    try:
        for position, n in enumerate(lengths):
            if position:
                try:
                    study = exact_at(n)
                except ModelStudyError as error:
                    print(f"attnbench: {n} tokens left out: {error}", file=sys.stderr)
                    meta.setdefault("refused_lengths", {})[str(n)] = str(error)
                    continue
            meta["native_check"][str(n)] = asdict(study.native)
            write_json_atomic(run_dir / "meta.json", meta)
            for index, spec in enumerate(specs, start=1):
                began = clock.perf_counter()
                print(f"attnbench: [{n} tokens] [{index}/{len(specs)}] {spec.label()}…", file=sys.stderr, end="",
                      flush=True)  # fmt: skip
                rows += study.rows(spec)
                print(f" {clock.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
                write_rows(run_dir / "model.csv", rows)  # after each: an interrupted study keeps what it has
            del study
    except KeyboardInterrupt:
        kept = (f"{run_dir}/model.csv has the variants finished so far" if rows
                else f"no variant had finished: {run_dir}/ holds only meta.json")  # fmt: skip
        print(f"\nattnbench: interrupted; {kept}", file=sys.stderr)
        return Exit.INTERRUPTED
    meta["finished"] = clock.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["memory"]["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    write_json_atomic(run_dir / "meta.json", meta)
    if not rows:
        print("attnbench: no length could be studied", file=sys.stderr)
        return Exit.USAGE
    from attnbench.model.report import read_model_rows, summary_rows
    from attnbench.report.text import aligned_table

    headers, table = summary_rows(read_model_rows(run_dir))
    print(aligned_table(headers, table, width=width, breakable=(len(headers) - 1, 0)))
    report = write_model_report(run_dir)
    print(f"attnbench: {len(specs)} variant setting(s) × {len(lengths)} length(s) in "
          f"{clock.perf_counter() - started:.0f} s -> {run_dir}/ (model.csv, meta.json, report.md, plots/)",
          file=sys.stderr)  # fmt: skip
    print(f"attnbench: report: {report}", file=sys.stderr)
    ok = any(row.status == "ok" for row in rows)
    return Exit.OK if ok else Exit.NOTHING_RAN
