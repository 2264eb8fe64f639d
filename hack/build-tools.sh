#!/usr/bin/env bash
# Builds the pinned packaging tools from the Go module proxy, into the same versioned cache as
# the control plane (see hack/lib.sh):
#   kubectl     KUBE_VERSION         renders config/ (`kubectl kustomize`)
#   clusterctl  CLUSTERCTL_VERSION   checks the release artifacts (`clusterctl generate provider`)
#
#   hack/build-tools.sh            build whatever is missing, print the bin dir
set -euo pipefail
LOG_PREFIX=build-tools
# shellcheck source=hack/lib.sh
source "$(dirname "$0")/lib.sh"

build_kubernetes_cmd kubectl
build_clusterctl
echo "$BIN"
