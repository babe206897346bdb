"""A sweep's simulations are Prefect task runs on Dask: one named task run each, and a Dask worker killed mid-sweep still leaves every simulation stored once."""

import os
import signal
import threading
import time

import numpy as np
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.pipeline import generate
from tasks.common.specs import GenerateSpec
from tasks.common.stores.store import MANIFEST, STORE, VARIABLES, content_digest, open_simulation
from tasks.workloads.karman.simulate import expand
from tests.conftest import shared_prefect_api
from tests.flows.test_generate import read_manifest

# Tiny simulations (steady low-Reynolds flow on 48 x 24 cells): each some tenths of a second of solver steps.
TINY = dict(nx=48, ny=24, size=[5.0], frames=3, frame_every=20, cpu_backend="numpy")


@pytest.fixture(scope="module")
def prefect_api():
    """The flows here report to the tests' real Prefect server (the one the CLI tests start), whose API records
    the task runs that the Dask workers report."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: shared_prefect_api()}):
        yield


def task_runs_of(flow_run_id, expected: int, timeout: float = 30) -> list:
    """The flow run's task runs, once ``expected`` of them are in a final state (the API records them from events,
    a moment after they happen)."""
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if sum(r.state is not None and r.state.is_final() for r in runs) >= expected or time.monotonic() > deadline:
                return runs
            time.sleep(0.25)


def stored_once(dataset_dir, spec: GenerateSpec) -> dict:
    """The manifest's records, after checking that every simulation of the sweep is in it once and in the store
    once, whole (its frames, no more, matching its recorded digest)."""
    records = read_manifest(dataset_dir / MANIFEST)  # fails on a simulation listed twice
    sweep = sorted(s.sim_id for s in expand(spec))
    assert sorted(records) == sweep
    assert sorted(p.name for p in (dataset_dir / STORE).iterdir() if p.is_dir()) == sweep
    for sim_id in sweep:
        ds = open_simulation(dataset_dir, sim_id).load()
        assert ds.sizes["time"] == spec.options.frames  # rewritten whole, never appended to
        assert all(np.isfinite(ds[name].values).all() for name in VARIABLES)
        assert content_digest(ds) == records[sim_id]["digest"]
    return records


def test_each_simulation_is_a_named_task_run_of_the_generate_flow(workdir, prefect_api):
    spec = GenerateSpec(dataset="tasks", reynolds=[20.0, 30.0, 40.0], warmup_steps=200, workers=1, **TINY)
    state = generate(spec, return_state=True)
    assert state.is_completed(), state.message
    stored_once(workdir / "data" / "datasets" / "tasks", spec)

    runs = task_runs_of(state.state_details.flow_run_id, expected=3)
    assert sorted(r.name for r in runs) == sorted(f"simulate {s.sim_id}" for s in expand(spec))
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state.name) for r in runs]

    # Run again: every simulation is complete, so no simulation task runs at all.
    again = generate(spec, return_state=True)
    assert again.is_completed()
    assert task_runs_of(again.state_details.flow_run_id, expected=1, timeout=2) == []


def test_a_dask_worker_killed_mid_sweep_leaves_every_simulation_stored_once(workdir, prefect_api):
    """Two workers of a real cluster (the sweep reaches it by its scheduler address, as one on SLURM); a watcher
    kills the worker process running a simulation; that simulation runs again on the other worker (or the one
    its nanny starts) within the same task run, and the flow ends with every simulation stored once."""
    from distributed import Client, LocalCluster

    spec_args = dict(dataset="lost", reynolds=[20.0, 30.0, 40.0, 50.0], warmup_steps=1500, workers=2, **TINY)
    killed: list[dict] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1") as cluster, \
            Client(cluster, set_as_default=False) as client:  # not the default client: the sweep connects by address
        spec = GenerateSpec(**spec_args, scheduler=cluster.scheduler_address)

        pids = client.run(os.getpid)  # worker address -> its process

        def kill_a_busy_worker():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                busy = [w for w, keys in client.processing().items() if keys and w in pids]
                if busy:
                    time.sleep(0.3)  # inside the simulation, not at its start
                    worker = busy[0]
                    running = client.processing()[worker]
                    os.kill(pids[worker], signal.SIGKILL)
                    killed.append({"worker": worker, "pid": pids[worker], "tasks": running})
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_a_busy_worker, daemon=True)
        watcher.start()
        state = generate(spec, return_state=True)
        watcher.join(5)

    assert killed and killed[0]["tasks"], "no worker was busy to kill"
    assert state.is_completed(), state.message
    dataset_dir = workdir / "data" / "datasets" / "lost"
    records = stored_once(dataset_dir, spec)
    assert len(records) == 4

    runs = task_runs_of(state.state_details.flow_run_id, expected=4)
    assert sorted(r.name for r in runs) == sorted(f"simulate {s}" for s in records)  # one task run each, the rerun included
    assert all(r.state.is_completed() for r in runs), [(r.name, r.state.name) for r in runs]


def test_a_local_clusters_worker_keeps_a_heartbeat_lost_at_closing_off_the_terminal(prefect_api, tmp_path, monkeypatch):
    """A worker of the sweep's own cluster (forked from a server that imported the sweep's tasks and froze its imports,
    tasks.common.process.dask_worker run as it starts) drops Dask's heartbeat failure, which a worker logs when the command
    closes the cluster between two of its heartbeats (a traceback of a closed stream in a demo that went well); its other
    errors still reach the terminal. The server starts here, in a folder other than the project's and without
    PYTHONPATH, as a command run from elsewhere (or a test's command run in this process) starts it: it still finds
    the project's modules."""
    import multiprocessing.forkserver

    from tasks.common.process.cluster import dask_task_runner

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    multiprocessing.forkserver._forkserver._stop()  # this process's server, if an earlier test started one: started again below

    def on_the_worker() -> list[str]:
        import gc
        import io
        import logging
        import sys

        out = io.StringIO()
        handler = logging.StreamHandler(out)
        log = logging.getLogger("distributed.worker")
        log.addHandler(handler)
        try:
            for message in ("Failed to communicate with scheduler during heartbeat.", "Could not find data: ['x']"):
                try:
                    raise OSError("Stream is closed")
                except OSError:
                    log.exception(message)
        finally:
            log.removeHandler(handler)
        return [f"frozen: {gc.get_freeze_count()}", f"sweep: {'tasks.workloads.karman.sweep' in sys.modules}", *out.getvalue().splitlines()]

    with dask_task_runner(workers=1, preload=["tasks.workloads.karman.sweep"]) as runner:
        (lines,) = runner.client.run(on_the_worker).values()
    frozen = int(lines.pop(0).split()[1])
    assert lines.pop(0) == "sweep: True"  # the server imported the sweep's tasks (never imported by the worker itself here)
    assert frozen > 100_000  # what its fork server imported, frozen there (tasks.common.process.collector_frozen): its end is quick
    assert lines[0] == "Could not find data: ['x']" and "OSError: Stream is closed" in lines  # another error shows, whole
    assert not any("heartbeat" in line for line in lines)
