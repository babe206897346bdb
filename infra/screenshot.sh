#!/usr/bin/env bash
# A PNG of a page as a browser renders it (headless Chromium), e.g. the Prefect or MLflow UI:
#   infra/screenshot.sh URL OUT.png [WIDTHxHEIGHT] [WAIT_MS]
set -euo pipefail
url=$1 out=$2 size=${3:-1500x950} wait=${4:-12000}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "screenshot.sh: no Chromium found (apt-get install chromium)" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
  --window-size="${size/x/,}" --virtual-time-budget="$wait" --screenshot="$out" "$url" 2>/dev/null
test -s "$out"
