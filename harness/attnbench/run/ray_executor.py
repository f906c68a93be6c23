"""`attnbench run --executor ray`: each comparison group is one Ray task, several groups at a time.

A group is measured whole on one machine (every ratio inside it on one device, in turns). A task asks for
resources that keep its timings clean: a CUDA group one whole GPU (`num_gpus=1`); a CPU group every core
of one node, pinned to that node, so no two timing tasks share a node's CPUs (torch gets that many threads
unless `threads` is set). The task measures its group in the Ray worker, or with `--isolate` in a child
process that reports each step, so a variant that segfaults or hangs costs its own cell. A task whose Ray
worker dies (killed, out of memory, node lost) is retried once (`RETRIES`); if it dies again its group's
cells are recorded `crashed` with Ray's reason. The driver is the only writer of the run folder: rows are
appended as tasks finish.

Without an address a local Ray runtime is started in this process (all this machine's cores) and stopped
at the end; with one, the run joins that cluster (`ray start --head` there first). Every node needs
attnbench (and the plugins the config names) installed in the Python that Ray runs: before any group is
sent, each node says which attnbench it imports, and a node with another version (or none) stops the run.
`RayExecutor.meta` is what the run records of the cluster it joined: its GCS address, its dashboard, and
attnbench on each node.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Any, Callable, Iterator

from attnbench import __version__ as DRIVER_VERSION
from attnbench.measure.group import GroupResult
from attnbench.plan.cells import Group
from attnbench.plan.config import Settings
from attnbench.run.worker import group_request, read_group_request, read_result_record, result_record
from attnbench.runfolder.rows import row_for

RETRIES = 1  # a task whose worker dies is run once more before its cells are recorded crashed
PROBE_TIMEOUT_S = 120.0  # how long a node may take to say which attnbench it runs (a cold worker imports torch)


class RayUnavailable(RuntimeError):
    """Ray is not installed, the cluster cannot be reached, or its nodes run another attnbench than the driver."""


AUTH_HINT = (
    "the cluster uses token authentication: set RAY_AUTH_MODE=token and its token (RAY_AUTH_TOKEN, "
    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) as on its nodes, then run again"
)


def reachable_or_raise(address: str, timeout_s: float = 10.0) -> None:
    """Fail fast on a HOST:PORT nobody listens on, or whose cluster refuses this process's auth token (Ray
    itself retries either for a while, then names neither); other address forms are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise RayUnavailable(f"no Ray cluster answers at {address} ({error.strerror or error})") from None
    if _refuses_token(address):
        raise RayUnavailable(f"the Ray cluster at {address} refused this process: {AUTH_HINT}")


def _refuses_token(address: str) -> bool:
    """Whether the GCS at `address` answers with an authentication error (one RPC; a Ray without token
    authentication, or any other failure, says no here and is left to `ray.init`)."""
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:
        return False
    try:
        GcsClient(address=address)
    except AuthenticationError:
        return True
    except Exception:  # an older Ray, another fault: ray.init says what it is
        return False
    return False


def _chain(first: Group | None, rest: Iterator[Group]) -> Iterator[Group]:
    """`first` (a group to run again) back in front of the groups still to come."""
    if first is not None:
        yield first
    yield from rest


def measure_on_node(request: dict[str, Any]) -> dict[str, Any]:
    """In a Ray worker: one group measured in this process, or with "isolate" in a child process (as
    `--isolate`: a crash costs its cell, not the group), returned as plain data."""
    import ray

    from attnbench.measure.dispatch import measure_group
    from attnbench.registry import registry
    from attnbench.run.executors import Isolated

    group, settings = read_group_request(request)
    if request["isolate"]:
        result = Isolated(settings).run_group(group)
    else:
        result = measure_group(group, settings, registry)
    return {**result_record(result), "node": ray.get_runtime_context().get_node_id()}


def attnbench_on_node() -> dict[str, str]:
    """In a Ray worker: the attnbench this node's Python imports (version and folder), its host and Python."""
    import platform
    from pathlib import Path

    import attnbench

    return {
        "host": socket.gethostname(),
        "attnbench": attnbench.__version__,
        "path": str(Path(attnbench.__file__).parent),
        "python": platform.python_version(),
    }


def _slot_name(slot: Any) -> str:
    """A slot as a person reads it: the node's id and address, or a GPU."""
    if slot == "gpu":
        return "the node holding a GPU"
    return f"node {slot['NodeID']} ({slot.get('NodeManagerAddress', '?')})"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--executor ray needs Ray: pip install -e '.[ray]' in the attnbench checkout") from None
    return ray


def join_ray(ray: Any, address: str | None, say: Callable[[str], None]) -> tuple[bool, str | None]:
    """Start a local Ray runtime (all this machine's cores; `address` None) or join the cluster at `address`, unless
    this process is in one already: (whether it was started or joined here, its dashboard URL if known)."""
    if ray.is_initialized():
        return False, None
    options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None:
        from attnbench.measure.machine import usable_cores

        # "local": a runtime of our own even where RAY_ADDRESS or a `ray start` cluster could be found;
        # a task its runtime kills for memory is retried as often as any other (Ray's default: forever)
        os.environ.setdefault("RAY_task_oom_retries", str(RETRIES))
        options.update(address="local", num_cpus=usable_cores())
        say(f"starting a local Ray runtime ({options['num_cpus']} CPUs)…")
    else:
        reachable_or_raise(address)
        options["address"] = address
        say(f"joining the Ray cluster at {address}…")
    try:
        return True, ray.init(**options).dashboard_url
    except Exception as error:  # an unreachable address, a refused token, a broken installation
        text = " ".join(str(error).split())
        hint = f"; if {AUTH_HINT}" if address is not None else ""
        raise RayUnavailable(f"could not start or join Ray ({type(error).__name__}: {text}){hint}") from None


class RayExecutor:
    """Groups as Ray tasks: CPU groups one per node (all its cores), CUDA groups one per GPU."""

    def __init__(
        self,
        settings: Settings,
        *,
        address: str | None = None,
        isolate: bool = False,
        say: Callable[[str], None] = print,
    ) -> None:
        ray = _import_ray()
        self.ray, self.settings, self.isolate, self.say = ray, settings, isolate, say
        self.started_here, dashboard = join_ray(ray, address, say)
        self.in_flight: dict[Any, tuple[Group, Any]] = {}
        try:
            self.meta = self._joined(address, dashboard)
        except RayUnavailable:
            self.close()  # a runtime started here is stopped again
            raise
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        self.cpu_nodes = [n for n in nodes if n.get("Resources", {}).get("CPU", 0) >= 1]
        self.free_nodes = list(self.cpu_nodes)
        self.reruns: dict[str, list[str]] = {}  # group key -> why it was run again (its node lost), each time
        self.free_gpus = int(sum(n.get("Resources", {}).get("GPU", 0) for n in nodes))
        self.total_gpus = self.free_gpus
        cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
        say(
            f"Ray at {self.meta['ray_cluster']['address']}: {len(nodes)} node(s), {cpus:.0f} CPUs, "
            f"{self.total_gpus} GPU(s); a CPU group takes a whole node, a CUDA group one GPU"
        )
        self.remote = ray.remote(max_retries=RETRIES, retry_exceptions=False)(measure_on_node)

    def _joined(self, address: str | None, dashboard: str | None) -> dict[str, Any]:
        """What the run records of the cluster it joined (`executor` names its GCS address, not `auto`), once
        every node has said it imports this driver's attnbench; RayUnavailable names the nodes that do not."""
        gcs = self.ray.get_runtime_context().gcs_address
        nodes = self._attnbench_on_nodes()
        wrong = [
            f"node {node_id[:8]} ({info.get('host', '?')}): "
            + (info["error"] if "error" in info else f"attnbench {info['attnbench']} from {info['path']}")
            for node_id, info in nodes.items()
            if info.get("attnbench") != DRIVER_VERSION
        ]
        if wrong:
            raise RayUnavailable(
                f"the Ray cluster at {gcs} runs another attnbench than this driver (attnbench {DRIVER_VERSION}): "
                + "; ".join(wrong)
                + ". Install this attnbench on every node (in the Python Ray runs there), then run again"
            )
        asked = f"--address {address}" if address else "a local runtime of this run" if self.started_here else (
            "the Ray runtime this process had joined")  # fmt: skip
        return {
            "executor": f"ray at {gcs} ({asked})",
            "ray_cluster": {
                "address": gcs,
                "asked": address,
                "dashboard": dashboard or None,
                "ray": self.ray.__version__,
                "nodes": [{"node": node_id, **info} for node_id, info in nodes.items()],
            },
        }

    def _attnbench_on_nodes(self) -> dict[str, dict[str, str]]:
        """Node id -> `attnbench_on_node` run there (or {"error": why it could not run}), for every live node."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = self.ray.remote(num_cpus=0, max_retries=0)(attnbench_on_node)  # no CPU: runs beside anything
        refs = {
            node["NodeID"]: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)
            ).remote()
            for node in self.ray.nodes()
            if node.get("Alive")
        }
        found = {}
        for node_id, ref in refs.items():
            try:
                found[node_id] = self.ray.get(ref, timeout=PROBE_TIMEOUT_S)
            except Exception as error:  # attnbench missing there (the task cannot be imported), a node gone, a timeout
                text = " ".join(str(error).split())
                found[node_id] = {"error": f"attnbench could not run there ({type(error).__name__}: {text[:300]})"}
        return found

    # ---- slots --------------------------------------------------------------------------------

    def _needs_gpu(self, group: Group) -> bool:
        return group.setting.device.startswith("cuda")

    def _take_slot(self, group: Group) -> Any:
        """The slot the group would run in (a node, or "gpu"), taken; None when none is free now."""
        if self._needs_gpu(group):
            if self.free_gpus > 0:
                self.free_gpus -= 1
                return "gpu"
            return None
        return self.free_nodes.pop(0) if self.free_nodes else None

    def _node_lost(self, ref: Any) -> str:
        """Why the task failed if its node died or went away (not because of what it ran): Ray's error name;
        "" otherwise."""
        try:
            self.ray.get(ref, timeout=0)
        except (self.ray.exceptions.NodeDiedError, self.ray.exceptions.TaskUnschedulableError) as error:
            return type(error).__name__
        except Exception:
            return ""
        return ""

    def _refresh_nodes(self, released: Any) -> None:
        """Give a finished task's slot back, keeping only nodes still alive and adding nodes that joined."""
        if released == "gpu":
            self.free_gpus += 1
            return
        alive = {n["NodeID"]: n for n in self.ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1}
        busy = {slot["NodeID"] for _, slot in self.in_flight.values() if slot != "gpu"}
        self.free_nodes = [alive[i] for i in alive if i not in busy]
        self.cpu_nodes = list(alive.values())

    def _submit(self, group: Group, slot: Any) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        settings = self.settings
        if slot == "gpu":
            task = self.remote.options(num_gpus=1, num_cpus=1)
        else:
            cores = slot["Resources"]["CPU"]
            strategy = NodeAffinitySchedulingStrategy(node_id=slot["NodeID"], soft=False)
            task = self.remote.options(num_cpus=cores, scheduling_strategy=strategy)
            if not settings.threads:  # torch uses the node's cores, whatever thread count the worker started with
                settings = replace(settings, threads=int(cores))
        request = {**group_request(group, settings), "isolate": self.isolate}
        return task.remote(request)

    def _unplaceable(self, group: Group) -> GroupResult | None:
        """Rows for a group no machine of the cluster can ever run (a CUDA group without any GPU)."""
        if self._needs_gpu(group) and self.total_gpus == 0:
            reason = "the Ray cluster has no GPU for this CUDA cell"
        elif not self._needs_gpu(group) and not self.cpu_nodes:
            reason = "the Ray cluster has no node with a CPU to give"
        else:
            return None
        return GroupResult([row_for(cell, status="unsupported", reason=reason) for cell in group.cells])

    # ---- the loop ----------------------------------------------------------------------------

    def measure(self, groups: Iterator[Group]) -> Iterator[tuple[Group, GroupResult]]:
        waiting: Group | None = None
        while True:
            while True:  # start every group a slot is free for, in order
                if waiting is None and (self.free_nodes or self.free_gpus or not self.in_flight):
                    # drawn only when it may start now: a budget skip then follows every result in so far
                    waiting = next(groups, None)
                if waiting is None:
                    break
                impossible = self._unplaceable(waiting)
                if impossible is not None:
                    yield waiting, impossible
                    waiting = None
                    continue
                slot = self._take_slot(waiting)
                if slot is None:
                    break
                self.in_flight[self._submit(waiting, slot)] = (waiting, slot)
                waiting = None
            if not self.in_flight:
                return
            (ref,), _ = self.ray.wait(list(self.in_flight), num_returns=1)
            group, slot = self.in_flight.pop(ref)
            lost = self._node_lost(ref)
            self._refresh_nodes(released=slot)
            reruns = self.reruns.setdefault(group.key(), [])
            if lost and len(reruns) < RETRIES and (self.free_nodes or self.in_flight):
                reruns.append(f"{_slot_name(slot)} was lost mid-group ({lost}): measured again from the start")
                self.say(f"a node was lost while measuring N={group.setting.seq_len}: running that group again")
                waiting, groups = group, _chain(waiting, groups)
                continue
            result = self._result(ref, group, slot)
            for row in result.rows:
                row.reruns = "; ".join(reruns)
            yield group, result

    def _result(self, ref: Any, group: Group, slot: Any) -> GroupResult:
        try:
            data = self.ray.get(ref)
        except self.ray.exceptions.RayError as error:  # the worker died twice, the node was lost, a bug in the task
            text = " ".join(str(error).split())
            text = text if len(text) <= 300 else text[:299] + "…"
            if isinstance(error, self.ray.exceptions.RayTaskError):  # raised inside the task: not retried
                reason = f"the Ray task measuring this group raised ({type(error).__name__}): {text}"
            elif isinstance(error, (self.ray.exceptions.NodeDiedError, self.ray.exceptions.TaskUnschedulableError)):
                reason = f"the node measuring this group was lost ({type(error).__name__}): {text}"
            else:
                reason = (
                    f"the Ray worker measuring this group died, {1 + RETRIES} attempts ({type(error).__name__}): {text}"
                )
            node = slot["NodeID"] if slot != "gpu" else ""  # a CUDA task's node is Ray's choice: unknown here
            return GroupResult([row_for(cell, status="crashed", reason=reason, node=node) for cell in group.cells])
        result = read_result_record(data)
        for row in result.rows:
            row.node = data.get("node", "")
        return result

    def close(self) -> None:
        """Cancel what is still running (Ctrl-C, an error) and stop a runtime this run started."""
        for ref in list(self.in_flight):
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # already finished or its node is gone: nothing left to stop
                pass
        self.in_flight.clear()
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()


def tasks_on_ray(
    items: list[Any],
    task: Callable[[Any], Any],
    *,
    cpus: Callable[[Any], int],
    failed: Callable[[Any, str], Any],
    address: str | None,
    say: Callable[[str], None],
    gpus: Callable[[Any], int] = lambda item: 0,
) -> Iterator[Any]:
    """Each item a Ray task (`task(item)`, a module-level function) asking for `cpus(item)` CPUs and `gpus(item)`
    GPUs (a whole one for a unit on CUDA), the results in the order they end; a task whose worker died twice or
    whose node was lost gives `failed(item, why)`. A local runtime started here is stopped at the end (also when the
    caller stops early)."""
    ray = _import_ray()
    started, _ = join_ray(ray, address, say)
    try:
        remote = ray.remote(max_retries=RETRIES, retry_exceptions=False)(task)
        pending = {remote.options(num_cpus=cpus(item), num_gpus=gpus(item)).remote(item): item for item in items}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            item = pending.pop(ready[0])
            try:
                yield ray.get(ready[0])
            except Exception as error:  # the task's worker died twice, its node was lost
                yield failed(item, f"its Ray task failed ({type(error).__name__}: {' '.join(str(error).split())[:300]})")
    finally:
        if started:
            ray.shutdown()
