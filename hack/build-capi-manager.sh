#!/usr/bin/env bash
# Builds the Cluster API core manager of every pinned release (CAPI_VERSIONS in
# hack/versions.env) from the Go module proxy, into the cache of hack/lib.sh as
# capi-manager-<version>, for the e2e tests that run it beside the controller. First build
# ~3 min per release on 2 cores (~2.5 CPU-minutes each).
#
#   hack/build-capi-manager.sh              every pinned release that is missing
#   hack/build-capi-manager.sh v1.14.2      that release only
set -euo pipefail
LOG_PREFIX=build-capi-manager
# shellcheck source=hack/lib.sh
source "$(dirname "$0")/lib.sh"

# CAPI_VERSIONS holds several words, which lib.sh does not read from versions.env.
versions=("$@")
if ((${#versions[@]} == 0)); then
  read -r -a versions <<<"$(sed -n 's/^CAPI_VERSIONS=//p' "$(dirname "$0")/versions.env")"
fi
for version in "${versions[@]}"; do
  build_capi_manager "$version"
done
echo "$BIN"
