"""The body of `attnbench model`: arguments checked before any model loads, the study run variant by variant
(model.csv rewritten after each, so an interrupt keeps what finished), then the table and the report."""

from __future__ import annotations

import argparse
import math
import sys
import time as clock

from attnbench.exit_status import Exit
from attnbench.plan.cells import VariantSpec


def model_command(args: argparse.Namespace, width: int) -> int:
    """`attnbench model`: check every argument before the model loads, swap each variant setting into the model
    (every layer, then each layer alone), write model.csv after each, then the table (`width` columns) and the
    report. Returns the exit status."""
    from attnbench.measure.machine import machine_info
    from attnbench.model.capture import CaptureError, _tokens, model_config
    from attnbench.model.report import write_model_report
    from attnbench.model.study import (
        ModelStudy,
        ModelStudyError,
        load_model,
        masked_inputs,
        spec_problems,
        write_rows,
    )
    from attnbench.runfolder.folder import new_run_dir, write_json_atomic

    try:
        try:
            specs = list(dict.fromkeys(VariantSpec.parse(args.variants)))
        except ValueError as error:
            raise ModelStudyError(f"--variants: {error}") from None
        problems = spec_problems(specs)
        if args.seq_len < 2:
            problems.append(f"--seq-len must be >= 2, got {args.seq_len}")
        if not 0 < args.min_run_time < math.inf:
            problems.append(f"--min-run-time must be a finite number > 0, got {args.min_run_time:g}")
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
            model_config(args.model_dir, "attnbench model")  # a local folder, its config.json readable
            local = True
        except CaptureError as error:
            problems.append(str(error))
            local = False
        if (
            local
            and text is not None
            and not any(
                (args.model_dir / name).is_file()
                for name in ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model")
            )
        ):
            problems.append(f"{args.model_dir} has no tokenizer files for --text: use --token-ids or --random-tokens")
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            problems.append(f"--out {args.out}: {error.strerror or error}")
        if problems:
            raise ModelStudyError("; ".join(problems))
        print(f"attnbench: loading {args.model_dir}…", file=sys.stderr, flush=True)
        model, kind = load_model(args.model_dir)
        ids = _tokens(args.model_dir, model.config, text=text, token_ids=args.token_ids,
                      random_tokens=args.random_tokens, seed=args.seed)[:, : args.seq_len]  # fmt: skip
        vocabulary = getattr(model.config, "vocab_size", None)
        if vocabulary and int(ids.max()) >= vocabulary:
            raise ModelStudyError(f"token id {int(ids.max())} is out of the model's vocabulary ({vocabulary} ids)")
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and ids.shape[-1] > limit:
            raise ModelStudyError(f"{ids.shape[-1]} tokens, but the model has {limit} positions: lower --seq-len")
        if ids.shape[-1] < 2:
            raise ModelStudyError(f"the input gives {ids.shape[-1]} token(s); attention needs at least 2")
        if ids.shape[-1] < args.seq_len:
            print(f"attnbench: the input gives {ids.shape[-1]} tokens (fewer than --seq-len {args.seq_len})",
                  file=sys.stderr)  # fmt: skip
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
        ids, labels = masked_inputs(ids, mask_id, args.seed)
    started = clock.perf_counter()
    try:
        study = ModelStudy(model, kind, ids, labels)
    except ModelStudyError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    run_dir = new_run_dir(args.out, f"model-{args.model_dir.resolve().name}")
    meta = {
        "command": args.command_line,
        "started": clock.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": {
            "dir": str(args.model_dir),
            "type": model.config.model_type,
            "kind": kind,
            "layers": study.layers,
            "causal": study.causal,
        },  # fmt: skip
        "tokens": int(ids.shape[-1]),
        "text_source": "--text-file " + str(args.text_file)
        if args.text_file
        else "--text"
        if args.text
        else "--token-ids"
        if args.token_ids
        else f"--random-tokens (seed {args.seed})",
        "native_check": study.native_difference,
        "dtype": "float32",
        "machine": machine_info(["cpu"]),
    }
    write_json_atomic(run_dir / "meta.json", meta)
    print(f"attnbench: {len(specs)} variant setting(s) × ({study.layers} single-layer swaps + every layer) on "
          f"{ids.shape[-1]} tokens -> {run_dir}/", file=sys.stderr)  # fmt: skip
    rows = []
    try:
        for index, spec in enumerate(specs, start=1):
            print(f"attnbench: [{index}/{len(specs)}] {spec.label()}…", file=sys.stderr, flush=True)
            rows += study.rows(spec, min_run_time=args.min_run_time)
            write_rows(run_dir / "model.csv", rows)  # after each variant: an interrupted study keeps what it has
    except KeyboardInterrupt:
        kept = (f"{run_dir}/model.csv has the variants finished so far" if rows
                else f"no variant had finished: {run_dir}/ holds only meta.json")  # fmt: skip
        print(f"\nattnbench: interrupted; {kept}", file=sys.stderr)
        return Exit.INTERRUPTED
    meta["finished"] = clock.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json_atomic(run_dir / "meta.json", meta)
    from attnbench.model.report import read_model_rows, summary_rows
    from attnbench.report.text import aligned_table

    headers, table = summary_rows(read_model_rows(run_dir))
    print(aligned_table(headers, table, width=width, cuttable=(7, 0)))
    report = write_model_report(run_dir)
    print(f"attnbench: {len(specs)} variant setting(s) in {clock.perf_counter() - started:.0f} s -> {run_dir}/ "
          "(model.csv, meta.json, report.md, plots/)", file=sys.stderr)  # fmt: skip
    print(f"attnbench: report: {report}", file=sys.stderr)
    ok = any(row.status == "ok" for row in rows)
    return Exit.OK if ok else Exit.NOTHING_RAN
