"""Run by each Dask worker of a local cluster whose workers are forked from multiprocessing's fork server (tasks.common.process.cluster) as it starts.

Such a worker inherits the fork server's start method as its own default. numba, when its threads start (the solver's
first parallel step), takes a process-wide lock for its threading layer in any process whose start method says "fork";
under the fork server that lock is a named semaphore the resource tracker is told about, and a worker stopped by a
signal never releases it: the tracker then reports it as leaked, after the command's own last line. A worker starts no
processes of its own, so its default goes back to spawn, as a spawned worker's is, and numba takes no such lock.

A local cluster's scheduler lives in the command's own process and goes away only when the command closes the cluster:
a worker whose heartbeat was on its way at that moment logs Dask's "Failed to communicate with scheduler during
heartbeat." with a traceback of a closed stream, after the sweep has finished well. That line says nothing a user can
act on and stays off the terminal (unless --verbose); the worker's other warnings and errors still show."""

import logging
import multiprocessing

from tasks.common.process.quiet import verbose

HEARTBEAT_LOST = "Failed to communicate with scheduler during heartbeat"


class _ClosingHeartbeat(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(HEARTBEAT_LOST)


def dask_setup(worker) -> None:  # noqa: ARG001  (Dask's preload hook; the worker is not needed)
    multiprocessing.set_start_method("spawn", force=True)
    if not verbose():
        logging.getLogger("distributed.worker").addFilter(_ClosingHeartbeat())
