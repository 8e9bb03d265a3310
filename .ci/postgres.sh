#!/usr/bin/env bash
# Start a throwaway PostgreSQL server (Debian's package) on 127.0.0.1 for the tests and print
# `export AUTOTUNE_TEST_PG_URL=...`; `eval "$(bash .ci/postgres.sh)"` in .ci/run.
# `bash .ci/postgres.sh stop` stops it. Idempotent: a server already up is reused.
set -euo pipefail
PGPORT=${AUTOTUNE_PG_PORT:-55432}
PGDIR=${AUTOTUNE_PG_DIR:-/tmp/autotune-pg}
if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
if [ "$(id -u)" = 0 ]; then AS_PG=(runuser -u postgres --); else AS_PG=(); fi
if [ "${1:-start}" = stop ]; then
  "${AS_PG[@]}" "$BIN/pg_ctl" -D "$PGDIR/data" -m fast stop >&2 || true
  exit 0
fi
mkdir -p "$PGDIR"
[ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"
if [ ! -f "$PGDIR/data/PG_VERSION" ]; then
  "${AS_PG[@]}" "$BIN/initdb" -D "$PGDIR/data" -U postgres --auth=trust -E UTF8 >&2
fi
if ! "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT"; then
  "${AS_PG[@]}" "$BIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGDIR -c max_connections=200 -c fsync=off" start >&2
fi
psql() { command psql -v ON_ERROR_STOP=1 -q -h 127.0.0.1 -p "$PGPORT" -U postgres "$@"; }
psql -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'autotune'" | grep -q 1 \
  || psql -c "CREATE ROLE autotune LOGIN PASSWORD 'autotune' CREATEDB" >&2
# CREATEROLE: the secrets test makes a role of its own with a password found nowhere else
psql -c "ALTER ROLE autotune CREATEROLE" >&2
psql -tAc "SELECT 1 FROM pg_database WHERE datname = 'autotune'" | grep -q 1 \
  || psql -c "CREATE DATABASE autotune OWNER autotune" >&2
echo "export AUTOTUNE_TEST_PG_URL=postgresql+psycopg://autotune:autotune@127.0.0.1:$PGPORT/autotune"
