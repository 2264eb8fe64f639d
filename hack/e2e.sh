#!/usr/bin/env bash
# Runs the e2e test binaries E2E_JOBS at a time (default 4), and the tests of each binary
# E2E_TEST_THREADS at a time (default 2, fixed rather than cargo's one per core, so that the
# suite runs as measured on any machine). Each binary starts its own environment and spends most
# of its time waiting on it (nodes restarting, windows opening, controllers settling), so a
# 2-core machine runs several at once: two binaries at a time left 57 % of the 2 cores idle.
# Since each binary starts only the clusters it uses, three kept them 67 % busy (851 s for the
# 55 binaries) and four 88 % (784 s) (docs/performance.md, "What the test suite costs").
#
#   hack/e2e.sh "<Cluster API versions>" "<tests run against every version>"
#
# The whole suite runs against the last version; the others run only the tests named. Each
# binary's output goes to target/e2e-logs/<version>-<test>.log; a failed one's is printed. The
# environment comes from the Makefile (CK8S_E2E_KUBECTL, CK8S_E2E_CLUSTERCTL, CK8S_E2E_PROMTOOL).
set -euo pipefail
cd "$(dirname "$0")/.."

versions=($1)
versioned=" $2 "
jobs=${E2E_JOBS:-4}
threads=${E2E_TEST_THREADS:-2}
cargo=${CARGO:-cargo}
logs=target/e2e-logs
rm -rf "$logs"
mkdir -p "$logs"

# The test binaries, by name (`fleet`, …), from cargo's own account of what it built.
declare -A binary
while IFS=$'\t' read -r name path; do
  binary[$name]=$path
done < <("$cargo" test -p ck8s-certs-e2e --tests --no-run --message-format=json |
  sed -n 's/.*"target":{"kind":\["test"\],"crate_types":\["bin"\],"name":"\([a-z_0-9]*\)".*"executable":"\([^"]*\)".*/\1\t\2/p')
if ((${#binary[@]} == 0)); then
  echo "hack/e2e.sh: cargo built no e2e test binary" >&2
  exit 1
fi

# Longest first (measured, docs/performance.md), so that the last ones to start are short.
slow=(stagger hostile_workload expired_fleet capi_manager fleet waiting gates expired steady_state
  refresh_crash failover canary plugin webhook_rotation refresh_scope cluster_move renewal
  refresh_failures)
order=("${slow[@]}")
for name in $(printf '%s\n' "${!binary[@]}" | sort); do
  [[ " ${slow[*]} " == *" $name "* ]] || order+=("$name")
done

queue=()
last=${versions[${#versions[@]}-1]}
for name in "${order[@]}"; do
  for v in "${versions[@]}"; do
    [[ -n "${binary[$name]:-}" ]] || continue
    if [[ "$v" == "$last" || "$versioned" == *" $name "* ]]; then queue+=("$v $name"); fi
  done
done

run() {
  local v=$1 name=$2 started=$SECONDS status=0
  (cd test/e2e && CK8S_E2E_CAPI_VERSION=$v "${binary[$name]}" --nocapture --test-threads="$threads") \
    >"$logs/$v-$name.log" 2>&1 || status=$?
  local summary
  summary=$(grep -h '^test result:' "$logs/$v-$name.log" | tail -1)
  if ((status == 0)); then
    echo "ok     $v $name ($((SECONDS - started)) s) ${summary#test result: ok. }"
  else
    echo "FAILED $v $name ($((SECONDS - started)) s) exit $status"
    touch "$logs/$v-$name.failed"
  fi
}

echo "== e2e: ${#queue[@]} test binaries, $jobs at a time (their tests $threads at a time); the whole suite against $last"
started=$SECONDS
for job in "${queue[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run $job &
done
wait

failed=("$logs"/*.failed)
if [[ -e "${failed[0]}" ]]; then
  for marker in "${failed[@]}"; do
    echo
    echo "== ${marker%.failed}.log"
    cat "${marker%.failed}.log"
  done
  echo "e2e: $(ls "$logs"/*.failed | wc -l) of ${#queue[@]} test binaries failed ($((SECONDS - started)) s)"
  exit 1
fi
echo "e2e: all ${#queue[@]} test binaries passed ($((SECONDS - started)) s)"
