"""Further sweeps in one config: each `[[also]]` table is the file's own sweep with the axes it names replaced, and
its cells join the run's (cells listed twice run once). One run can so hold settings no single cross product gives:
quick times every variant non-causal up to N=4096, and also a few causal at N=8192, the long-context question.

    [[also]]                       # the file's sweep again, causal, at N=8192, for these variants
    causal = true
    seq_lens = [8192]
    variants = [{name = "full"}, {name = "band", window = 256, sinks = 4}]

A table sets sweep axes only (the keys a cell varies by); the measurement settings are the whole run's, and a named
`baseline` and `min_recall`'s needles are looked for in the file's own sweep. A value the command line gives
(`--seq-lens 512`) replaces its key in every sweep, the file's own and each further one, but `--variants`, which picks
among a further sweep's own variants (`narrowed`): `attnbench run quick --variants full,bigbird` times bigbird
non-causal only, as quick's causal sweep does not list it.
"""

from __future__ import annotations

from typing import Any, Callable

from attnbench.interface import did_you_mean
from attnbench.plan.cells import AXES, Spec

ALSO = "also"  # the config key of the further sweeps

Axes = dict[str, list[Any]]  # cell field -> its values, as SweepConfig.axes
RUN_CHECKED = ("baseline", "min_recall")  # settings checked against the file's sweep alone (a sweep may lack either)


def narrowed(tables: Any, named: list[Spec], settings: Callable[[list[Spec], Any], list[Any]]) -> Any:
    """The `[[also]]` tables for `--variants`: a table that lists variants of its own keeps those the command line
    named (a plain name with its settings there, `NAME(k=v)` as written where it lists NAME; `settings` is
    config._variant_tables); one left with none is dropped. A table without variants takes the command line's."""
    if not isinstance(tables, list):
        return tables  # refused by sweep_tables
    kept = []
    for table in tables:
        if isinstance(table, dict) and isinstance(table.get("variants"), (list, dict)):  # else refused by parsing
            own = table["variants"]
            listed = own if isinstance(own, dict) else {(v if isinstance(v, str) else v.get("name")): v for v in
                                                        own if isinstance(v, (str, dict))}  # fmt: skip
            table = {**table, "variants": settings([spec for spec in named if spec.name in listed], own)}
            if not table["variants"]:
                continue
        kept.append(table)
    return kept


def sweep_tables(raw: dict[str, Any], flags: dict[str, str]) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """Each `[[also]]` table, by its index, as a whole config of its own (the file's keys, the table's, then the
    command line's), and the problems of tables that cannot be one."""
    tables = raw.get(ALSO)
    if not isinstance(tables, list) or not all(isinstance(table, dict) for table in tables):
        return [], [f"{ALSO}: expected [[{ALSO}]] tables of sweep keys (e.g. causal = true, seq_lens = [8192]), "
                    f"got {tables!r}"]  # fmt: skip
    base = {key: value for key, value in raw.items() if key not in (ALSO, *RUN_CHECKED)}
    configs, problems = [], []
    for index, table in enumerate(tables):
        wrong = [key for key in table if key not in AXES]
        problems += [f"{ALSO}[{index}]: {_not_an_axis(key)}" for key in wrong]
        if not table:
            problems.append(f"{ALSO}[{index}]: an empty table repeats the file's sweep; name the axes it changes")
        # the command line's values win in every sweep; its --variants has picked among a table's own (`narrowed`)
        flagged = {key: raw[key] for key in flags if key in base and not (key == "variants" and key in table)}
        if not wrong and table:
            configs.append((index, {**base, **table, **flagged}))
    return configs, problems


def _not_an_axis(key: str) -> str:
    """Why `key` cannot be in an [[also]] table: a misspelt axis, or a key that is not a sweep axis."""
    if hint := did_you_mean(key, sorted(AXES)):
        return f"unknown sweep key '{key}'.{hint}"
    return (f"'{key}' is not a sweep axis: an [[{ALSO}]] table changes only {', '.join(sorted(AXES))}; the settings "
            "(min_run_time, time_budget_s, ...) are the whole run's, set at the top of the file")  # fmt: skip


def further_sweeps(
    raw: dict[str, Any], flags: dict[str, str], parse: Callable[[dict[str, Any]], Any], known: list[str]
) -> tuple[list[Axes], list[str], list[str]]:
    """(each further sweep's axes, their notes, their problems): every table parsed as a config by `parse`
    (parse_config: a ConfigError, a ValueError, lists the problems), its problems named `also[i]: ...` unless the
    file's own sweep has them already (`known`)."""
    tables, problems = sweep_tables(raw, flags)
    sweeps: list[Axes] = []
    notes: list[str] = []
    for index, table in tables:
        try:
            config = parse(table)
        except ValueError as error:
            listed = getattr(error, "problems", [str(error)])
            problems += [p if p.startswith("--") else f"{ALSO}[{index}]: {p}" for p in listed if p not in known]
            continue
        sweeps.append(config.axes)
        notes += [note for note in config.notes if note not in notes]
    return sweeps, notes, problems


def union(sweeps: list[Axes]) -> Axes:
    """Each axis's values over every sweep, in order: what the run touches (its devices, modes, variants, N)."""
    return {name: list(dict.fromkeys(value for axes in sweeps for value in axes[name])) for name in sweeps[0]}


def differing(base: Axes, sweep: Axes) -> Axes:
    """The axes of `sweep` that differ from `base`'s: the `[[also]]` table that makes it again."""
    return {name: values for name, values in sweep.items() if values != base[name]}
