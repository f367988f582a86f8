#!/usr/bin/env bash
# The control-plane test tier: build (or reuse) its binaries, then run tests/controlplane.
# The first build on a new machine is the slow part (docs/operator.md, "Control-plane tests"); later
# runs reuse the cache folder. Expects the venv active, and helm and kubectl from
# .ci/get-helm.sh on PATH or in its folder.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/controlplane/build.sh >/dev/null
# libfaketime for the clock-skew tests (Debian's faketime).
if [ ! -f /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null
fi
export JOBPOOL_CONTROLPLANE_REQUIRED=1
pytest tests/controlplane -m controlplane -p no:cacheprovider "$@"
