#!/usr/bin/env bash
# MLflow tracking server over the project's local store. Binds to 127.0.0.1 unless HOST says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-5000}
exec .venv/bin/mlflow server --host "$HOST" --port "$PORT" \
  --backend-store-uri "${MLFLOW_BACKEND_STORE_URI:-sqlite:///mlflow.db}" \
  --artifacts-destination "${KARMAN_ARTIFACT_ROOT:-./mlartifacts}"
