#!/usr/bin/env bash
# Prefect server and UI. Binds to 127.0.0.1 unless HOST says otherwise; beyond loopback (or with AUTH=1)
# only with an API auth string, which every request must carry (infra/server_auth.py). Its store is
# SQLite in PREFECT_HOME, or with DATABASE=postgresql the database prefect of infra/start-postgres.sh's
# server (infra/postgres.py).
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-4200}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
# The UI in the browser calls the API at this address; Prefect's default names port 4200 whatever the
# port. Behind another name (HOST=0.0.0.0 on a shared host), set PREFECT_UI_API_URL to that name.
if [ "$HOST" != "0.0.0.0" ]; then
  export PREFECT_UI_API_URL=${PREFECT_UI_API_URL:-http://$HOST:$PORT/api}
fi
exec .venv/bin/python -m infra.server_auth --host "$HOST" --port "$PORT"
