"""`attnbench heads MODEL_DIR`: capture a local causal decoder's own heads on the shipped prose and code, where the
`heads` input (and the presets judging causal accuracy) find them (attnbench.model.heads)."""

from __future__ import annotations

import argparse
import sys

from attnbench.exit_status import Exit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `heads` verb: a model folder, and optionally fewer positions."""
    from attnbench.inputs.heads_cache import heads_root
    from attnbench.model.known import known_names, model_argument
    from attnbench.model.heads import DECODE_HEADROOM, DEPTHS, MAX_POSITIONS

    heads = subparsers.add_parser(
        "heads",
        help="capture a local causal decoder's heads on the shipped prose and code (the `heads` input)",
        description=f"Run a local causal decoder (a Hugging Face folder; nothing is downloaded) once on the shipped "
        f"prose and once on the shipped Python code, and keep the post-rotary q/k/v of {DEPTHS} layers spread over "
        f"its depth (float16; of a hybrid model such as Gemma 3, its global layers alone) in "
        f"{heads_root()}/<folder name>/ ($ATTNBENCH_HEADS moves it). Causal runs then judge "
        "accuracy on them: the presets list `heads` beside `realistic`; a config of your own names "
        '[[inputs]] name = "heads", model = "<folder name>", text = "prose" or "code". `make model` runs it for '
        "SmolLM2-135M (about 40 s on 2 cores, 315 MB), `make model MODEL=gemma-3-270m` for Gemma-3-270M (its 3 "
        "global layers at 32,832 positions: 12 min at nice 19 on a loaded machine, 605 MB). A capture that fails or is stopped leaves "
        "the previous one.",
    )
    heads.add_argument("model_dir", type=model_argument, metavar="MODEL",
                       help=f"a local causal decoder folder, or a known model's name ({known_names()}: its folder as "
                       "`make model` writes it)")  # fmt: skip
    heads.add_argument("--positions", type=int, default=None, metavar="P",
                       help=f"the longest N runs will draw (default: the model's positions, at most {MAX_POSITIONS}, "
                       "fewer where a shipped text is shorter in its tokenizer, said); "
                       f"{DECODE_HEADROOM} more are captured for a decode cell's steps after a prompt of that length")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    """Check the folder and the positions before the model loads; capture; say where the heads are."""
    from attnbench.model.capture import CaptureError, model_config
    from attnbench.model.heads import capture_heads

    if args.positions is not None and args.positions < 2:
        print(f"attnbench: --positions must be >= 2, got {args.positions}", file=sys.stderr)
        return Exit.USAGE
    try:
        model_config(args.model_dir, "attnbench heads")
        if not (args.model_dir / "tokenizer.json").is_file() and not (args.model_dir / "tokenizer.model").is_file():
            raise CaptureError(f"{args.model_dir} has no tokenizer (tokenizer.json or tokenizer.model)")
        folder = capture_heads(args.model_dir, positions=args.positions)
    except CaptureError as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    print(f"attnbench: {args.model_dir.name}'s heads are in {folder}/; causal runs judge accuracy on them "
          f'([[inputs]] name = "heads", model = "{args.model_dir.name}")', file=sys.stderr)  # fmt: skip
    return Exit.OK
