"""Real servers for tests, on 127.0.0.1.

Real servers for tests: free ports on 127.0.0.1, waiting for a health URL, background processes
stopped together (infra/services.py), and the environment of authenticated servers."""

import subprocess
import time
from pathlib import Path

from infra.services import Services, free_port, wait_http  # noqa: F401  (the tests' servers)
from tests.conftest import ROOT

AUTH_USER, AUTH_PASSWORD = "admin", "karman-4-vortices!"


def authenticated(folder: Path) -> dict[str, str]:
    """The environment that starts the infra scripts' servers in their authenticated mode on loopback (AUTH=1),
    the credentials in an owner-only file (which clients started with it read too), MLflow's users in ``folder``."""
    creds = folder / "credentials"
    creds.write_text(f"{AUTH_USER}:{AUTH_PASSWORD}\n")
    creds.chmod(0o600)
    ini = folder / "mlflow-auth.ini"
    ini.write_text((ROOT / "infra" / "mlflow-auth.ini").read_text().replace("sqlite:///mlflow-auth.db", f"sqlite:///{folder / 'users.db'}"))
    return {"AUTH": "1", "KARMAN_MLFLOW_AUTH_FILE": str(creds), "KARMAN_PREFECT_AUTH_FILE": str(creds), "MLFLOW_AUTH_CONFIG_PATH": str(ini)}


def wait_postgres(port: int, database: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    """Until infra/start-postgres.sh's server on 127.0.0.1:``port`` lets the tests' user into ``database``."""
    import psycopg2

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            psycopg2.connect(host="127.0.0.1", port=port, user=AUTH_USER, password=AUTH_PASSWORD, dbname=database,
                             connect_timeout=2).close()
            return
        except psycopg2.OperationalError:
            time.sleep(0.5)
    raise AssertionError(f"PostgreSQL on port {port} did not answer within {timeout} s:\n{log.read_text()[-3000:]}")
