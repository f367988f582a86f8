#!/usr/bin/env bash
# The PostgreSQL server for the test suite and the benchmarks.
#
#   .ci/start-postgres.sh [PORT]   when a server already answers on 127.0.0.1:PORT (default
#                                  5432), use it. Otherwise install Debian's `postgresql`
#                                  package if its binaries are missing (apt-get, as root),
#                                  create a cluster in JOBPOOL_CI_PGDATA (default
#                                  /var/lib/jobpool-ci/postgres) the first time, and start it
#                                  on 127.0.0.1:PORT. A rerun on the same machine starts the
#                                  same cluster again.
#
# The cluster: trust authentication on 127.0.0.1 and its own Unix socket folder only (no other
# address listens), max_connections 400 (the suite's connection-limit tests and the benchmarks'
# 64-slot runs), autovacuum and every other setting at PostgreSQL's defaults. PostgreSQL refuses
# to run as root, so the cluster belongs to the `postgres` user (Debian's package creates it).
#
# Prints one line, the DSN to export as JOBPOOL_TEST_DSN (and JOBPOOL_BENCH_DSN).
set -euo pipefail

PORT="${1:-5432}"
DATA="${JOBPOOL_CI_PGDATA:-/var/lib/jobpool-ci/postgres}"
DSN="postgresql://postgres@127.0.0.1:${PORT}/postgres"

die() { echo "start-postgres: $*" >&2; exit 1; }

answers() { pg_isready -q -h 127.0.0.1 -p "$PORT" 2>/dev/null; }

# The newest installed server binaries (Debian keeps them per major version).
find_bin() {
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k4 -n | tail -n 1)
    [ -n "$bin" ] && [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && echo "$bin"
    return 0
}

install_postgresql() {
    [ -n "$(find_bin)" ] && command -v pg_isready >/dev/null && return 0
    command -v apt-get >/dev/null || die "no PostgreSQL server binaries and no apt-get"
    [ "$(id -u)" = 0 ] || die "no PostgreSQL server binaries; installing them needs root (apt-get)"
    echo "start-postgres: installing Debian's postgresql" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    # policy-rc.d keeps the package from starting Debian's own cluster on 5432.
    local policy=/usr/sbin/policy-rc.d created=""
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1
    fi
    apt-get install -y -qq --no-install-recommends postgresql postgresql-contrib >/dev/null \
        || { [ -n "$created" ] && rm -f "$policy"; die "apt-get install postgresql failed"; }
    [ -n "$created" ] && rm -f "$policy"
    [ -n "$(find_bin)" ] || die "postgresql installed but no initdb/pg_ctl found"
}

as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if answers; then
    echo "$DSN"
    exit 0
fi

install_postgresql
BIN="$(find_bin)"
if [ ! -s "$DATA/PG_VERSION" ]; then
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown postgres: "$DATA"
    chmod 700 "$DATA"
    as_owner "$BIN/initdb" -D "$DATA" -A trust -U postgres -E UTF8 --locale C.UTF-8 >/dev/null \
        || die "initdb -D $DATA failed"
    cat >>"$DATA/postgresql.conf" <<EOF
# jobpool CI: loopback only, room for the suite and the benchmarks; the rest stays default.
listen_addresses = '127.0.0.1'
unix_socket_directories = '$DATA'
max_connections = 400
EOF
fi
as_owner "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 -o "-p $PORT" start >/dev/null \
    || { tail -n 20 "$DATA/server.log" >&2; die "pg_ctl start failed (log above)"; }
answers || die "the server started but does not answer on 127.0.0.1:$PORT"
echo "$DSN"
