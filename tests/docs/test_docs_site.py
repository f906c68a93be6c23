"""The manual builds, strictly: `mkdocs build --strict` (what `make docs` runs) succeeds on docs/ as it stands, with
the CLI reference generated into it, and the same build fails on a broken link, so CI catches one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of `config` into `site` (the Material theme's end-of-life banner silenced)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_site_builds_in_strict_mode_with_every_page(tmp_path: Path) -> None:
    result = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stdout + result.stderr
    built = {page.parent.name for page in (tmp_path / "site").glob("*/index.html")}
    pages = {page.stem for page in (ROOT / "docs").glob("*.md") if page.stem != "index"}
    assert pages | {"cli"} <= built, f"pages missing from the site: {sorted(pages | {'cli'} - built)}"
    reference = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "attnbench run" in reference and "--seq-lens" in reference


@pytest.mark.slow  # a second whole build (about 3 s, 5 under load): the strictness itself, checked in `make test`
def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """A copy of the manual with one link to a page that does not exist: strict mode must refuse it."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "setup.md"
    page.write_text(page.read_text() + "\nSee [a page that is not there](no-such-page.md).\n")
    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stdout + result.stderr
