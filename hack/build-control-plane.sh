#!/usr/bin/env bash
# Builds the pinned kube-apiserver and etcd used by the test environment from the Go module
# proxy, into a cache outside the work tree keyed by version, so that later runs reuse them.
#
#   hack/build-control-plane.sh            build whatever is missing, print the bin dir
#
# Why a generated wrapper module: k8s.io/kubernetes is not meant to be required as a module; its
# go.mod replaces 31 staging modules with ./staging/src/... paths that only exist in its own
# repository. We replace each with the tagged release of the same minor (v0.X.Y), reading the
# list from the downloaded go.mod instead of hard-coding it.
set -euo pipefail

# versions.env is also a Makefile include, so read only the single-word keys from it.
eval "$(grep -E '^(KUBE|ETCD)_VERSION=[A-Za-z0-9.+-]+$' "$(dirname "$0")/versions.env")"
CACHE="${CK8S_CERTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ck8s-certs}"
BIN="$CACHE/bin"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local

log() { echo "[build-control-plane] $*" >&2; }

build_apiserver() {
  local out="$BIN/kube-apiserver-$KUBE_VERSION"
  [[ -x "$out" ]] && return 0
  local staging="v0.${KUBE_VERSION#v1.}"
  local src="$CACHE/src/kube-apiserver-$KUBE_VERSION"
  mkdir -p "$src" "$BIN"
  log "building kube-apiserver $KUBE_VERSION (first time only, ~4-6 min on 2 cores)"
  (
    cd "$src"
    cat > main.go <<'GO'
// Wrapper so that kube-apiserver can be built from the Go module proxy.
package main

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
GO
    cat > go.mod <<GOMOD
module ck8s-certs.local/kube-apiserver

go 1.24

require k8s.io/kubernetes $KUBE_VERSION
GOMOD
    local modfile
    modfile="$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    [[ -f "$modfile" ]] || { log "could not download k8s.io/kubernetes@$KUBE_VERSION"; exit 1; }
    # `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.Y.Z`.
    local n=0
    while read -r mod; do
      go mod edit -replace "$mod=$mod@$staging"
      n=$((n + 1))
    done < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$modfile")
    log "replaced $n staging modules with $staging"
    [[ $n -gt 0 ]] || { log "no staging replaces found in $modfile"; exit 1; }
    go mod tidy >/dev/null
    # Stamp the version as the Kubernetes release build does, so /version tells the truth.
    local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local pkg=k8s.io/component-base/version
    go build -trimpath -ldflags="-s -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
      -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver
    mv "$out.tmp" "$out"
  )
}

build_etcd() {
  local out="$BIN/etcd-$ETCD_VERSION"
  [[ -x "$out" ]] && return 0
  local src="$CACHE/src/etcd-$ETCD_VERSION"
  mkdir -p "$src" "$BIN"
  log "building etcd $ETCD_VERSION"
  (
    cd "$src"
    cat > main.go <<'GO'
// Wrapper so that etcd can be built from the Go module proxy.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    cat > go.mod <<GOMOD
module ck8s-certs.local/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
    go mod tidy >/dev/null
    go build -trimpath -ldflags=-s -o "$out.tmp" .
    mv "$out.tmp" "$out"
  )
}

build_etcd
build_apiserver
echo "$BIN"
