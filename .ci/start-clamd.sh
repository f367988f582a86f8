#!/usr/bin/env bash
# A throw-away clamd for tests: no freshclam, no network, one custom EICAR signature.
#
#   .ci/start-clamd.sh start DIR [PORT]   install clamav-daemon if missing (apt-get), write
#                                         DIR/clamd.conf and DIR/db/jobpool-test.ndb, start
#                                         clamd on 127.0.0.1:PORT (default: a free port) and
#                                         on the Unix socket DIR/clamd.sock, wait until it
#                                         answers PING. Writes DIR/clamd.pid and DIR/clamd.env
#                                         (JOBPOOL_TEST_CLAMD_URL=tcp://...,
#                                         JOBPOOL_TEST_CLAMD_SOCKET=unix://...,
#                                         JOBPOOL_TEST_CLAMD_PID=...,
#                                         JOBPOOL_TEST_CLAMD_STREAM_MAX_LENGTH=...), and prints
#                                         the same lines (`set -a; . DIR/clamd.env` exports them
#                                         for tests/integration/test_virus_scan.py).
#   .ci/start-clamd.sh stop DIR           stop the clamd whose PID is in DIR/clamd.pid.
#
# CLAMD_STREAM_MAX_LENGTH (bytes, default 1048576) sets clamd's StreamMaxLength, so that tests
# can cross it with a small object. Debian's clamd starts in about 0.1 s with this database.
set -euo pipefail

EICAR='X5O!P%@AP[4\PZX54(P^)7CC)7}$EICAR-STANDARD-ANTIVIRUS-TEST-FILE!$H+H*'

die() { echo "start-clamd: $*" >&2; exit 1; }

find_clamd() {
    command -v clamd 2>/dev/null || { [ -x /usr/sbin/clamd ] && echo /usr/sbin/clamd; } || true
}

install_clamd() {
    [ -n "$(find_clamd)" ] && return 0
    command -v apt-get >/dev/null || die "clamd is not installed and there is no apt-get"
    [ "$(id -u)" = 0 ] || die "clamd is not installed; installing it needs root (apt-get)"
    echo "start-clamd: installing clamav-daemon" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends clamav-daemon >/dev/null \
        || die "apt-get install clamav-daemon failed"
    # The package may start its own daemon with the (absent) official databases: not ours.
    [ -n "$(find_clamd)" ] || die "clamav-daemon installed but no clamd binary found"
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ping_clamd() {  # ping_clamd SOCKET -> 0 when clamd answers PONG
    python3 - "$1" <<'EOF'
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    s.connect(sys.argv[1])
    s.sendall(b"zPING\0")
    sys.exit(0 if s.recv(16).startswith(b"PONG") else 1)
except OSError:
    sys.exit(1)
EOF
}

start() {
    local dir="$1" port="${2:-}" clamd limit pid
    install_clamd
    clamd="$(find_clamd)"
    mkdir -p "$dir/db" "$dir/tmp"
    dir="$(cd "$dir" && pwd)"
    if [ -f "$dir/clamd.pid" ] && kill -0 "$(cat "$dir/clamd.pid")" 2>/dev/null; then
        die "a clamd from $dir is already running (PID $(cat "$dir/clamd.pid"))"
    fi
    [ -n "$port" ] || port="$(free_port)"
    limit="${CLAMD_STREAM_MAX_LENGTH:-1048576}"
    # .ndb body signature: Name:TargetType(0 = any):Offset(* = anywhere):HexBody
    printf 'Jobpool-Test-EICAR:0:*:%s\n' "$(printf '%s' "$EICAR" | od -An -v -tx1 | tr -d ' \n')" \
        > "$dir/db/jobpool-test.ndb"
    rm -f "$dir/clamd.sock"
    cat > "$dir/clamd.conf" <<EOF
Foreground yes
DatabaseDirectory $dir/db
TemporaryDirectory $dir/tmp
LocalSocket $dir/clamd.sock
FixStaleSocket yes
TCPSocket $port
TCPAddr 127.0.0.1
StreamMaxLength $limit
MaxThreads 4
ReadTimeout 30
CommandReadTimeout 10
LogFile $dir/clamd.log
LogTime yes
SelfCheck 0
EOF
    if [ "$(id -u)" = 0 ]; then
        echo "User root" >> "$dir/clamd.conf"
    fi
    "$clamd" -c "$dir/clamd.conf" >>"$dir/clamd.out" 2>&1 &
    pid=$!
    echo "$pid" > "$dir/clamd.pid"
    for _ in $(seq 1 200); do
        if ping_clamd "$dir/clamd.sock"; then
            {
                echo "JOBPOOL_TEST_CLAMD_URL=tcp://127.0.0.1:$port"
                echo "JOBPOOL_TEST_CLAMD_SOCKET=unix://$dir/clamd.sock"
                echo "JOBPOOL_TEST_CLAMD_PID=$pid"
                echo "JOBPOOL_TEST_CLAMD_STREAM_MAX_LENGTH=$limit"
            } > "$dir/clamd.env"
            cat "$dir/clamd.env"
            return 0
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill "$pid" 2>/dev/null || true
    tail -n 20 "$dir/clamd.out" "$dir/clamd.log" >&2 2>/dev/null || true
    die "clamd did not answer PING on $dir/clamd.sock"
}

stop() {
    local dir="$1" pid
    [ -f "$dir/clamd.pid" ] || die "no $dir/clamd.pid: nothing to stop"
    pid="$(cat "$dir/clamd.pid")"
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/clamd.pid" "$dir/clamd.sock"
    echo "stopped clamd $pid"
}

case "${1:-}" in
    start) [ $# -ge 2 ] || die "usage: $0 start DIR [PORT]"; start "$2" "${3:-}" ;;
    stop)  [ $# -ge 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
    *) die "usage: $0 start DIR [PORT] | $0 stop DIR" ;;
esac
