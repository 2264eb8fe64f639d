#!/usr/bin/env bash
# Builds the pinned promtool (PROMTOOL_VERSION) from the Go module proxy, into the same versioned
# cache as the control plane (see hack/lib.sh). It checks and unit-tests the alerting rules of
# config/monitoring (`make monitoring-test`). First build ~7 CPU-minutes (5-15 min on 2 shared
# cores), then cached by version.
#
#   hack/build-promtool.sh            build it if missing, print its path
set -euo pipefail
LOG_PREFIX=build-promtool
# shellcheck source=hack/lib.sh
source "$(dirname "$0")/lib.sh"

build_promtool
echo "$BIN/promtool-$PROMTOOL_VERSION"
