#!/usr/bin/env bash
# MLflow tracking server over the project's local store. Binds to 127.0.0.1 unless HOST says otherwise;
# beyond loopback (or with AUTH=1) only with MLflow's basic-auth app and credentials (infra/server_auth.py).
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-5000}
# MLflow's own server; its UI opens in the model-training view in a browser that has not chosen one (infra/mlflow_server.py).
exec .venv/bin/python -m infra.mlflow_server --host "$HOST" --port "$PORT" \
  --backend-store-uri "${MLFLOW_BACKEND_STORE_URI:-sqlite:///mlflow.db}" \
  --artifacts-destination "${KARMAN_ARTIFACT_ROOT:-./mlartifacts}"
