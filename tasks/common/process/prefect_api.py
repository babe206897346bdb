"""Lookups on the Prefect API that the flows and the deploy scripts share, and its temporary server started early."""

import threading
from collections.abc import Callable, Iterable
from typing import Any


def missing(names: Iterable[str], read: Callable[[Any, str], object]) -> list[str]:
    """Those of ``names`` that the Prefect API does not have, in order: ``read(client, name)`` reads one
    (``client.read_deployment_by_name(name)``, ...) and raises Prefect's ObjectNotFound where it is not there."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    absent = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                read(client, name)
            except ObjectNotFound:
                absent.append(name)
    return absent


def temporary_api_started() -> threading.Thread | None:
    """Prefect's temporary local API, which a flow run starts where no server is named, started now in a thread of its
    own while the command goes on (its MLflow store, the flow's modules, the guardian): its process takes about 4 s to
    answer, which a command otherwise waits out after all of that (docs/architecture.md). ``None`` where a server is
    named. Join the thread before Prefect's API is first used: Prefect's start is not made for two callers at once
    (one that finds it half started goes on against a server not yet up). The thread is no daemon: a command that ends
    before it joins waits for the start, and Prefect's exit handler then stops the server, as after any run."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    from tasks.common.process.quiet import quiet_prefect_console

    quiet_prefect_console()  # Prefect's console handlers exist once it is imported: its "Starting temporary server" kept off
    server = SubprocessASGIServer()
    thread = threading.Thread(target=_start_quietly, args=(server,), name="prefect-temporary-api")
    thread.start()
    return thread


def _start_quietly(server: Any) -> None:
    """Start ``server``; a failure is left to the flow run, whose own start of it then says why."""
    try:
        server.start()
    except Exception:  # noqa: BLE001 - Prefect starts it again for the flow run and raises there
        pass
