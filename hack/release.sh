#!/usr/bin/env bash
# Renders the clusterctl release artifacts of ck8s-certs, an AddonProvider (`make release`; the
# e2e suite calls it too and installs the result with clusterctl):
#
#   $RELEASE_DIR/addon-components.yaml  config/default rendered with the pinned kubectl's
#                                       kustomize, with image $IMG
#   $RELEASE_DIR/metadata.yaml          release series -> Cluster API contract (./metadata.yaml)
#
# A release publishes both files as assets of the GitHub release tagged $RELEASE_VERSION, where
# clusterctl looks for them. Environment (all optional):
#   RELEASE_VERSION  vX.Y.Z; default v<workspace version in Cargo.toml>
#   RELEASE_DIR      default _out/release
#   IMG              default ghcr.io/ck8s-certs/ck8s-certs:$RELEASE_VERSION
#   KUBECTL          default the pinned kubectl of hack/build-tools.sh (built if missing)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
LOG_PREFIX=release
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

die() { log "$*"; exit 1; }

workspace_version="$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml")"
RELEASE_VERSION="${RELEASE_VERSION:-v$workspace_version}"
RELEASE_DIR="${RELEASE_DIR:-$root/_out/release}"
IMG="${IMG:-ghcr.io/ck8s-certs/ck8s-certs:$RELEASE_VERSION}"
if [[ -z "${KUBECTL:-}" ]]; then
  build_kubernetes_cmd kubectl
  KUBECTL="$BIN/kubectl-$KUBE_VERSION"
fi

[[ "$RELEASE_VERSION" =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  die "RELEASE_VERSION=$RELEASE_VERSION is not a semantic version vX.Y.Z"
major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"
# clusterctl refuses a version whose major.minor has no release series in metadata.yaml; say so
# now rather than at install time. (Each series lists major before minor.)
awk -v major="$major" -v minor="$minor" '
  /^[[:space:]]*-?[[:space:]]*major:/ { m = $NF }
  /^[[:space:]]*-?[[:space:]]*minor:/ { if (m == major && $NF == minor) found = 1 }
  END { exit !found }' "$root/metadata.yaml" ||
  die "metadata.yaml has no release series $major.$minor for $RELEASE_VERSION: add one"

mkdir -p "$RELEASE_DIR"
components="$RELEASE_DIR/addon-components.yaml"
"$KUBECTL" kustomize "$root/config/default" > "$components.tmp"
# The controller's image. clusterctl's `images:` setting can still override it at install time.
image_line='^( +image: )ghcr\.io/ck8s-certs/ck8s-certs:[^[:space:]]+$'
[[ "$(grep -cE "$image_line" "$components.tmp" || true)" == 1 ]] ||
  die "expected exactly one ghcr.io/ck8s-certs/ck8s-certs image in config/default"
sed -E -i "s#$image_line#\\1$IMG#" "$components.tmp"
# Quote every value that is a whole clusterctl variable: kustomize dropped the quotes, and
# clusterctl substitutes text before parsing, so `value: ${X:=10}` would become the number 10 (or
# a boolean), which the API server refuses for an env value.
sed -E -i 's#^( +(- )?[A-Za-z]+: )(\$\{[A-Za-z0-9_]+(:=[^}"]*)?\})$#\1"\3"#' "$components.tmp"
mv "$components.tmp" "$components"
cp "$root/metadata.yaml" "$RELEASE_DIR/metadata.yaml"
log "$RELEASE_VERSION ($IMG): $RELEASE_DIR/{addon-components.yaml,metadata.yaml}"
