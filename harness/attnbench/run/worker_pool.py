"""Units of work in `jobs` worker processes on this machine (spawned: a fresh torch each), their results in the order
they end. A worker that dies (a segfault, the OOM killer) breaks the pool: the units it may have held (the first
`jobs` unfinished, in the pool's FIFO order) are blamed, and every unfinished one is run again in a new pool; a unit
blamed twice is given up with the reason (as a Ray task is retried once). Shared by `recall`'s trainings and
`generate`'s units."""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
from typing import Any, Callable, Iterator

from attnbench.run.ray_executor import RETRIES


def in_worker_processes(
    items: list[Any],
    work: Callable[[Any], Any],
    *,
    jobs: int,
    key: Callable[[Any], str],
    failed: Callable[[Any, str], Any],
) -> Iterator[Any]:
    """`work(item)` (a module-level function) for each item in `jobs` processes; an item whose worker died twice, or
    whose call raised past `work`, gives `failed(item, why)`. No worker outlives the iteration (Ctrl-C included)."""
    context = multiprocessing.get_context("spawn")
    waiting, blamed = list(items), {key(item): 0 for item in items}
    while waiting:
        pool, finished_cleanly = futures.ProcessPoolExecutor(max_workers=jobs, mp_context=context), False
        try:
            pending = {pool.submit(work, item): item for item in waiting}
            finished: set[str] = set()
            broken = None
            for done in futures.as_completed(pending):
                try:
                    result = done.result()
                except futures.process.BrokenProcessPool as error:
                    broken = error
                    break
                except Exception as error:
                    result = failed(pending[done], f"{type(error).__name__}: {error}")
                finished.add(key(pending[done]))
                yield result
            waiting = [item for item in waiting if key(item) not in finished] if broken else []
            for item in waiting[:jobs]:
                blamed[key(item)] += 1
            for item in [item for item in waiting if blamed[key(item)] > RETRIES]:
                yield failed(item, f"its worker process died twice ({broken})")
            waiting = [item for item in waiting if blamed[key(item)] <= RETRIES]
            finished_cleanly = broken is None
        finally:
            if finished_cleanly:  # every worker idle: let them exit (a forced stop leaves their semaphores leaked)
                pool.shutdown(wait=True)
            else:  # stopped early (Ctrl-C, SIGTERM, the writer failed, a worker died): no worker outlives the grid
                processes = list((pool._processes or {}).values())
                pool.shutdown(wait=False, cancel_futures=True)
                for process in processes:
                    process.terminate()
