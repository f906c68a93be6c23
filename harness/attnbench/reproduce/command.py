"""`attnbench reproduce`: run each claim's cells (a run folder per claim, resumable), check them, and print and write
the published figure beside ours with a verdict per claim.

Folders: OUT/<claim> (OUT/<claim>-quick with --quick), each an ordinary run folder (`attnbench report` reads it);
a claim whose folder holds a finished run is checked again without running, an unfinished one is resumed, one made
with another setting (an older catalogue) is left alone and said. OUT/reproduce.md (reproduce-quick.md with
--quick): the one-screen table of the claims of this call first, then each claim's setting, figures and run folder.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from attnbench.atomic import write_text_atomic
from attnbench.exit_status import Exit
from attnbench.interface import did_you_mean
from attnbench.plan.config import ConfigError, SweepConfig, parse_config
from attnbench.registry import registry
from attnbench.reproduce.checks import CANNOT, CHECKS, FAILS, HOLDS, TREND, Outcome
from attnbench.reproduce.claims import CLAIMS, Claim
from attnbench.runfolder.folder import RunFolderBusy
from attnbench.runfolder.meta import read_meta
from attnbench.runfolder.results import RunFolderUnreadable, read_results

ACCEPTED = (HOLDS, TREND)  # the exit status is 0 when every claim that could run is one of these


@dataclass(frozen=True)
class Checked:
    """A claim, where its run is, and its outcome."""

    claim: Claim
    folder: Path | None
    outcome: Outcome


def select(names: list[str]) -> list[Claim] | str:
    """The claims named (all when none), or a message naming the unknown ones."""
    known = {claim.id: claim for claim in CLAIMS}
    unknown = [name for name in names if name not in known]
    if unknown:
        hints = "".join(did_you_mean(name, list(known)) for name in unknown)
        return f"unknown claim(s) {', '.join(map(repr, unknown))}.{hints} Known: {', '.join(known)} (see --list)"
    return [known[name] for name in dict.fromkeys(names)] if names else list(CLAIMS)  # each once, in order


def missing_variants(claim: Claim) -> list[str]:
    """The variants its sweep needs that are not registered here."""
    names = set(registry.names())
    return [name for name in claim.variants if name not in names]


def quick_catalogue(claims: list[Claim]) -> tuple[list[Claim], list[Claim]]:
    """The whole catalogue under --quick: (the claims it runs, those it leaves out: `Claim.quick_left_out`)."""
    return [c for c in claims if not c.quick_left_out], [c for c in claims if c.quick_left_out]


def model_missing(claim: Claim) -> str | None:
    """Why a generation claim's model is not here, naming what writes it (None: not a generation claim, or its model
    folder holds a config.json). Its model: the one its grid names (Gemma-3-270M for the claim at 10K), else the
    folder `make model` writes SmolLM2-135M to ($ATTNBENCH_MODEL_DIR where set)."""
    if not claim.generation:
        return None
    from attnbench.generation.grid import parse_grid
    # the known models as generation's preflight names them (reproduce reaches attnbench.model through generation)
    from attnbench.generation.preflight import KNOWN_MODELS, PreflightError, grid_model_dir, known_for_folder

    try:
        folder = grid_model_dir(parse_grid(claim.grid_config(), source=f"claim {claim.id}"))
    except PreflightError as error:
        return str(error)
    if (folder / "config.json").is_file():
        return None
    known = known_for_folder(folder)
    fetch = (f"`{known.make}` writes {known.name} there" if known is not None
             else f"`make model` writes {KNOWN_MODELS[0].name} to {KNOWN_MODELS[0].folder}")  # fmt: skip
    return f"needs the real model: {folder} holds no model (no config.json); {fetch}"


def stored_meta(folder: Path) -> dict:
    """The folder's meta.json ({} when there is none), as `read_meta` reads it; an unreadable one is the folder's
    problem, said as such."""
    try:
        return read_meta(folder)
    except RunFolderUnreadable as error:
        raise RunFolderUnreadable(f"{error}; remove {folder} to measure this claim again") from None


def same_setting(meta: dict, config: SweepConfig) -> bool:
    """The folder's run was made with this claim's config (an older catalogue or the other of --quick is not)."""
    return json.loads(json.dumps(meta.get("config"))) == json.loads(json.dumps(config.to_dict()))


def run_claim(claim: Claim, out: Path, *, quick: bool, progress: bool) -> Checked:
    """Run (or resume, or reuse) the claim's cells, then check them."""
    from attnbench.run.sweep import run_plan

    if claim.grid:
        return run_grid_claim(claim, out, quick=quick)
    if claim.generation:
        return run_generation_claim(claim, out, quick=quick)
    if not claim.sweep:  # listed so that it is seen: its check says why nothing here can test it
        return Checked(claim, None, CHECKS[claim.check](pd.DataFrame(), claim.params))
    if missing := missing_variants(claim):
        return Checked(claim, None, Outcome(CANNOT, "–", f"needs variant(s) not installed here: {', '.join(missing)}"))
    config = parse_config(claim.config(quick), source=f"claim {claim.id}")
    folder = out / (f"{claim.id}-quick" if quick else claim.id)
    meta = stored_meta(folder)
    if meta and not same_setting(meta, config):
        why = f"{folder} holds a run of another setting of this claim (an older catalogue?): remove it to measure again"
        return Checked(claim, folder, Outcome(CANNOT, "–", why))
    if "finished" not in meta:
        command = ["attnbench", "reproduce", claim.id, *(["--quick"] if quick else []), "--out", str(out)]
        run_plan(config, progress=progress, run_dir=folder, resume=bool(meta), command=command)
    frame = read_results(folder)
    try:
        outcome = CHECKS[claim.check](frame, claim.params)
    except Exception as error:  # results a check cannot read (a hand-edited folder): said, and the others go on
        why = f"the check could not read {folder}/results.csv ({type(error).__name__}: {error})"
        outcome = Outcome(CANNOT, "–", why)
    return Checked(claim, folder, outcome)


def run_grid_claim(claim: Claim, out: Path, *, quick: bool) -> Checked:
    """A claim measured by an MQAR grid (`attnbench recall`): train (or resume, or reuse) it, then check it."""
    from attnbench.recall.grid import parse_grid
    from attnbench.recall.run import GRID_FILE, grid_toml, train_grid
    from attnbench.runfolder.trainings import TRAININGS, read_trainings

    if missing := missing_variants(claim):
        return Checked(claim, None, Outcome(CANNOT, "–", f"needs variant(s) not installed here: {', '.join(missing)}"))
    grid = parse_grid(claim.grid_config(quick), source=f"claim {claim.id}")
    return checked_grid(claim, out, quick, grid_toml(grid), GRID_FILE, TRAININGS, read_trainings,
                        lambda folder, command: train_grid(grid, folder, command=command))  # fmt: skip


def run_generation_claim(claim: Claim, out: Path, *, quick: bool) -> Checked:
    """A claim measured by the real model generating (`attnbench generate`): run (or resume, or reuse) its grid on
    the model `make model` writes, then check it; without the model it cannot run here, and says so."""
    from attnbench.generation.grid import parse_grid
    from attnbench.generation.preflight import PreflightError, check, grid_model_dir
    from attnbench.generation.run import GRID_FILE, grid_toml, run_grid
    from attnbench.runfolder.generations import GENERATIONS, read_generations

    if missing := missing_variants(claim):
        return Checked(claim, None, Outcome(CANNOT, "–", f"needs variant(s) not installed here: {', '.join(missing)}"))
    if (absent := model_missing(claim)) is not None:  # said with the make command, not generate's --model
        return Checked(claim, None, Outcome(CANNOT, "–", absent))
    grid = parse_grid(claim.grid_config(quick), source=f"claim {claim.id}")
    try:  # the model the claim's grid names (Gemma-3-270M for a claim at 10K), else the one `make model` writes
        model = grid_model_dir(grid)
        check(grid, model)
    except PreflightError as error:
        return Checked(claim, None, Outcome(CANNOT, "–", f"cannot generate with the real model: {error}"))
    return checked_grid(claim, out, quick, grid_toml(grid), GRID_FILE, GENERATIONS, read_generations,
                        lambda folder, command: run_grid(grid, folder, model, workers=2, command=command))  # fmt: skip


def checked_grid(
    claim: Claim,
    out: Path,
    quick: bool,
    resolved: str,
    grid_file: str,
    rows_file: str,
    read_rows: Callable[[Path], pd.DataFrame],
    run: Callable[[Path, list[str]], object],
) -> Checked:
    """A grid claim's folder: one of another setting (`resolved`, the grid's TOML, differs from its `grid_file`) left
    alone and said; an unfinished one run or resumed; then its rows (`rows_file`, read by `read_rows`) checked."""
    folder = out / (f"{claim.id}-quick" if quick else claim.id)
    stored = folder / grid_file
    if stored.is_file() and stored.read_text() != resolved:
        why = f"{folder} holds a grid of another setting of this claim (an older catalogue?): remove it to run again"
        return Checked(claim, folder, Outcome(CANNOT, "–", why))
    if "finished" not in stored_meta(folder):
        run(folder, ["attnbench", "reproduce", claim.id, *(["--quick"] if quick else []), "--out", str(out)])
    try:
        outcome = CHECKS[claim.check](read_rows(folder), claim.params)
    except Exception as error:  # a hand-edited folder: said, and the other claims go on
        outcome = Outcome(CANNOT, "–", f"the check could not read {folder}/{rows_file} ({type(error).__name__}: {error})")
    return Checked(claim, folder, outcome)


def table(results: list[Checked]) -> str:
    """The one-screen table: claim, paper figure, ours, verdict (Markdown)."""
    lines = ["| claim | paper | published | ours | verdict |", "|---|---|---|---|---|"]
    for item in results:
        claim, outcome = item.claim, item.outcome
        lines.append(
            f"| `{claim.id}` | {claim.paper}, {claim.where} | {claim.published} | {outcome.ours} | "
            f"**{outcome.verdict}** |"
        )
    return "\n".join(lines)


def document(results: list[Checked], quick: bool) -> str:
    """reproduce.md: the table, then each claim in full."""
    held = sum(item.outcome.verdict in ACCEPTED for item in results)
    runnable = sum(item.outcome.verdict != CANNOT for item in results)
    parts = [
        "# Published claims, checked here" + (" (--quick)" if quick else ""),
        "",
        f"{held} of {runnable} claims that could run hold at least in trend"
        + (f"; {len(results) - runnable} could not run here." if runnable < len(results) else "."),
        "",
        table(results),
        "",
    ]
    for item in results:
        claim, outcome = item.claim, item.outcome
        parts += [
            f"## `{claim.id}`: {claim.paper}, {claim.where}",
            "",
            f"- **Claim**: {claim.statement}.",
            f"- **Published**: {claim.published}.",
            f"- **Baseline**: {claim.baseline}.",
            f"- **What transfers**: {claim.transfers}.",
            f"- **Ours**: {outcome.ours}.",
            f"- **Verdict**: {outcome.verdict}: {outcome.detail}.",
            f"- **Run folder**: `{item.folder}`" if item.folder else "- **Run folder**: none (not run)",
            "",
        ]
    return "\n".join(parts)


def listing(claims: list[Claim]) -> str:
    """--list: the claims, what each checks and whether it can run here (its variants registered, its model's
    folder written), and which ones --quick runs only when named."""
    lines = []
    for claim in claims:
        missing = missing_variants(claim)
        state = f"needs {', '.join(missing)}" if missing else model_missing(claim) or "runs here"
        state += "; --quick runs it only when named" if claim.quick_left_out else ""
        lines.append(f"{claim.id:<24} {claim.paper}, {claim.where} [{state}]\n{'':<24} {claim.statement}")
    return "\n".join(lines)


def command_reproduce(names: list[str], out: Path, *, quick: bool, progress: bool, list_only: bool) -> int:
    """The command: exit 0 when every claim that could run holds at least in trend, 1 when one does not, 2 on
    usage errors (an unknown claim), 130 when interrupted (finished claims' folders are kept; run it again to
    continue)."""
    from attnbench.run.executors import if_stuck

    chosen = select(names)
    if isinstance(chosen, str):
        print(f"attnbench: {chosen}", file=sys.stderr)
        return Exit.USAGE
    if list_only:
        print(listing(chosen))
        return Exit.OK
    if quick and not names:  # the whole catalogue: a claim whose quick run is long runs only when named
        chosen, left_out = quick_catalogue(chosen)
        for claim in left_out:
            print(f"attnbench: --quick leaves out {claim.id}: {claim.quick_left_out}; name it to run it",
                  file=sys.stderr)  # fmt: skip
    results = []
    for index, claim in enumerate(chosen, 1):
        if progress:
            print(f"attnbench: claim {index}/{len(chosen)}: {claim.id} ({claim.paper}, {claim.where})",
                  file=sys.stderr, flush=True)  # fmt: skip
        again = " ".join(["attnbench reproduce", *names, *(["--quick"] if quick else []), "--out", str(out)])

        def interrupted(claim_id: str = claim.id, again: str = again) -> None:  # also when a call does not return
            print(f"\nattnbench: interrupted during {claim_id}; the claims' run folders in {out}/ keep every finished "
                  f"cell. Continue with:\n  {again}", file=sys.stderr)  # fmt: skip

        try:
            with if_stuck(interrupted):
                results.append(run_claim(claim, out, quick=quick, progress=progress))
        except ConfigError as error:  # a catalogue entry this machine's settings refuse (e.g. memory): said, not hidden
            results.append(Checked(claim, None, Outcome(CANNOT, "–", str(error))))
        except RunFolderBusy as error:  # another reproduce (or run) is writing this claim's folder
            print(f"attnbench: {error}", file=sys.stderr)
            return Exit.USAGE
        except KeyboardInterrupt:  # the run folder keeps its finished cells; the next call resumes it
            interrupted()
            return Exit.INTERRUPTED
    out.mkdir(parents=True, exist_ok=True)
    report = out / ("reproduce-quick.md" if quick else "reproduce.md")
    write_text_atomic(report, document(results, quick))
    print(table(results))
    print(f"attnbench: reproduce: {report}", file=sys.stderr)
    failed = [item.claim.id for item in results if item.outcome.verdict == FAILS]
    if failed:
        print(f"attnbench: does not hold here: {', '.join(failed)} (reasons in {report})", file=sys.stderr)
    return Exit.REGRESSION if failed else Exit.OK
