#!/usr/bin/env bash
# agent-sandbox's own CRD manifests (SandboxTemplate, SandboxWarmPool, SandboxClaim of
# extensions.agents.x-k8s.io, served as v1beta1, and Sandbox of agents.x-k8s.io: k8s/crds of the Go
# module sigs.k8s.io/agent-sandbox at AGENT_SANDBOX_VERSION) into .cache/agent-sandbox/<version>/crd,
# for the bridge's tests and `koordstream cluster up`: the CRDs users install with agent-sandbox,
# never copied into this repo. A download only (module-files.sh).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
exec bash "$here/module-files.sh" "sigs.k8s.io/agent-sandbox@$AGENT_SANDBOX_VERSION" \
    "$here/../../.cache/agent-sandbox/$AGENT_SANDBOX_VERSION" k8s/crds:crd
