"""The work pools of prefect.yaml and their concurrency limits, created where missing (infra/deploy.sh).

Each pool (cpu, gpu, tpu) is a process work pool; each has a global concurrency limit ``pool-NAME`` of
one slot, which a cell holds while it runs on that pool's devices (flows/lanes.py ``device_slot``), so
a pool's device runs one timed cell at a time whichever benchmark sent it. A pool of N hosts raises its
limit to N (``prefect global-concurrency-limit update pool-NAME --limit N``); an existing limit is
left as it is.

    python -m infra.pools            # against PREFECT_API_URL
"""
import sys

POOLS = ("cpu", "gpu", "tpu")


def ensure_pools(pools: tuple[str, ...] = POOLS) -> list[str]:
    """Create the missing work pools and limits; what was created, by name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from tasks.common.process.prefect_api import missing

    new_pools = missing(pools, lambda client, pool: client.read_work_pool(pool))
    new_limits = missing([f"pool-{pool}" for pool in pools], lambda client, limit: client.read_global_concurrency_limit_by_name(limit))
    created = []
    with get_client(sync_client=True) as client:
        for pool in pools:
            if pool in new_pools:
                client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=ProcessWorker.get_default_base_job_template()))
                created.append(f"work pool {pool}")
            if f"pool-{pool}" in new_limits:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=f"pool-{pool}", limit=1))
                created.append(f"concurrency limit pool-{pool}")
    return created


if __name__ == "__main__":
    for line in ensure_pools():
        print(f"created {line}")
    sys.exit(0)
