"""Other libraries' chatter kept off the terminal unless asked for (--verbose).

``--verbose`` sets KARMAN_VERBOSE=1 for the command and its child processes. Kept off otherwise:
their warnings, their INFO logs, Prefect's lifecycle lines for runs that completed, and the tracebacks
of this project's own one-line errors. Errors, failed states and this project's own lines always show.
"""

import logging
import os
import sys
import warnings

VERBOSE_ENV = "KARMAN_VERBOSE"
LIBRARIES = r"(zarr|numcodecs|mlflow|torch|torch_xla|dask|distributed|numba|matplotlib|pydantic|alembic|sqlalchemy)(\.|$)"
# Prefect lines that say nothing a user asked for: the temporary API's start and stop, task and flow
# runs that began or completed (a failed state still shows).
LIFECYCLE = ("Starting temporary server", "Stopping temporary server", "Beginning flow run", "Beginning subflow run",
             "Created task run", "Executing '", "Finished in state Completed",
             "Still processing items")  # Prefect's event worker flushing what is left as the command ends


# Exceptions whose one-line message says it all: their tracebacks stay off the console (the Prefect UI
# keeps them); the command ends with their message as its verdict.
OWN_ERRORS = {"UserError", "RunFailed", "RunStopped", "ChildFailed", "Interrupted", "KeyboardInterrupt", "TerminationSignal"}


class _OwnErrorsInOneLine(logging.Formatter):
    """Wraps a console formatter: a record of one of OWN_ERRORS is formatted without its traceback."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        if not (record.exc_info and record.exc_info[0] is not None and record.exc_info[0].__name__ in OWN_ERRORS):
            return self.inner.format(record)
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text = saved


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV) == "1"


class _Lifecycle(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(LIFECYCLE)


def quiet_libraries() -> None:
    """Silence the libraries' warnings and INFO logs in this process (unless verbose)."""
    if verbose():
        return
    warnings.filterwarnings("ignore", module=LIBRARIES)
    for name in ("distributed", "numba", "alembic", "urllib3", "matplotlib", "tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's warnings are advice on its own use (pickled models, ...). It sets its loggers' levels when
    # imported, from MLFLOW_LOGGING_LEVEL: say ERROR there (this process and its children) rather than
    # importing it here (1.5 s) in a process that may never need it; one that already has it is set directly.
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
    if "mlflow" in sys.modules:
        logging.getLogger("mlflow").setLevel(logging.ERROR)


def quiet_prefect_console() -> None:
    """Keep Prefect's lifecycle lines off its console handlers (the Prefect UI keeps them) unless verbose."""
    if verbose():
        return
    names = ["", "prefect", *(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))]  # "" = the root
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if "Console" in type(handler).__name__ and not any(isinstance(f, _Lifecycle) for f in handler.filters):
                handler.addFilter(_Lifecycle())
                handler.setFormatter(_OwnErrorsInOneLine(handler.formatter))
