#!/usr/bin/env bash
# Koordinator's own CRD manifests (Reservation, PodGroup, ElasticQuota, ...: config/crd/bases of
# the Go module github.com/koordinator-sh/koordinator at KOORDINATOR_VERSION) into
# .cache/koordinator/<version>/crd, for the bridge's tests and `koordstream cluster up`: the CRDs
# users install with Koordinator, never copied into this repo. A download only (module-files.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
exec bash "$here/module-files.sh" "github.com/koordinator-sh/koordinator@$KOORDINATOR_VERSION" \
    "$here/../../.cache/koordinator/$KOORDINATOR_VERSION" config/crd/bases:crd
