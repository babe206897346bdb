"""Prefect task runs on Dask: the task runner a flow submits a dataset's pieces to (a local cluster or an existing scheduler), and their results as they finish."""

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# Dask's own chatter (workers joining and leaving, a lost worker's tasks rescheduled) stays at warnings, and so does the
# task runner's (it names a dashboard link even for a cluster started without one).
_DASK_LOGGERS = ("distributed", "distributed.scheduler", "distributed.nanny", "distributed.core", "distributed.worker", "prefect.task_runner.dask")


OTHER_COMMS = ("inproc", "ws", "wss", "ucx")  # Dask's transports besides tcp and tls (distributed.comm's registry)


def check_scheduler(address: str, timeout: float = 5.0) -> None:
    """UserError, in one line, unless a Dask scheduler may be at ``address``: tcp://HOST:PORT or tls://HOST:PORT (a bare
    HOST:PORT is tcp's) whose port takes a connection within ``timeout`` s, or an address of another of Dask's transports. (Dask itself would try for 30 s, then end the
    command in a traceback with the dataset's folder and lock made.)"""
    import socket
    from urllib.parse import urlsplit

    from tasks.common.config.errors import UserError

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme in OTHER_COMMS:
        return  # Dask's other transports: left to Dask
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("tcp", "tls") or not parts.hostname or port is None:
        raise UserError(f"--scheduler {address!r} is not a Dask scheduler's address; give tcp://HOST:PORT or tls://HOST:PORT "
                        f"(or an address of Dask's {', '.join(OTHER_COMMS)} transports)")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as exc:
        raise UserError(f"--scheduler {address}: no Dask scheduler answers there ({exc.strerror or type(exc).__name__}); "
                        "start one, or leave out --scheduler for a local cluster") from None


@contextmanager
def dask_task_runner(workers: int, scheduler: str | None = None, preload: Sequence[str] = ()) -> Iterator[Any]:
    """A started ``prefect_dask.DaskTaskRunner``: on ``scheduler`` (a Dask scheduler's address: a SLURM cluster of
    infra/start-slurm-cluster.py, any other) when given, else on a LocalCluster here of ``workers`` processes, one
    thread each (numba threads inside a process would take the cores the other workers use), no dashboard, on
    127.0.0.1. The cluster is started on entry and closed on exit; a scheduler given by address is left running.
    On Linux a local cluster's workers are forked from a server that has imported Dask, Prefect and the modules named in
    ``preload`` (those holding the tasks) once (:func:`_forked_workers`), instead of each worker a fresh interpreter.

    Every task submitted to it is a Prefect task run of the running flow, executed on a Dask worker; a worker lost
    in the middle has its task started again on another worker by the Dask scheduler, under the same task run."""
    from distributed import LocalCluster
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect_dask import DaskTaskRunner

    # The workers report their task runs to the API this process reports to; they learn its address from the settings
    # each task carries. Without PREFECT_API_URL this process runs on a temporary local server that the settings do not
    # name: name it, or every worker process would start a temporary server of its own.
    with get_client(sync_client=True) as client:
        api = PREFECT_API_URL.value() or str(client.api_url)
    for name in _DASK_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    if scheduler:
        runner = DaskTaskRunner(address=scheduler)
    else:
        runner = DaskTaskRunner(cluster_class=LocalCluster, cluster_kwargs={
            "n_workers": workers, "threads_per_worker": 1, "processes": True, "dashboard_address": None, "host": "127.0.0.1"})
    with temporary_settings({PREFECT_API_URL: api}), _forked_workers(preload if not scheduler else None), runner:
        # LocalCluster sets OMP/MKL/OPENBLAS_NUM_THREADS=1 (and more) in this process and leaves them set: a training
        # child started from here later would run on one thread. The runner starts its cluster on first use: start it
        # now, then put them back.
        saved = dict(os.environ)
        try:
            runner.client
        finally:
            restore_environ(saved)
        yield runner
        runner.client.run(_flush_prefect)


# What every worker imports before its first task: Dask's worker, Prefect's task engine and its Dask runner, the arrays
# and stores a dataset's pieces are written with.
WORKER_PRELOAD = ("distributed", "distributed.nanny", "numpy", "pandas", "prefect", "prefect.task_engine", "prefect_dask", "zarr", "xarray")


@contextmanager
def _forked_workers(preload: Sequence[str] | None) -> Iterator[None]:
    """A LocalCluster's workers forked from multiprocessing's fork server, which imports ``WORKER_PRELOAD`` and
    ``preload`` once and then freezes them (tasks.common.process.collector_frozen), instead of spawned as fresh interpreters
    that each import them (Dask's default): a four-simulation sweep on two workers 17.6 s of the machine's CPU against
    21.6 s (docs/architecture.md). The server starts with the first worker, in this process's environment as Dask has
    set it for its workers (one thread each) with this project's root on PYTHONPATH (its modules found from any
    folder), and imports nothing that starts a thread; each worker sets its default start method back to spawn as it
    starts (tasks.common.process.dask_worker: no semaphore of numba's left behind by a worker stopped by a signal). ``None`` (a
    scheduler given by address), or not Linux: as Dask has it."""
    if preload is None or sys.platform != "linux":
        yield
        return
    import multiprocessing

    import dask
    from distributed.utils import get_mp_context

    from tasks.common.process.warm import FROZEN, importable_in_servers

    importable_in_servers()
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver", "distributed.worker.preload": ["tasks.common.process.dask_worker"]}):
        get_mp_context()  # Dask sets its own preload list once per process: ours replaces it
        multiprocessing.get_context("forkserver").set_forkserver_preload([*WORKER_PRELOAD, *preload, FROZEN])
        yield


async def _flush_prefect() -> None:
    """On a worker: send the task runs' last events and logs to the Prefect API now; without it, they are sent when
    the worker process exits, which outlasts the time a closing cluster gives it."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (EventsWorker, APILogWorker):
        waiting = service.drain_all(timeout=10)
        if waiting is not None:
            await waiting


def finished(runner: Any, futures: Iterable[Any]) -> Iterator[tuple[Any, Any, BaseException | None]]:
    """``(future, result, None)`` or ``(future, None, error)`` for each Prefect future of ``runner``, in the
    order they finish; the error is the task's last exception after its retries, or Dask's (a worker lost more often
    than the scheduler allows, a scheduler gone)."""
    from distributed import as_completed

    by_dask = {f.wrapped_future: f for f in futures}
    for done in as_completed(list(by_dask), loop=runner.client.loop):
        future = by_dask[done]
        try:
            yield future, future.result(), None
        except Exception as exc:  # noqa: BLE001 - the caller reports each failure and goes on with the others
            yield future, None, exc


def worth_retrying(task, task_run, state) -> bool:
    """A Prefect ``retry_condition_fn`` for a dataset's pieces: no retry for what would fail again the same way (a
    diverged simulation, a spec refused), a retry for the rest (a file system that hiccuped, a worker short of memory)."""
    from tasks.common.config.errors import UserError

    return not isinstance(state.data, (FloatingPointError, ValueError, UserError))


def restore_environ(saved: dict[str, str]) -> None:
    """Make os.environ equal to ``saved`` again (values changed, added or removed since)."""
    for key in set(os.environ) - set(saved):
        del os.environ[key]
    os.environ.update(saved)
