# Start (or reuse) a throwaway Postgres cluster for the tests, listening on 127.0.0.1 only.
# Sets RAKAZO_PG_PORT. Sourced by scripts/test.sh and the bench script.

RAKAZO_PG_PORT="${RAKAZO_PG_PORT:-55432}"
RAKAZO_PG_DIR="${RAKAZO_PG_DIR:-/tmp/rakazo-test-postgres}"

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$dir" ] || { echo "postgres binaries not found" >&2; return 1; }
  echo "$dir"
}

start_test_postgres() {
  local bin run_as
  bin=$(pg_bin)
  if [ "$(id -u)" = 0 ]; then run_as=(runuser -u postgres --); else run_as=(); fi
  if "${run_as[@]}" "$bin/pg_isready" -q -h 127.0.0.1 -p "$RAKAZO_PG_PORT" 2>/dev/null; then
    return 0
  fi
  mkdir -p "$RAKAZO_PG_DIR"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$RAKAZO_PG_DIR"
  if [ ! -f "$RAKAZO_PG_DIR/PG_VERSION" ]; then
    "${run_as[@]}" "$bin/initdb" -D "$RAKAZO_PG_DIR" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  "${run_as[@]}" "$bin/pg_ctl" -D "$RAKAZO_PG_DIR" -l "$RAKAZO_PG_DIR/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $RAKAZO_PG_PORT -c unix_socket_directories=$RAKAZO_PG_DIR -c fsync=off -c max_connections=400" start >/dev/null
}
