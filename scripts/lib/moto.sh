# Start (or reuse) a moto S3 server for the object-store tests, listening on 127.0.0.1 only.
# Sets RAKAZO_TEST_S3_ENDPOINT. Sourced by scripts/test.sh and the bench script.

RAKAZO_S3_PORT="${RAKAZO_S3_PORT:-55433}"
RAKAZO_S3_LOG="${RAKAZO_S3_LOG:-/tmp/rakazo-test-moto.log}"

s3_answers() {
  python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1)
except Exception:
    sys.exit(1)
PY
}

start_test_s3() {
  local url="http://127.0.0.1:${RAKAZO_S3_PORT}"
  if ! s3_answers "$url"; then
    if ! python3 -c 'import moto.server' 2>/dev/null; then
      echo "test.sh: installing moto[server]"
      python3 -m pip install --quiet 'moto[server]'
    fi
    local bin
    bin=$(command -v moto_server || true)
    if [ -n "$bin" ]; then
      nohup "$bin" -H 127.0.0.1 -p "$RAKAZO_S3_PORT" >"$RAKAZO_S3_LOG" 2>&1 &
    else
      nohup python3 -m moto.server -H 127.0.0.1 -p "$RAKAZO_S3_PORT" >"$RAKAZO_S3_LOG" 2>&1 &
    fi
    for _ in $(seq 1 100); do
      s3_answers "$url" && break
      sleep 0.2
    done
    s3_answers "$url" || { echo "moto did not start; see $RAKAZO_S3_LOG" >&2; return 1; }
  fi
  export RAKAZO_TEST_S3_ENDPOINT="$url"
}
