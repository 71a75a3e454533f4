#!/usr/bin/env bash
# Run the benchmarks (release build) with the services they compare against.
# Usage: scripts/bench.sh [core|checkpoint]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/rakazo/target}"
source scripts/lib/postgres.sh
start_test_postgres
export RAKAZO_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:${RAKAZO_PG_PORT}/postgres"
source scripts/lib/moto.sh
start_test_s3
cargo bench --bench "${1:-core}"
