#!/usr/bin/env bash
# Fetch Koordinator's own CRD manifests (Reservation, PodGroup, ElasticQuota, ...) from the Go
# module proxy (the module github.com/koordinator-sh/koordinator carries config/crd/bases) into
# .cache/koordinator/<version>/crd, for the bridge's tests and `koordstream cluster up`: the
# CRDs users install with Koordinator, never copied into this repo. A download, no build.
# Idempotent: does nothing when the folder is complete (it holds .complete).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
out="$root/.cache/koordinator/$KOORDINATOR_VERSION"

if [[ -f "$out/.complete" ]]; then
    exit 0
fi
command -v go >/dev/null || { echo "koordinator-crds.sh: Go is needed to fetch Koordinator's CRDs" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
scratch="$(mktemp -d "$(dirname "$out")/.crd.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && printf 'module koordstream.local/crds\n\ngo 1.26\n' > go.mod)
dir="$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "github.com/koordinator-sh/koordinator@$KOORDINATOR_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -d "$dir/config/crd/bases" ]] || { echo "koordinator-crds.sh: no config/crd/bases in $dir" >&2; exit 1; }
rm -f "$scratch/go.mod"
cp -r "$dir/config/crd/bases" "$scratch/crd"
chmod -R u+w "$scratch"
touch "$scratch/.complete"
rm -rf "$out"
mv "$scratch" "$out"
trap - EXIT
echo "koordinator-crds.sh: Koordinator $KOORDINATOR_VERSION CRDs in $out/crd" >&2
