"""PostgreSQL for the servers: bad settings refused in one line before anything is created, and the stores' settings.

The servers on a running PostgreSQL are tested end to end in tests/test_deployed.py."""

import os
import subprocess

import pytest

from infra import postgres
from infra.postgres import bindir, store_env
from tasks.common.config.errors import UserError
from tests.conftest import ROOT


def secret_file(folder, text: str, mode: int):
    path = folder / "db-credentials"
    path.write_text(text)
    path.chmod(mode)
    return path


def start(name: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "KARMAN_", "DATABASE", "MLFLOW_", "PREFECT_"))}
    return subprocess.run([f"infra/{name}"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_start_postgres_refuses_bad_settings_in_one_line_and_creates_nothing(tmp_path):
    data = tmp_path / "pgdata"
    good = secret_file(tmp_path, "admin:s3cret\n", 0o600)
    open_file = tmp_path / "open"
    open_file.write_text("admin:s3cret\n")
    open_file.chmod(0o644)
    empty = tmp_path / "bin"
    empty.mkdir()
    for env, line in [
        ({"PG_BIN": str(empty), "KARMAN_DB_AUTH_FILE": str(good)},
         f"PG_BIN '{empty}' holds no PostgreSQL server binaries (postgres, initdb, pg_ctl, psql)"),
        ({"KARMAN_DB_AUTH_FILE": str(open_file)},
         f"KARMAN_DB_AUTH_FILE '{open_file}' is open to its group or others (mode 0644); make it owner-only: chmod 600 {open_file}"),
        ({}, "no database credentials: set KARMAN_DB_AUTH_FILE to an owner-only file holding user:password (or PGUSER and PGPASSWORD)"),
        ({"PGUSER": "Admin; DROP", "PGPASSWORD": "x"},
         "the database user 'Admin; DROP' must be lower-case letters, digits and _, starting with a letter or _"),
        ({"KARMAN_DB_AUTH_FILE": str(good), "PGPORT": "99999"}, "PGPORT must be a port number, 1 to 65535 (got '99999')"),
    ]:
        proc = start("start-postgres.sh", PGDATA=str(data), **env)
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"infra/start-postgres.sh: error: {line}"]), (env, proc.stderr[-2000:])
        assert not data.exists()


def test_without_pg_bin_pg_config_or_debian_packages_no_binaries_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "DEBIAN_ROOT", tmp_path)
    with pytest.raises(UserError, match="^no PostgreSQL server binaries found: set PG_BIN"):
        bindir({"PATH": str(tmp_path)})


def test_the_servers_stores_name_the_user_and_keep_the_password_in_the_environment(tmp_path):
    creds = secret_file(tmp_path, "bench:pa:ss\n", 0o600)
    env = {"DATABASE": "postgresql", "PGPORT": "6543", "KARMAN_DB_AUTH_FILE": str(creds)}
    assert store_env("mlflow", env) == {"MLFLOW_BACKEND_STORE_URI": "postgresql+psycopg2://bench@127.0.0.1:6543/mlflow",
                                        "PGUSER": "bench", "PGPASSWORD": "pa:ss"}
    assert store_env("prefect", {**env, "PGHOST": "db.lan"}) == {
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": "postgresql+asyncpg://bench@db.lan:6543/prefect", "PGUSER": "bench", "PGPASSWORD": "pa:ss"}
    # SQLite stays the default: MLflow's local store, Prefect's own
    assert store_env("mlflow", {}) == {"MLFLOW_BACKEND_STORE_URI": "sqlite:///mlflow.db"}
    assert store_env("prefect", {"DATABASE": "sqlite"}) == {}
    with pytest.raises(UserError, match=r"^DATABASE=postgresql names the store itself: unset PREFECT_API_DATABASE_CONNECTION_URL$"):
        store_env("prefect", {**env, "PREFECT_API_DATABASE_CONNECTION_URL": "sqlite+aiosqlite:///x.db"})
    for name in ("start-mlflow-server.sh", "start-prefect-server.sh"):
        proc = start(name, DATABASE="mysql")
        assert (proc.returncode, proc.stderr.splitlines()) == (2, [f"infra/{name}: error: DATABASE must be sqlite or postgresql (got 'mysql')"])
