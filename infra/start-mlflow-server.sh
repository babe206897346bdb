#!/usr/bin/env bash
# MLflow tracking server over the project's local store. Binds to 127.0.0.1 unless HOST says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-5000}
# MLflow 3's UI opens experiments in its GenAI view unless the link (or the browser's saved choice) says otherwise.
echo "MLflow UI, model-training view: http://$HOST:$PORT/#/experiments?workflowType=machine_learning" >&2
exec .venv/bin/mlflow server --host "$HOST" --port "$PORT" \
  --backend-store-uri "${MLFLOW_BACKEND_STORE_URI:-sqlite:///mlflow.db}" \
  --artifacts-destination "${KARMAN_ARTIFACT_ROOT:-./mlartifacts}"
