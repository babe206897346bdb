"""The benchmark's lanes and a pool's slots: cells run one after the other per lane (a work pool, or here), lanes at the same time, and a cell on a pool's devices holding one slot of the pool's concurrency limit while it runs."""

import contextlib
import contextvars
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

# The work pool whose worker started this process: set by each pool's job variables in prefect.yaml.
POOL_ENV = "KARMAN_POOL"
# A cell's slot is leased for this long and renewed while it runs: a cell killed with its worker frees its
# pool within this time (the API allows no less than 60 s; its default, 300 s, would hold the pool's devices for five minutes).
SLOT_LEASE_S = 60.0


def pool_limit(pool: str | None = None) -> str | None:
    """The global concurrency limit of work pool ``pool`` (``pool-<name>``; by default this process's
    pool), None outside a pool's worker."""
    pool = pool or os.environ.get(POOL_ENV)
    return f"pool-{pool}" if pool else None


@contextlib.contextmanager
def device_slot(logger, pool: str | None = None):
    """Hold one slot of this process's pool limit while a cell runs: a pool's devices run as many timed
    cells at once as the limit has slots (infra/deploy.sh creates one slot per pool), whichever
    benchmark or trigger sent them. Outside a pool's worker the block runs at once; where the limit
    does not exist, Prefect says so and the block runs at once."""
    name = pool_limit(pool)
    if name is None:
        yield
        return
    from prefect.concurrency.sync import concurrency

    t0 = time.monotonic()
    with concurrency(name, occupy=1, strict=False, lease_duration=SLOT_LEASE_S, raise_on_lease_renewal_failure=False):
        waited = time.monotonic() - t0
        if waited >= 1:
            logger.info("waited %.0f s for a slot of concurrency limit %s (its pool's devices were busy)", waited, name)
        yield


def run_lanes(jobs: list, lane_of: Callable[[Any], str | None], run: Callable[[Any], dict]) -> list[dict]:
    """``run(job)`` for every job, lane by lane: one lane's jobs one after the other, in order; different
    lanes at the same time. Lane None (cells run here) stays in this thread; every other lane (a work
    pool) gets a thread with a copy of this one's context (the flow run, its logger). Results in the
    jobs' order."""
    lanes: dict[str | None, list[int]] = {}
    for i, job in enumerate(jobs):
        lanes.setdefault(lane_of(job), []).append(i)
    results: list[dict] = [{}] * len(jobs)

    def work(indices: list[int]) -> None:
        for i in indices:
            results[i] = run(jobs[i])

    remote = [indices for lane, indices in lanes.items() if lane is not None]
    if not remote:
        work(lanes.get(None, []))
        return results
    with ThreadPoolExecutor(len(remote), thread_name_prefix="lane") as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, indices) for indices in remote]
        work(lanes.get(None, []))
        for future in futures:
            future.result()
    return results
