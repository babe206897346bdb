"""Lookups on the Prefect API that the flows and the deploy scripts share."""

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
