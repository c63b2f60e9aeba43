#!/usr/bin/env bash
# Fetch Kwok's stock Stage files and CRDs (the kustomize/stage and kustomize/crd trees of the Go
# module sigs.k8s.io/kwok at KWOK_VERSION, infra/k8s/versions.env, testdata included) into
# .cache/kwok/<version>/{stage,crd}, for the Kwok-compatible lifecycle (perf/kwok.py) and its
# tests. Only downloads the module (`go mod download`, from the Go module proxy); nothing is built.
# Idempotent: does nothing when that folder is complete (it holds .complete). Needs Go.
#   infra/k8s/kwok-stages.sh                       # into <repo>/.cache/kwok/<version>
#   KOORDSTREAM_KWOK_DIR=DIR infra/k8s/kwok-stages.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
out="${KOORDSTREAM_KWOK_DIR:-$root/.cache/kwok/$KWOK_VERSION}"

if [[ -f "$out/.complete" ]]; then
    exit 0
fi
command -v go >/dev/null || { echo "kwok-stages.sh: Go is needed to fetch sigs.k8s.io/kwok@$KWOK_VERSION" >&2; exit 1; }

# Work in a scratch folder beside the target and move it in whole, so an interrupted run never
# leaves a folder that looks complete.
mkdir -p "$(dirname "$out")"
scratch="$(mktemp -d "$(dirname "$out")/.kwok.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/module" "$scratch/out"
printf 'module koordstream.local/kwok-stages\n\ngo 1.22\n' > "$scratch/module/go.mod"
echo "kwok-stages.sh: fetching sigs.k8s.io/kwok@$KWOK_VERSION (stages and CRDs) into $out" >&2
dir="$(cd "$scratch/module" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -d "$dir/kustomize/stage" && -d "$dir/kustomize/crd" ]] \
    || { echo "kwok-stages.sh: no kustomize/stage or kustomize/crd in sigs.k8s.io/kwok@$KWOK_VERSION ($dir)" >&2; exit 1; }
cp -R "$dir/kustomize/stage" "$dir/kustomize/crd" "$scratch/out/"
chmod -R u+w "$scratch/out"  # the module cache is read-only
echo "sigs.k8s.io/kwok@$KWOK_VERSION" > "$scratch/out/MODULE"
touch "$scratch/out/.complete"
rm -rf "$out"
mv "$scratch/out" "$out"
