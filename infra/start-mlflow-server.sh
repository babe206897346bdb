#!/usr/bin/env bash
# MLflow tracking server over the project's local store (MLFLOW_BACKEND_STORE_URI, default sqlite:///mlflow.db),
# or with DATABASE=postgresql the database mlflow of infra/start-postgres.sh's server (infra/postgres.py).
# Binds to 127.0.0.1 unless HOST says otherwise; beyond loopback (or with AUTH=1) only with MLflow's
# basic-auth app and credentials (infra/server_auth.py).
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-5000}
# MLflow's usage reports (the server's and its UI's) stay off unless set to false: these hosts may have no internet
export MLFLOW_DISABLE_TELEMETRY=${MLFLOW_DISABLE_TELEMETRY:-true}
# MLflow's own server; its UI opens in the model-training view in a browser that has not chosen one (infra/mlflow_server.py).
# The store's URI goes through the environment, not the command line, where every user could read it.
exec .venv/bin/python -m infra.mlflow_server --host "$HOST" --port "$PORT" --artifacts-destination "${KARMAN_ARTIFACT_ROOT:-./mlartifacts}"
