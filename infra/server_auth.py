"""Authentication of the MLflow and Prefect servers: required beyond loopback, credentials never on a command line.

A server bound to a loopback address (127.0.0.0/8, ::1, localhost) starts without authentication
unless ``AUTH=1`` asks for it; bound to any other address it always authenticates, and refuses to
start without credentials. The credentials are those a client uses (tasks/common/tracking/credentials.py):
environment variables, or a file only its owner can read.

- MLflow runs its basic-auth app (``mlflow server --app-name basic-auth``). Its admin is the MLflow
  client's user and password (``MLFLOW_AUTH_ADMIN_USERNAME`` and ``MLFLOW_AUTH_ADMIN_PASSWORD`` override
  them); its users live in the database that ``MLFLOW_AUTH_CONFIG_PATH``'s file names (default
  infra/mlflow-auth.ini: ``mlflow-auth.db`` beside ``mlflow.db``, every user may log runs). The key of
  its forms is ``MLFLOW_FLASK_SERVER_SECRET_KEY``, else a new random one at each start.
- Prefect takes the auth string ``user:password`` (``PREFECT_SERVER_API_AUTH_STRING``, else the client's
  ``PREFECT_API_AUTH_STRING`` or ``KARMAN_PREFECT_AUTH_FILE``); its UI asks for that string once.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import sys
from pathlib import Path

from infra.postgres import store_env
from tasks.common.tracking.credentials import MLFLOW_FILE_ENV, PREFECT_FILE_ENV, Credentials, plain
from tasks.common.config.errors import UserError

AUTH_ENV = "AUTH"  # 1: authenticate on loopback too; 0 or unset: only beyond it
MLFLOW_AUTH_INI = Path(__file__).resolve().parent / "mlflow-auth.ini"


def beyond_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` can be reached from other machines."""
    if host.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to any interface
        return True


def authenticate(host: str, env: dict[str, str]) -> bool:
    """Whether a server bound to ``host`` authenticates: always beyond loopback, on loopback with AUTH=1."""
    flag = env.get(AUTH_ENV, "")
    if flag not in ("", "0", "1"):
        raise UserError(f"{AUTH_ENV} must be 0 or 1 (got {flag!r})")
    return flag == "1" or beyond_loopback(host)


def _missing(host: str, what: str, variables: str, file_env: str) -> UserError:
    where = f"HOST={host} is beyond loopback" if beyond_loopback(host) else f"{AUTH_ENV}=1 asks for authentication"
    return UserError(f"{where} and {what}: set {variables}, or {file_env} to an owner-only file holding user:password")


def mlflow_auth(host: str, env: dict[str, str]) -> dict[str, str] | None:
    """The environment that starts MLflow's basic-auth app for a server on ``host``, or None where it
    runs without authentication. UserError (one line) where it must authenticate and has no credentials."""
    if not authenticate(host, env):
        return None
    creds = Credentials.from_env(env)
    user = env.get("MLFLOW_AUTH_ADMIN_USERNAME") or creds.mlflow_user
    password = env.get("MLFLOW_AUTH_ADMIN_PASSWORD") or (creds.mlflow_password.get_secret_value() if creds.mlflow_password else None)
    if not (user and password):
        raise _missing(host, "no credentials are set", "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD", MLFLOW_FILE_ENV)
    plain(f"{user}:{password}", "the MLflow admin's user and password")
    return {"MLFLOW_AUTH_ADMIN_USERNAME": user, "MLFLOW_AUTH_ADMIN_PASSWORD": password,
            "MLFLOW_AUTH_CONFIG_PATH": env.get("MLFLOW_AUTH_CONFIG_PATH") or str(MLFLOW_AUTH_INI),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": env.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32)}


def prefect_auth(host: str, env: dict[str, str]) -> dict[str, str] | None:
    """The environment that makes a Prefect server on ``host`` require its auth string, or None where it
    runs without. UserError (one line) where it must authenticate and has no auth string."""
    if not authenticate(host, env):
        return None
    auth = env.get("PREFECT_SERVER_API_AUTH_STRING")
    if auth:
        plain(auth, "PREFECT_SERVER_API_AUTH_STRING")
    else:
        creds = Credentials.from_env(env)
        auth = creds.prefect_auth.get_secret_value() if creds.prefect_auth else None
    if not auth:
        raise _missing(host, "no auth string is set", "PREFECT_SERVER_API_AUTH_STRING", PREFECT_FILE_ENV)
    # the server's own clients (its UI's settings, its services) send the same string
    return {"PREFECT_SERVER_API_AUTH_STRING": auth, "PREFECT_API_AUTH_STRING": auth}


def prefect_main(argv: list[str]) -> int:
    """``prefect server start ARGV`` (``--host`` taken from ARGV), with its auth string where it needs one,
    on its store (:func:`infra.postgres.store_env`)."""
    name = "infra/start-prefect-server.sh"
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    try:
        extra = {**(prefect_auth(host, dict(os.environ)) or {}), **store_env("prefect", dict(os.environ))}
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "prefect", "server", "start", *argv]
    os.execvpe(cmd[0], cmd, {**os.environ, **extra})


if __name__ == "__main__":
    sys.exit(prefect_main(sys.argv[1:]))
