#!/usr/bin/env bash
# The test command: installs and starts what the tests need (idempotently), then runs every
# test of the workspace. A test whose part is missing fails saying so; this script never sets
# RAKAZO_TEST_SKIP_MISSING. Usage: scripts/test.sh [extra cargo test arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
here=$(pwd)

# One shared build directory across checkouts (CI clones afresh; compiled dependencies stay).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/rakazo/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

need_apt=()
command -v pg_ctlcluster >/dev/null 2>&1 || [ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "test.sh: installing ${need_apt[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# Real screens: Xvfb, x11vnc, websockify + noVNC, fluxbox, Chromium and the reference tools.
scripts/install-desktop-deps.sh
scripts/install-screen-deps.sh >/dev/null

# Docker computers: the computer image, built from Debian's packages once per recipe hash
# (nothing is pulled). The docker tests start their own supervisor on 127.0.0.1:0; without
# an engine they fail, saying so.
if docker version >/dev/null 2>&1; then
  scripts/build-computer-image.sh >/dev/null
elif [ -n "${CI:-}" ]; then
  echo "test.sh: CI needs a Docker engine for the docker tests" >&2
  exit 1
else
  echo "test.sh: no Docker engine answers: the docker tests will fail (install Docker)" >&2
fi

# The ecosystem's MCP client, which the MCP test drives our endpoint with.
if ! python3 -c "import mcp.client.streamable_http" >/dev/null 2>&1; then
  echo "test.sh: installing the mcp package"
  python3 -m pip install --quiet --disable-pip-version-check 'mcp>=2,<3'
fi

# E2B's official SDK, which the e2b-emulator faithfulness test drives the emulator with.
if ! python3 -c "import e2b" >/dev/null 2>&1; then
  echo "test.sh: installing the e2b package"
  python3 -m pip install --quiet --disable-pip-version-check 'e2b>=2.6,<3'
fi

# Daytona's official Python SDK, which the daytona-emulator test drives (tests/daytona_sdk.py).
if ! python3 -c "import daytona" >/dev/null 2>&1; then
  echo "test.sh: installing the daytona package"
  python3 -m pip install --quiet --disable-pip-version-check 'daytona==0.226.1'
fi

# A private Postgres cluster on a loopback port, owned by the postgres user.
source scripts/lib/postgres.sh
start_test_postgres
export RAKAZO_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:${RAKAZO_PG_PORT}/postgres"

# A moto S3 server on a loopback port for the object-store tests (sets RAKAZO_TEST_S3_ENDPOINT).
source scripts/lib/moto.sh
start_test_s3

cd "$here"
cargo test --workspace "$@"
