#!/usr/bin/env bash
# A Prefect process worker for one work pool (cpu, gpu or tpu), started in the repository root so that
# the deployments' flow runs find the code and its .venv. The pool is created if it does not exist.
# PREFECT_API_URL must point at the Prefect server (default: the one start-prefect-server.sh starts).
# Credentials for authenticated servers come from the environment or the owner-only files that
# KARMAN_MLFLOW_AUTH_FILE and KARMAN_PREFECT_AUTH_FILE name (tasks/common/tracking/credentials.py); the worker's
# flow runs and their cells inherit them.
set -euo pipefail
cd "$(dirname "$0")/.."
POOL=${1:?usage: infra/start-worker.sh cpu|gpu|tpu}
case "$POOL" in
  cpu|gpu|tpu) ;;
  *) echo "infra/start-worker.sh: error: unknown pool '$POOL'; choose cpu, gpu or tpu" >&2; exit 2 ;;
esac
export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:4200/api}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
# MLflow's usage reports stay off in the flow runs and their jobs unless set to false (flows/__main__.py)
export MLFLOW_DISABLE_TELEMETRY=${MLFLOW_DISABLE_TELEMETRY:-true}
exec .venv/bin/python -m tasks.common.tracking.credentials --as infra/start-worker.sh .venv/bin/python -m prefect worker start --pool "$POOL" --type process --name "$POOL-$(hostname)"
