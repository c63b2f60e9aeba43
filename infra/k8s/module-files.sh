#!/usr/bin/env bash
# Copy folders of a Go module, as the Go module proxy serves it, into a cache folder: a download
# (`go mod download`), nothing built. Used for files the tests and tools read from upstream
# projects rather than from copies in this repo (Kwok's stages and CRDs, Koordinator's CRDs).
#   infra/k8s/module-files.sh MODULE@VERSION OUT SRC:DEST [SRC:DEST ...]
# copies <module>/SRC to OUT/DEST for each pair. Idempotent: does nothing when OUT is complete
# (it holds .complete); OUT is built beside itself and moved in whole, so an interrupted run never
# leaves a folder that looks complete. Needs Go.
set -euo pipefail

module="$1"; out="$2"; shift 2
if [[ -f "$out/.complete" ]]; then
    exit 0
fi
name="$(basename "$0")"
command -v go >/dev/null || { echo "$name: Go is needed to fetch $module" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
scratch="$(mktemp -d "$(dirname "$out")/.fetch.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/module" "$scratch/out"
printf 'module koordstream.local/fetch\n\ngo 1.22\n' > "$scratch/module/go.mod"
echo "$name: fetching $module into $out" >&2
dir="$(cd "$scratch/module" && GOFLAGS=-mod=mod go mod download -json "$module" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
for pair in "$@"; do
    src="${pair%%:*}"; dest="${pair#*:}"
    [[ -d "$dir/$src" ]] || { echo "$name: no $src in $module ($dir)" >&2; exit 1; }
    mkdir -p "$(dirname "$scratch/out/$dest")"
    cp -R "$dir/$src" "$scratch/out/$dest"
done
chmod -R u+w "$scratch/out"  # the module cache is read-only
echo "$module" > "$scratch/out/MODULE"
touch "$scratch/out/.complete"
rm -rf "$out"
mv "$scratch/out" "$out"
