#!/usr/bin/env bash
# Create the process work pools cpu, gpu and tpu and their concurrency limits pool-cpu, pool-gpu and pool-tpu
# where missing, then deploy every flow of prefect.yaml (prefect deploy --all) to the Prefect API in
# PREFECT_API_URL (default: start-prefect-server.sh's).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PREFECT_API_AUTH_STRING:-}" ] && [ -n "${KARMAN_PREFECT_AUTH_FILE:-}" ]; then
  # the auth string of an authenticated server, read from its owner-only file (tasks/common/credentials.py)
  exec .venv/bin/python -m tasks.common.credentials --as infra/deploy.sh infra/deploy.sh "$@"
fi
export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:4200/api}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
# the pools and their one-slot concurrency limits (infra/pools.py), then every deployment
.venv/bin/python -m infra.pools
exec .venv/bin/prefect --no-prompt deploy --all
