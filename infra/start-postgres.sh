#!/usr/bin/env bash
# A PostgreSQL server for the MLflow and Prefect servers (DATABASE=postgresql), in the foreground on
# 127.0.0.1:PGPORT (default 5432), its cluster in PGDATA (default ./pgdata, created where missing) with
# the databases mlflow and prefect; SIGTERM or Ctrl-C stop it at once (a fast shutdown). Password
# authentication only; the user and password come from PGUSER and PGPASSWORD or the owner-only file
# KARMAN_DB_AUTH_FILE names, never a command line (infra/postgres.py). The binaries: PG_BIN, else pg_config --bindir, else Debian's.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m infra.postgres "$@"
