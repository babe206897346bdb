#!/usr/bin/env bash
# Create the process work pools cpu, gpu and tpu and their concurrency limits pool-cpu, pool-gpu and pool-tpu
# where missing (infra/pools.py), then deploy every flow of prefect.yaml (prefect deploy --all) to the
# Prefect API in PREFECT_API_URL (default: start-prefect-server.sh's).
# Arguments replace --all: infra/deploy.sh --name train/gpu --name infer/gpu deploys those two.
# With KARMAN_REPO_URL set, every deployment gets pull steps (infra/pull_steps.py): its flow runs clone
# that repository at KARMAN_REPO_COMMIT (default: this checkout's HEAD), so workers need no checkout.
# The URL and the commit are checked first: one that git cannot reach or find ends it, exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PREFECT_API_AUTH_STRING:-}" ] && [ -n "${KARMAN_PREFECT_AUTH_FILE:-}" ]; then
  # the auth string of an authenticated server, read from its owner-only file (tasks/common/tracking/credentials.py)
  exec .venv/bin/python -m tasks.common.tracking.credentials --as infra/deploy.sh infra/deploy.sh "$@"
fi
export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:4200/api}
export PREFECT_SERVER_ANALYTICS_ENABLED=${PREFECT_SERVER_ANALYTICS_ENABLED:-false}
prefect_file=prefect.yaml
if [ -n "${KARMAN_REPO_URL+set}" ]; then
  prefect_file=$(mktemp "${TMPDIR:-/tmp}/karman-prefect-XXXXXX.yaml")
  trap 'rm -f "$prefect_file"' EXIT
  .venv/bin/python -m infra.pull_steps prefect.yaml "$prefect_file"
elif [ -n "${KARMAN_REPO_COMMIT:-}" ]; then
  echo "infra/deploy.sh: error: KARMAN_REPO_COMMIT='$KARMAN_REPO_COMMIT' is set without KARMAN_REPO_URL; set the URL of the repository that workers clone, or unset both to deploy from this folder" >&2
  exit 2
fi
# python -m prefect, not .venv/bin/prefect: a script's first line names the Python of the folder where the
# environment was created, which a moved .venv no longer is
.venv/bin/python -m infra.pools  # the pools and their one-slot concurrency limits
.venv/bin/python -m prefect --no-prompt deploy --prefect-file "$prefect_file" "${@:---all}"
