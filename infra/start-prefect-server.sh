#!/usr/bin/env bash
# Prefect server and UI. Binds to 127.0.0.1 unless HOST says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-4200}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
exec .venv/bin/prefect server start --host "$HOST" --port "$PORT"
