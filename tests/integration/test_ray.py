"""`--executor ray` on a real local Ray runtime (2 CPUs): the same cells as in-process, a killed worker retried
once and then recorded, and a driver killed mid-run resumed to exactly the planned cells."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import attnbench
import pytest
from attnbench.plan.cells import Cell
from attnbench.plan.config import parse_config
from attnbench.run.sweep import run_plan
from attnbench.runfolder.results import read_results
from helpers import TESTS, write_plugin

pytestmark = pytest.mark.slow  # real runs in subprocesses, faults staged

ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'attnbench[ray]')")

KILLERS = """
    import os, signal
    from pathlib import Path
    import torch
    from attnbench.interface import AttentionVariant

    class KillsItsWorker(AttentionVariant):
        '''Kills the process it runs in (the Ray worker measuring its group) on every call.'''
        name = "kills-worker"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            os.kill(os.getpid(), signal.SIGKILL)

    class KillsItsWorkerOnce(AttentionVariant):
        '''Kills its Ray worker the first time only (a marker file remembers): the retry succeeds.'''
        name = "kills-worker-once"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            marker = Path(os.environ["ATTNBENCH_TEST_MARKER"])
            if not marker.exists():
                marker.write_text("killed once")
                os.kill(os.getpid(), signal.SIGKILL)
            return v.clone()

    class Sleepy(AttentionVariant):
        name = "sleepy"
        family = "test"
        exact = False
        def forward(self, q, k, v, *, causal, key_padding_mask):
            import time
            time.sleep(0.05)
            return v.clone()
"""
ENTRIES = {
    "kills-worker": "killers_mod:KillsItsWorker",
    "kills-worker-once": "killers_mod:KillsItsWorkerOnce",
    "sleepy": "killers_mod:Sleepy",
}
SMALL = {"heads": 1, "head_dim": 8, "min_run_time": 0.01, "min_rounds": 3, "error": False}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory):
    """One local Ray runtime for the module, its workers able to import the test plugin; yields (env, registry)."""
    from attnbench.registry import Registry

    folder = write_plugin(tmp_path_factory.mktemp("plugin"), "killers-plugin", ENTRIES, {"killers_mod": KILLERS})
    marker = tmp_path_factory.mktemp("marker") / "killed-once"
    env = {
        "PYTHONPATH": os.pathsep.join([str(folder), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]),
        "ATTNBENCH_TEST_MARKER": str(marker),
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the runtime's workers, and the group processes they start, inherit it
    sys.path.insert(0, str(folder))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a cluster found here
    try:
        yield {**os.environ, **env}, Registry()
    finally:
        ray.shutdown()
        sys.path.remove(str(folder))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_ray_measures_the_same_cells_as_in_process(runtime, tmp_path: Path) -> None:
    _, registry = runtime
    config = parse_config(
        {**SMALL, "variants": ["full", "band"], "seq_lens": [16, 32], "error": True}, registry=registry
    )
    started = time.perf_counter()
    local = read_results(run_plan(config, tmp_path / "local", registry=registry, progress=False))
    local_s = time.perf_counter() - started
    timings = [f"local {local_s:.1f} s"]
    for isolate in (False, True):  # in the Ray worker, and in a child process of it
        started = time.perf_counter()
        folder = run_plan(config, tmp_path / f"ray-{isolate}", registry=registry, progress=False, executor="ray",
                          isolate=isolate)  # fmt: skip
        timings.append(f"ray{' --isolate' if isolate else ''} {time.perf_counter() - started:.1f} s")
        remote = read_results(folder)
        assert set(remote.cell_key) == set(local.cell_key) and remote.cell_key.is_unique
        assert (remote.status == "ok").all(), remote[["label", "status", "reason"]]
        assert remote.host.str.len().gt(0).all() and remote.device_name.str.len().gt(0).all()  # where each ran
        assert remote.speedup.notna().all() and remote.err_vs_uniform.notna().all()
        assert (remote.threads == 2).all()  # a CPU group gets the node's cores
        meta = json.loads((folder / "meta.json").read_text())  # the cluster actually joined, and its attnbench
        assert meta["executor"].startswith("ray at ") and meta["ray_cluster"]["address"] in meta["executor"]
        assert {node["attnbench"] for node in meta["ray_cluster"]["nodes"]} == {attnbench.__version__}
    print("small sweep (2 groups, runtime already up): " + ", ".join(timings))


def test_a_killed_worker_is_retried_once_then_recorded(runtime, tmp_path: Path) -> None:
    _, registry = runtime
    dies = parse_config({**SMALL, "variants": ["kills-worker", "full"], "seq_lens": [16, 32]}, registry=registry)
    frame = read_results(run_plan(dies, tmp_path / "dies", registry=registry, progress=False, executor="ray"))
    first = frame[frame.seq_len == 16]
    assert (first.status == "crashed").all()  # the whole group: its worker died on both attempts
    assert first.reason.str.contains("died, 2 attempts").all()
    assert (frame[frame.seq_len == 32].status == "skipped").all()  # larger N skipped after a crash, as in-process
    once = parse_config({**SMALL, "variants": ["kills-worker-once", "full"], "seq_lens": [16]}, registry=registry)
    frame = read_results(run_plan(once, tmp_path / "once", registry=registry, progress=False, executor="ray"))
    assert (frame.status == "ok").all(), frame[["label", "status", "reason"]]  # the retry measured the group
    assert Path(os.environ["ATTNBENCH_TEST_MARKER"]).exists()  # it did kill its first worker


def test_resume_after_the_driver_is_killed(runtime, tmp_path: Path) -> None:
    env, _ = runtime
    config = tmp_path / "sweep.toml"
    config.write_text(
        "seq_lens = [8, 16, 24, 32, 40, 48]\nheads = 1\nhead_dim = 8\nmin_run_time = 0.1\nmin_rounds = 2\n"
        'error = false\nvariants = ["sleepy", "full"]\n'
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnbench.cli", "run", str(config), "--out", str(out), "--no-progress"]
    address = ray.get_runtime_context().gcs_address  # the driver joins the module's runtime, as a cluster's
    driver = subprocess.Popen([*command, "--no-report", "--executor", "ray", "--address", address], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deadline, found = time.monotonic() + 180, []
    while time.monotonic() < deadline:
        found = list(out.glob("*/results.csv"))
        if found and len(found[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver; the cluster drops its job
    driver.wait()
    run_dir = found[0].parent
    kept = read_results(run_dir)
    assert 2 <= len(kept) < 12 and (kept.status == "ok").all()
    resumed = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "run", "--resume", str(run_dir), "--no-progress", "--no-report"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    keys = read_results(run_dir).cell_key
    assert keys.is_unique and len(keys) == 12 and (read_results(run_dir).status == "ok").all()


def test_a_group_whose_node_is_lost_runs_again_once_on_another_node() -> None:
    """Node loss cannot be staged on one machine: a stand-in for Ray's API loses node A under the first task."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from attnbench.plan.config import Settings
    from attnbench.run.ray_executor import RayExecutor
    from attnbench.runfolder.rows import row_for

    class NodeDied(Exception):
        pass

    a, b = "a" * 56, "b" * 56  # node ids are hex
    nodes = {a: {"NodeID": a, "Alive": True, "Resources": {"CPU": 2}},
             b: {"NodeID": b, "Alive": True, "Resources": {"CPU": 2}}}  # fmt: skip
    submitted: list[str] = []

    class Task:
        def __init__(self, node: str | None = None) -> None:
            self.node = node

        def options(self, scheduling_strategy=None, **resources):
            return Task(scheduling_strategy.node_id)

        def remote(self, request):
            submitted.append(self.node)
            return Ref(self.node, request)

    class Ref:  # an object reference: hashable by identity
        def __init__(self, node: str, request: dict) -> None:
            self.node, self.request = node, request

    def get(ref, timeout=None):
        if ref.node == a:
            nodes[a]["Alive"] = False
            raise NodeDied("node A died")
        cells = [Cell.from_key(key) for key in ref.request["cells"]]
        return {"rows": [asdict(row_for(cell, host="b")) for cell in cells], "samples": [], "node": b}

    fake = SimpleNamespace(
        nodes=lambda: list(nodes.values()),
        wait=lambda refs, num_returns: (refs[:1], refs[1:]),
        get=get,
        exceptions=SimpleNamespace(
            NodeDiedError=NodeDied, TaskUnschedulableError=NodeDied, RayError=Exception, RayTaskError=KeyError
        ),  # fmt: skip
    )
    executor = object.__new__(RayExecutor)
    executor.__dict__.update(ray=fake, settings=Settings(), isolate=False, say=lambda text: None, started_here=False,
                             cpu_nodes=list(nodes.values()), free_nodes=[nodes[a]], free_gpus=0, total_gpus=0,
                             reruns={}, in_flight={}, remote=Task())  # fmt: skip
    config = parse_config({**SMALL, "variants": ["full"], "seq_lens": [16]})
    results = list(executor.measure(iter(config.plan().groups)))
    assert submitted == [a, b]  # lost with node a, run again on b (which the refresh found free)
    ((group, result),) = results
    assert [row.host for row in result.rows] == ["b"] and result.rows[0].status == "ok"
    (row,) = result.rows  # where it ran and why it ran twice are in its row
    assert row.node == b
    assert row.reruns == f"node {a} (?) was lost mid-group (NodeDied): measured again from the start"


def test_the_cluster_joined_and_attnbench_on_each_node_are_recorded(runtime) -> None:
    import attnbench
    from attnbench.plan.config import Settings
    from attnbench.run.ray_executor import RayExecutor

    executor = RayExecutor(Settings(), say=lambda text: None)  # joins the module's runtime, as a cluster's
    executor.close()
    address = ray.get_runtime_context().gcs_address
    assert executor.meta["executor"] == f"ray at {address} (the Ray runtime this process had joined)"
    cluster = executor.meta["ray_cluster"]
    assert cluster["address"] == address and cluster["ray"] == ray.__version__
    assert [(node["node"], node["attnbench"]) for node in cluster["nodes"]] == [
        (node["NodeID"], attnbench.__version__) for node in ray.nodes() if node["Alive"]
    ]
    assert Path(cluster["nodes"][0]["path"]) == Path(attnbench.__file__).parent


def test_a_node_with_another_attnbench_stops_the_run_before_any_cell(
    runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import attnbench
    from attnbench.cli import main

    monkeypatch.setattr("attnbench.run.ray_executor.DRIVER_VERSION", "9.9.9")  # the workers import the real one
    config = tmp_path / "tiny.toml"
    config.write_text('seq_lens = [16]\nheads = 1\nhead_dim = 8\nerror = false\nvariants = ["full"]\n')
    address = ray.get_runtime_context().gcs_address
    argv = ["run", str(config), "--executor", "ray", "--address", address, "--out", str(tmp_path / "out")]
    assert main([*argv, "--no-progress", "--no-report"]) == 2
    err = capsys.readouterr().err
    assert f"the Ray cluster at {address} runs another attnbench than this driver (attnbench 9.9.9)" in err
    assert f"attnbench {attnbench.__version__} from {Path(attnbench.__file__).parent}" in err
    assert not any((tmp_path / "out").iterdir())  # refused before any cell was measured: no run folder left


def test_a_cluster_that_refuses_the_token_is_named_with_the_fix_and_leaves_no_folder(tmp_path: Path) -> None:
    """A real head node with token authentication; the driver has no token: exit 2, the RAY_AUTH_MODE hint,
    no run folder (the cluster is joined before the folder is made)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    import tempfile

    token = "0123456789abcdef" * 2
    short = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay under 108 bytes
    server_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "HOME": str(tmp_path)}
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}", "--num-cpus=1",
         "--include-dashboard=false", f"--temp-dir={short}"],
        env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:  # the GCS listening
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and head.poll() is None, "the Ray head did not start"
                time.sleep(0.5)
        config = tmp_path / "tiny.toml"
        config.write_text('seq_lens = [16]\nheads = 1\nhead_dim = 8\nerror = false\nvariants = ["full"]\n')
        driver_env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_AUTH")}
        out = tmp_path / "out"
        refused = subprocess.run(
            [sys.executable, "-m", "attnbench.cli", "run", str(config), "--executor", "ray",
             "--address", f"127.0.0.1:{port}", "--out", str(out), "--no-progress", "--no-report"],
            env={**driver_env, "HOME": str(tmp_path / "driver-home")}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head and every process it started (its own session)
        head.wait()
        shutil.rmtree(short, ignore_errors=True)
    assert refused.returncode == 2, refused.stderr
    assert f"the Ray cluster at 127.0.0.1:{port} refused this process" in refused.stderr
    assert "set RAY_AUTH_MODE=token" in refused.stderr and "Traceback" not in refused.stderr
    assert not out.exists() or not any(out.iterdir())
