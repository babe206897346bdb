"""The Model Registry, read: ``models:/`` URIs resolved to the training run whose model they name.

Which model a benchmark registers, and when the alias ``champion`` moves, is the workload's own
(``Workload.register``: karman's in tasks/workloads/karman/registry.py).
"""

import re

from tasks.common.config.errors import UserError
from tasks.common.config.settings import Settings
from tasks.common.tracking.runs import client_for, missing, store_not_made

# MlflowException is imported in the functions that catch it: Dask workers import the flows' modules and need no MLflow.

CHAMPION = "champion"
MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))")


def resolve_model_uri(settings: Settings, uri: str) -> str:
    """The training run id behind a registered model's URI, models:/NAME@ALIAS or models:/NAME/VERSION;
    UserError naming the URI where it is malformed or the registry does not know it."""
    from mlflow.exceptions import MlflowException

    found = MODEL_URI.fullmatch(uri)
    if found is None:
        raise UserError(f"model {uri!r} is not a registered model's URI; use models:/NAME@ALIAS or models:/NAME/VERSION")
    if store_not_made(settings):
        raise UserError(f"the model registry at {settings.tracking_uri} has no {uri} (no store there yet); "
                        f"a benchmark registers models:/{settings.registered_model}@{CHAMPION}")
    client = client_for(settings)
    try:
        version = (client.get_model_version_by_alias(found["name"], found["alias"]) if found["alias"]
                   else client.get_model_version(found["name"], found["version"]))
    except MlflowException as exc:
        if not missing(exc):
            raise
        raise UserError(f"the model registry at {settings.tracking_uri} has no {uri} ({exc.error_code}); "
                        f"a benchmark registers models:/{settings.registered_model}@{CHAMPION}") from None
    if not version.run_id:
        raise UserError(f"{uri} (version {version.version}) names no training run")
    return version.run_id

