"""The test suite keeps its signal handlers after the in-process Ray tests (issue 39, item 4): Ray's driver installs
a SIGTERM handler that raises SystemExit (pytest then counts one failed test and runs on) and leaves it after
`ray.shutdown()`; the suite's conftest puts the session's handlers back after every test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

TESTS = Path(__file__).resolve().parents[1]
SUITE = """import signal
import ray

def test_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    ray.shutdown()
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # Ray's, still installed

def test_after():
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
"""


@pytest.mark.slow
def test_a_test_after_in_process_ray_has_the_sessions_sigterm_handler(tmp_path: Path) -> None:
    """With an empty conftest instead of ours, `test_after` fails (checked by hand: Ray's handler stays)."""
    (tmp_path / "test_ray_then_after.py").write_text(SUITE)
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert suite.returncode == 0 and "2 passed" in suite.stdout, suite.stdout
