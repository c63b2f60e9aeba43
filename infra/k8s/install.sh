#!/usr/bin/env bash
# Build the real Kubernetes control plane the bridge's tests and `koordstream cluster up` run
# against, from the Go module proxy, into .cache/k8s/<version>/ (ignored, never committed):
#   bin/kube-apiserver  k8s.io/kubernetes (a scratch module that requires it and replaces each
#                       k8s.io/* staging module its go.mod lists at v0.0.0 with the matching
#                       v0.<minor>.<patch> release)
#   bin/etcd            go.etcd.io/etcd/server/v3 (its main package, from a scratch module)
#   bin/kwok            sigs.k8s.io/kwok/cmd/kwok (go install); its CRDs and stock Stage files
#                       come from the same module (infra/k8s/kwok-stages.sh, `make kwok-stages`)
# Idempotent: does nothing when the folder is complete (it holds .complete). Needs Go 1.26.
#   infra/k8s/install.sh                      # into <repo>/.cache/k8s/<version>
#   KOORDSTREAM_K8S_DIR=DIR infra/k8s/install.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
out="${KOORDSTREAM_K8S_DIR:-$root/.cache/k8s/$KUBERNETES_VERSION}"

if [[ -f "$out/.complete" ]]; then
    exit 0
fi
command -v go >/dev/null || { echo "install.sh: Go is needed to build the Kubernetes control plane" >&2; exit 1; }

mkdir -p "$out/bin" "$out/src"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
start=$(date +%s)

staging_minor="v0.${KUBERNETES_VERSION#*.}"  # 1.37.2 -> v0.37.2

if [[ ! -x "$out/bin/kube-apiserver" ]]; then
    src="$out/src/kube-apiserver"
    mkdir -p "$src"
    echo "install.sh: kube-apiserver v$KUBERNETES_VERSION (k8s.io/kubernetes, staging modules at $staging_minor)" >&2
    mod_file="$(cd "$src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$KUBERNETES_VERSION" \
        | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$mod_file" ]] || { echo "install.sh: no go.mod for k8s.io/kubernetes@v$KUBERNETES_VERSION" >&2; exit 1; }
    {
        echo "module koordstream.local/kube-apiserver"
        echo
        echo "go 1.26"
        echo
        echo "require k8s.io/kubernetes v$KUBERNETES_VERSION"
        echo
        # every k8s.io/* module that k8s.io/kubernetes requires at v0.0.0 is a staging module
        awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" { print $1 }' "$mod_file" | sort -u \
            | while read -r staged; do echo "replace $staged => $staged $staging_minor"; done
    } > "$src/go.mod"
    printf 'package main\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n\nfunc main() {}\n' > "$src/main.go"
    (cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w \
        -X k8s.io/component-base/version.gitVersion=v$KUBERNETES_VERSION \
        -X k8s.io/client-go/pkg/version.gitVersion=v$KUBERNETES_VERSION" \
        -o "$out/bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2)
fi

if [[ ! -x "$out/bin/etcd" ]]; then
    src="$out/src/etcd"
    mkdir -p "$src"
    echo "install.sh: etcd $ETCD_VERSION (go.etcd.io/etcd/server/v3)" >&2
    printf 'module koordstream.local/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$src/go.mod"
    printf 'package main\n\nimport _ "go.etcd.io/etcd/server/v3"\n\nfunc main() {}\n' > "$src/main.go"
    (cd "$src" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3 >&2)
fi

if [[ ! -x "$out/bin/kwok" ]]; then
    echo "install.sh: kwok $KWOK_VERSION (sigs.k8s.io/kwok/cmd/kwok)" >&2
    GOBIN="$out/bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
fi

echo "install.sh: built in $(( $(date +%s) - start )) s into $out" >&2
ls -l "$out/bin" >&2
touch "$out/.complete"
