#!/usr/bin/env bash
# Kwok's stock Stage files and CRDs (the kustomize/stage and kustomize/crd trees of the Go module
# sigs.k8s.io/kwok at KWOK_VERSION, infra/k8s/versions.env, testdata included) into
# .cache/kwok/<version>/{stage,crd}, for the Kwok-compatible lifecycle (perf/kwok.py), its tests
# and the local control plane (streams/kube_cluster.py). A download only (module-files.sh).
#   infra/k8s/kwok-stages.sh                       # into <repo>/.cache/kwok/<version>
#   KOORDSTREAM_KWOK_DIR=DIR infra/k8s/kwok-stages.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
exec bash "$here/module-files.sh" "sigs.k8s.io/kwok@$KWOK_VERSION" \
    "${KOORDSTREAM_KWOK_DIR:-$here/../../.cache/kwok/$KWOK_VERSION}" kustomize/stage:stage kustomize/crd:crd
