# shellcheck shell=bash
# Shared by hack/build-control-plane.sh, hack/build-tools.sh, hack/build-promtool.sh and
# hack/release.sh: builds pinned Go
# commands from the Go module proxy into a cache outside the work tree, keyed by version, so that
# later runs reuse them. Source it; it reads hack/versions.env and sets CACHE and BIN.
#
# Why generated wrapper modules: k8s.io/kubernetes and sigs.k8s.io/cluster-api are not meant to
# be required as modules, and `go install pkg@version` refuses modules whose go.mod has replace
# directives. Their go.mod files replace nested modules with local folders (./staging/src/k8s.io/x,
# ./api) that are not part of the module zip. A wrapper module requires the pinned release and
# replaces each such module with its tagged release, reading the list from the downloaded go.mod
# instead of hard-coding it.

# versions.env is also a Makefile include, so read only the single-word keys from it.
eval "$(grep -E '^[A-Z_]+_VERSION=[A-Za-z0-9.+-]+$' "$(dirname "${BASH_SOURCE[0]}")/versions.env")"
CACHE="${CK8S_CERTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ck8s-certs}"
BIN="$CACHE/bin"
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export GOTOOLCHAIN=local

log() { echo "[${LOG_PREFIX:-build}] $*" >&2; }

# quiet CMD...: runs CMD with its stderr (go's "downloading ..." lines) shown only if it fails.
quiet() {
  local err rc=0
  err="$(mktemp)"
  "$@" 2>"$err" || rc=$?
  ((rc == 0)) || cat "$err" >&2
  rm -f "$err"
  return "$rc"
}

# wrapper_module NAME MODULE VERSION NESTED_VERSION PACKAGE
# Creates (in the current folder) a module that requires MODULE@VERSION, replaces every module
# its go.mod maps to a local folder with the same module at NESTED_VERSION, and imports PACKAGE
# from a file that is never compiled (the tools.go pattern), so that `go mod tidy` keeps exactly
# PACKAGE's dependencies.
wrapper_module() {
  local name="$1" module="$2" version="$3" nested="$4" package="$5"
  cat > tools.go <<GO
//go:build tools

// Wrapper so that $name can be built from the Go module proxy.
package tools

import _ "$package"
GO
  cat > go.mod <<GOMOD
module ck8s-certs.local/$name

go 1.24

require $module $version
GOMOD
  local modfile
  modfile="$(quiet go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  [[ -f "$modfile" ]] || { log "could not download $module@$version"; return 1; }
  # `example.org/x => ./some/dir` becomes `example.org/x => example.org/x NESTED_VERSION`.
  local n=0 mod
  while read -r mod; do
    go mod edit -replace "$mod=$mod@$nested"
    n=$((n + 1))
  done < <(sed -n 's#^[[:space:]]*\(replace[[:space:]]\{1,\}\)\{0,1\}\([^[:space:]]*\) => \./.*#\2#p' "$modfile")
  log "$name: replaced $n local modules with $nested"
  quiet go mod tidy >/dev/null
}

# kube_ldflags: stamps the version as the Kubernetes release build does (hack/lib/version.sh),
# so that `/version` and `kubectl version --client` tell the truth.
kube_ldflags() {
  local minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  local pkg flags="-s"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  echo "$flags"
}

# build_kubernetes_cmd NAME: k8s.io/kubernetes/cmd/NAME at KUBE_VERSION, its 31 staging modules
# replaced by their tagged releases v0.X.Y of the same minor.
build_kubernetes_cmd() {
  local name="$1"
  local out="$BIN/$name-$KUBE_VERSION"
  [[ -x "$out" ]] && return 0
  local src="$CACHE/src/$name-$KUBE_VERSION"
  mkdir -p "$src" "$BIN"
  log "building $name $KUBE_VERSION (first time only)"
  (
    cd "$src" || exit 1
    rm -f main.go # the layout of older versions of this script
    wrapper_module "$name" k8s.io/kubernetes "$KUBE_VERSION" "v0.${KUBE_VERSION#v1.}" \
      "k8s.io/kubernetes/cmd/$name"
    go build -trimpath -ldflags="$(kube_ldflags)" -o "$out.tmp" "k8s.io/kubernetes/cmd/$name"
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
    cd "$src" || exit 1
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
    quiet go mod tidy >/dev/null
    go build -trimpath -ldflags=-s -o "$out.tmp" .
    mv "$out.tmp" "$out"
  )
}

# build_clusterctl: sigs.k8s.io/cluster-api/cmd/clusterctl at CLUSTERCTL_VERSION; its nested
# module sigs.k8s.io/cluster-api/api is tagged with the same version. The version is stamped as
# cluster-api's hack/scripts/release/version.sh does (`clusterctl version` tells the truth).
build_clusterctl() {
  local out="$BIN/clusterctl-$CLUSTERCTL_VERSION"
  [[ -x "$out" ]] && return 0
  local src="$CACHE/src/clusterctl-$CLUSTERCTL_VERSION"
  mkdir -p "$src" "$BIN"
  log "building clusterctl $CLUSTERCTL_VERSION (first time only)"
  (
    cd "$src" || exit 1
    wrapper_module clusterctl sigs.k8s.io/cluster-api "$CLUSTERCTL_VERSION" "$CLUSTERCTL_VERSION" \
      sigs.k8s.io/cluster-api/cmd/clusterctl
    local minor="${CLUSTERCTL_VERSION#v1.}"
    minor="${minor%%.*}"
    local pkg=sigs.k8s.io/cluster-api/version
    go build -trimpath \
      -ldflags="-s -w -X $pkg.gitVersion=$CLUSTERCTL_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
      -o "$out.tmp" sigs.k8s.io/cluster-api/cmd/clusterctl
    mv "$out.tmp" "$out"
  )
}



# build_promtool: github.com/prometheus/prometheus/cmd/promtool at PROMTOOL_VERSION. Prometheus
# v3 releases are published as module versions v0.3XX.Y (Prometheus 3.XX.Y); the version is
# stamped as Prometheus' own build does (promu), so that `promtool --version` tells the truth.
build_promtool() {
  local out="$BIN/promtool-$PROMTOOL_VERSION"
  [[ -x "$out" ]] && return 0
  local src="$CACHE/src/promtool-$PROMTOOL_VERSION"
  mkdir -p "$src" "$BIN"
  log "building promtool $PROMTOOL_VERSION (first time only)"
  (
    cd "$src" || exit 1
    wrapper_module promtool github.com/prometheus/prometheus "$PROMTOOL_VERSION" "$PROMTOOL_VERSION" \
      github.com/prometheus/prometheus/cmd/promtool
    local release="${PROMTOOL_VERSION#v0.}" # 316.0
    local major="${release:0:1}" minor="${release%%.*}" patch="${release#*.}"
    minor=$((10#${minor:1}))
    local pkg=github.com/prometheus/common/version
    # remove_all_sd leaves out Prometheus's service discovery plugins (the AWS, Azure, GCE,
    # Kubernetes … SDKs): checking and testing rules needs none of them, and they were most of
    # the build (148 s without them against more than 17 min with them, measured side by side
    # on a loaded 2-core machine).
    # Without optimizations and inlining (-N -l): promtool checks one rules file, and builds in
    # four fifths of the time (115 s against 142 s from an empty build cache, both beside a
    # compile of mine). The tools the e2e tests lean on (the control plane, the Cluster API
    # managers, whose pace a test depends on) stay optimized.
    go build -trimpath -tags remove_all_sd -gcflags="all=-N -l" \
      -ldflags="-s -w -X $pkg.Version=$major.$minor.$patch -X $pkg.Branch=HEAD -X $pkg.Revision=$PROMTOOL_VERSION" \
      -o "$out.tmp" github.com/prometheus/prometheus/cmd/promtool
    mv "$out.tmp" "$out"
  )
}

# build_capi_manager VERSION: the Cluster API core manager (Cluster, Machine, MachineSet,
# MachineDeployment controllers and CAPI's webhooks) of sigs.k8s.io/cluster-api VERSION, which
# the e2e suite can run beside the controller (test/e2e/src/capi_manager.rs). Its main package
# moved: v1.10.x has main.go at the module root, v1.14.x at core/main.go (and its go.mod
# replaces sigs.k8s.io/cluster-api/api with ./api, which wrapper_module points at the published
# api module of the same version). Stamped like clusterctl: the manager logs its version.
build_capi_manager() {
  local version="$1"
  local out="$BIN/capi-manager-$version"
  [[ -x "$out" ]] && return 0
  local src="$CACHE/src/capi-manager-$version"
  mkdir -p "$src" "$BIN"
  log "building the Cluster API core manager $version (first time only)"
  (
    cd "$src" || exit 1
    local dir package=sigs.k8s.io/cluster-api
    dir="$(quiet go mod download -json "sigs.k8s.io/cluster-api@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -f "$dir/core/main.go" ]] && package=sigs.k8s.io/cluster-api/core
    wrapper_module capi-manager sigs.k8s.io/cluster-api "$version" "$version" "$package"
    local minor="${version#v1.}"
    minor="${minor%%.*}"
    local pkg=sigs.k8s.io/cluster-api/version
    go build -trimpath \
      -ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" \
      -o "$out.tmp" "$package"
    mv "$out.tmp" "$out"
  )
}
