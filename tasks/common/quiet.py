"""Other libraries' chatter kept off the terminal unless asked for (--verbose).

``--verbose`` sets KARMAN_VERBOSE=1 for the command and its child processes. Kept off otherwise:
their warnings, their INFO logs, and Prefect's lifecycle lines for runs that completed. Errors, failed states and this project's own lines
always show.
"""

import logging
import os
import warnings

VERBOSE_ENV = "KARMAN_VERBOSE"
LIBRARIES = r"(zarr|numcodecs|mlflow|torch|torch_xla|dask|distributed|numba|matplotlib|pydantic|alembic|sqlalchemy)(\.|$)"
# Prefect lines that say nothing a user asked for: the temporary API's start and stop, task and flow
# runs that began or completed (a failed state still shows).
LIFECYCLE = ("Starting temporary server", "Stopping temporary server", "Beginning flow run", "Beginning subflow run",
             "Created task run", "Executing '", "Finished in state Completed")


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
    for name in ("distributed", "numba", "alembic", "urllib3", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    import mlflow  # noqa: F401  (it sets its loggers' levels when imported: import it first)

    logging.getLogger("mlflow").setLevel(logging.ERROR)  # its warnings are advice on its own use (pickled models, ...)


def quiet_prefect_console() -> None:
    """Keep Prefect's lifecycle lines off its console handlers (the Prefect UI keeps them) unless verbose."""
    if verbose():
        return
    names = ["", "prefect", *(n for n in logging.root.manager.loggerDict if n.startswith("prefect"))]  # "" = the root
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if "Console" in type(handler).__name__ and not any(isinstance(f, _Lifecycle) for f in handler.filters):
                handler.addFilter(_Lifecycle())
