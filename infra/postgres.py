"""PostgreSQL as the servers' store: a local cluster for MLflow and Prefect, and the settings that point them at it.

``infra/start-postgres.sh`` (``python -m infra.postgres``) initialises a cluster in ``PGDATA`` (default
``./pgdata``) where it has none, creates the databases ``mlflow`` and ``prefect`` where missing, and runs
``postgres`` in the foreground on 127.0.0.1:``PGPORT`` (default 5432) with password authentication
(scram-sha-256) only. Its user and password are the database's credentials: ``PGUSER`` and ``PGPASSWORD``,
else ``KARMAN_DB_AUTH_FILE`` naming an owner-only file that holds ``user:password`` (the rules of
tasks/common/tracking/credentials.py); never a command line. The binaries come from ``PG_BIN``, else
``pg_config --bindir``, else Debian's ``/usr/lib/postgresql/<version>/bin``. PostgreSQL refuses to run
as root: started by root, it runs as the account ``PG_OS_USER`` (default ``postgres``), which then owns
``PGDATA``.

With ``DATABASE=postgresql``, infra/start-mlflow-server.sh and infra/start-prefect-server.sh use that
cluster (:func:`store_env`): their connection URLs name the user, not the password, which their drivers
(psycopg2 for MLflow, asyncpg for Prefect) read from ``PGPASSWORD`` in the servers' environment.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tasks.common.tracking.credentials import plain, read_secret_file
from tasks.common.config.errors import UserError

DATABASE_ENV = "DATABASE"  # sqlite (the default) or postgresql
DB_FILE_ENV = "KARMAN_DB_AUTH_FILE"
DATABASES = ("mlflow", "prefect")  # one per server, named after it
DEBIAN_ROOT = Path("/usr/lib/postgresql")
# the variable each server reads its store from, and the SQLAlchemy driver it needs (a bare postgresql:// is
# psycopg 3 in SQLAlchemy 2.1, which requirements.txt does not install)
STORE_VARIABLE = {"mlflow": ("MLFLOW_BACKEND_STORE_URI", "postgresql+psycopg2"),
                  "prefect": ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "postgresql+asyncpg")}
PREFECT_OLD_VARIABLE = "PREFECT_API_DATABASE_CONNECTION_URL"  # Prefect 3.8 reads this name too


def bindir(env: dict[str, str]) -> Path:
    """The folder of the PostgreSQL server binaries: ``PG_BIN``, else ``pg_config --bindir``, else the newest
    of Debian's; UserError where none holds ``postgres`` and ``initdb``."""
    def complete(folder: Path) -> bool:
        return all((folder / name).is_file() for name in ("postgres", "initdb", "pg_ctl", "psql"))

    if env.get("PG_BIN"):
        if not complete(Path(env["PG_BIN"])):
            raise UserError(f"PG_BIN {env['PG_BIN']!r} holds no PostgreSQL server binaries (postgres, initdb, pg_ctl, psql)")
        return Path(env["PG_BIN"])
    pg_config = shutil.which("pg_config", path=env.get("PATH", os.defpath))
    if pg_config:
        folder = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if complete(folder):
            return folder
    versions = sorted((p for p in DEBIAN_ROOT.glob("*/bin") if p.parent.name.isdigit() and complete(p)),
                      key=lambda p: int(p.parent.name))
    if versions:
        return versions[-1]
    raise UserError("no PostgreSQL server binaries found: set PG_BIN to the folder holding postgres and initdb, "
                    "or install PostgreSQL (Debian: apt-get install postgresql)")


def credentials(env: dict[str, str]) -> tuple[str, str]:
    """The database's (user, password): ``PGUSER`` and ``PGPASSWORD``, else the owner-only file that
    ``KARMAN_DB_AUTH_FILE`` names; UserError where neither is set or the file is refused."""
    user, password = env.get("PGUSER"), env.get("PGPASSWORD")
    if not (user and password):
        if not env.get(DB_FILE_ENV):
            raise UserError(f"no database credentials: set {DB_FILE_ENV} to an owner-only file holding user:password "
                            "(or PGUSER and PGPASSWORD)")
        user, password = read_secret_file(env[DB_FILE_ENV], DB_FILE_ENV)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", user):
        raise UserError(f"the database user {user!r} must be lower-case letters, digits and _, starting with a letter or _")
    plain(password, "the database password")
    return user, password


def port(env: dict[str, str]) -> int:
    """``PGPORT`` (default 5432); UserError where it is not a port number."""
    value = env.get("PGPORT") or "5432"
    if not (value.isdigit() and 0 < int(value) < 65536):
        raise UserError(f"PGPORT must be a port number, 1 to 65535 (got {value!r})")
    return int(value)


def store_env(server: str, env: dict[str, str]) -> dict[str, str]:
    """The environment that puts ``server`` (mlflow or prefect) on its store: with ``DATABASE=postgresql``
    its database on ``PGHOST`` (default 127.0.0.1):``PGPORT``, the password in ``PGPASSWORD``; else SQLite
    (MLflow's ``MLFLOW_BACKEND_STORE_URI``, default ``sqlite:///mlflow.db``; Prefect's own default).
    UserError (one line) for another DATABASE, missing credentials, or a store URL set beside it."""
    kind = env.get(DATABASE_ENV) or "sqlite"
    if kind not in ("sqlite", "postgresql"):
        raise UserError(f"{DATABASE_ENV} must be sqlite or postgresql (got {kind!r})")
    variable, driver = STORE_VARIABLE[server]
    if kind == "sqlite":
        return {variable: env.get(variable) or "sqlite:///mlflow.db"} if server == "mlflow" else {}
    for name in (variable, PREFECT_OLD_VARIABLE) if server == "prefect" else (variable,):
        if env.get(name):
            raise UserError(f"{DATABASE_ENV}=postgresql names the store itself: unset {name}")
    user, password = credentials(env)
    host = env.get("PGHOST") or "127.0.0.1"
    return {variable: f"{driver}://{user}@{host}:{port(env)}/{server}", "PGUSER": user, "PGPASSWORD": password}


def _become_server_account(data: Path, env: dict[str, str]) -> None:
    """As root, which PostgreSQL refuses: become the unprivileged account ``PG_OS_USER`` (default postgres),
    owner of ``data``. Any other user runs it as itself."""
    if os.geteuid() != 0:
        return
    name = env.get("PG_OS_USER") or "postgres"
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise UserError(f"PostgreSQL does not run as root and there is no account {name!r} to run it: "
                        "set PG_OS_USER to an unprivileged user, or start it as one") from None
    if account.pw_uid == 0:
        raise UserError(f"PG_OS_USER {name!r} is root, which PostgreSQL refuses: name an unprivileged user")
    data.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(data, account.pw_uid, account.pw_gid)
    os.setgroups([])
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    if not os.access(data, os.R_OK | os.W_OK | os.X_OK):
        raise UserError(f"PGDATA {str(data)!r} is out of reach of the account {name!r} that runs PostgreSQL: "
                        "put it in a folder that account may enter")


def _create_databases(binaries: Path, data: Path, user: str, password: str, env: dict[str, str]) -> None:
    """``DATABASES`` where missing, by a short run of the cluster that listens only on a socket in a
    private folder (nobody else can connect meanwhile)."""
    sockets = tempfile.mkdtemp(prefix="karman-pg-")
    env = {**env, "PGPASSWORD": password, "PGUSER": user, "PGHOST": sockets, "PGDATABASE": "postgres"}
    options = f"-c listen_addresses='' -k {sockets}"
    subprocess.run([binaries / "pg_ctl", "start", "-w", "-D", data, "-o", options], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    try:
        listed = subprocess.run([binaries / "psql", "-X", "-tA", "-c", "SELECT datname FROM pg_database"], env=env,
                                check=True, capture_output=True, text=True).stdout.split()
        for name in DATABASES:
            if name not in listed:
                subprocess.run([binaries / "psql", "-X", "-q", "-c", f"CREATE DATABASE {name}"], env=env, check=True)
    finally:
        subprocess.run([binaries / "pg_ctl", "stop", "-w", "-m", "fast", "-D", data], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(sockets, ignore_errors=True)


def main(argv: list[str]) -> int:
    """Initialise the cluster where missing, create its databases where missing, then run ``postgres`` on
    127.0.0.1 until it ends; SIGTERM or SIGINT stop it at once (PostgreSQL's fast shutdown: open sessions
    are rolled back, where its own answer to SIGTERM waits for every client to leave). Bad settings: one
    line, exit 2, nothing created."""
    name = "infra/start-postgres.sh"
    if argv:
        print(f"usage: {name} (settings from PGDATA, PGPORT, {DB_FILE_ENV} or PGUSER and PGPASSWORD, PG_BIN)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    data = Path(env.get("PGDATA") or "pgdata").absolute()
    try:
        binaries, (user, password), pgport = bindir(env), credentials(env), port(env)
        _become_server_account(data, env)
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    env.pop("PGPASSWORD", None)
    if not (data / "PG_VERSION").exists():
        # the password through a pipe, never a command line; password authentication only, also on sockets
        subprocess.run([binaries / "initdb", "-D", data, "-U", user, "--pwfile=/dev/stdin", "--auth=scram-sha-256",
                        "--encoding=UTF8", "--no-locale"], input=password + "\n", text=True, env=env, check=True)
    _create_databases(binaries, data, user, password, env)
    print(f"PostgreSQL: 127.0.0.1:{pgport}, databases {', '.join(DATABASES)}, user {user}", file=sys.stderr, flush=True)
    postgres = [str(binaries / "postgres"), "-D", str(data), "-p", str(pgport), "-c", "listen_addresses=127.0.0.1", "-k", ""]
    server = subprocess.Popen(postgres, env=env)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: server.send_signal(signal.SIGINT))
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
