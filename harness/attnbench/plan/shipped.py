"""Grids shipped in the package (configs/<kind>/*.toml: `recall`'s MQAR grids, `generate`'s), found by name or read
from a file, one rule for both: a name is a shipped grid, a path a file of the user's."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from attnbench.interface import did_you_mean
from attnbench.plan.config import ConfigError


def grid_files(kind: str) -> dict[str, Any]:
    """Shipped grid name -> its file, for the folder `kind` inside attnbench.configs."""
    folder = resources.files("attnbench.configs") / kind
    return {entry.name.removesuffix(".toml"): entry for entry in folder.iterdir() if entry.name.endswith(".toml")}


def grid_descriptions(kind: str) -> dict[str, tuple[str, str]]:
    """Shipped grid name -> (its description, its measured run time)."""
    out = {}
    for name, entry in sorted(grid_files(kind).items()):
        raw = tomllib.loads(entry.read_text())
        out[name] = (str(raw.get("description", "")), str(raw.get("measured_run_time", "not measured")))
    return out


def read_grid_toml(name_or_path: str, kind: str, what: str) -> tuple[dict[str, Any], str]:
    """(the TOML's keys, where it came from) of a file or a shipped grid's name; ConfigError naming the file or name
    when it cannot be read. `what` names the kind of grid in messages ("MQAR grid")."""
    path = Path(name_or_path)
    files = grid_files(kind)
    if path.is_file():
        try:
            source, text = str(path), path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError(str(path), [f"cannot be read as UTF-8 text: {error}"]) from None
    elif name_or_path in files:
        source, text = f"grid '{name_or_path}'", files[name_or_path].read_text()
    elif path.is_dir():
        raise ConfigError(name_or_path, [f"is a folder; give a {what}'s TOML file or a shipped grid's name"])
    else:
        known = ", ".join(sorted(files))
        hint = did_you_mean(name_or_path, sorted(files))
        raise ConfigError(name_or_path, [f"no such file, and no shipped {what} of that name (known: {known}).{hint}"])
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(source, [f"not valid TOML: {error}"]) from None
    raw.setdefault("name", path.stem if path.is_file() else name_or_path)
    return raw, source
