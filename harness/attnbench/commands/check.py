"""`attnbench check`: the registry-wide conformance checks (attnbench.conformance) on one variant, in float64 and
float32, for variant authors."""

from __future__ import annotations

import argparse
import sys

from attnbench.exit_status import Exit
from attnbench.registry import registry


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """The `check` verb: a variant's name and its hyperparameters."""
    check = subparsers.add_parser(
        "check",
        help="run the conformance checks on a variant (for variant authors)",
        description="The registry-wide conformance checks on one variant, in float64 and float32.",
        epilog="exit status: 0 every check passed or was skipped; 1 a check failed; 2 unknown variant, bad "
        "hyperparameter, or the variant cannot be checked on this machine (e.g. CUDA-only without CUDA)",
    )
    check.add_argument("name", help="a registered variant name (see `attnbench list`)")
    check.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter, as a TOML value (e.g. --param window=64 --param backend='\"flex\"')",
    )


def main(args: argparse.Namespace) -> int:
    """The variant built first (a bad name or hyperparameter is a usage error), then every check in each precision
    this machine offers; exit 1 when one fails."""
    from attnbench.conformance import CHECKS, check_contexts, run_check
    from attnbench.interface import VariantError
    from attnbench.plan.cells import parse_params
    from attnbench.report.text import markdown_table

    try:
        try:
            params = parse_params(args.param)
        except ValueError as error:
            raise ValueError(f"--param {error}") from None
        variant_class = registry.load(args.name)
        problems = variant_class.validate_hyperparams(params)
        if problems:
            raise ValueError(f"--param: invalid hyperparameters for {args.name}: {'; '.join(problems)}")
        variant_class(seed=0, **params)  # a constructor that raises is reported here
    except (ValueError, VariantError) as error:
        print(f"attnbench: {error}", file=sys.stderr)
        return Exit.USAGE
    except Exception as error:
        print(f"attnbench: could not build {args.name}: {type(error).__name__}: {error}", file=sys.stderr)
        return Exit.USAGE
    contexts = check_contexts(lambda: variant_class(seed=0, **params))
    if isinstance(contexts, str):
        print(f"attnbench: {args.name} cannot be checked on this machine: {contexts}", file=sys.stderr)
        return Exit.USAGE
    failed, total = [], 0
    for ctx in contexts:  # float64 and float32: a NaN or a leak may show in one precision only
        dtype = str(ctx.dtype).removeprefix("torch.")
        results = [run_check(name, ctx) for name in CHECKS]
        print(f"{args.name} on {ctx.device.type}, {dtype}:")
        print(markdown_table(["check", "result", "detail"], [[r.check, r.status, r.detail] for r in results]))
        failed += [f"{r.check} ({dtype})" for r in results if r.status == "fail"]
        total += len(results)
    print(
        f"{total - len(failed)} passed or skipped, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else "")
    )
    return Exit.REGRESSION if failed else Exit.OK
