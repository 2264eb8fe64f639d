#!/usr/bin/env bash
# Builds the pinned kube-apiserver and etcd used by the test environment from the Go module
# proxy, into a cache outside the work tree keyed by version (see hack/lib.sh), so that later runs
# reuse them. First build ~5 min on 2 cores.
#
#   hack/build-control-plane.sh            build whatever is missing, print the bin dir
set -euo pipefail
LOG_PREFIX=build-control-plane
# shellcheck source=hack/lib.sh
source "$(dirname "$0")/lib.sh"

build_etcd
build_kubernetes_cmd kube-apiserver
echo "$BIN"
