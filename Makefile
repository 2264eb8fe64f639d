# ck8s-certs developer entry points. See README.md.
#
#   make run    the controller against the embedded test environment (built on first use);
#               make run CLUSTER=1: against $KUBECONFIG's cluster instead (it says which first)
#   make test   unit tests, the alerting rules' promtool tests, then the e2e suite against the
#               real environment, on every pinned Cluster API release
#   make lint   rustfmt, clippy, gofmt, go vet
#   make docs   the generated tables of docs/ (flags, metrics, reasons, clusterctl variables)
#   make fuzz   every parser of user or node input, 1,000,000 inputs each (docs/security.md)
#   make release   clusterctl artifacts (addon-components.yaml, metadata.yaml) into _out/release
#   make docker-build IMG=...   the controller image

include hack/versions.env
export KUBE_VERSION ETCD_VERSION

# Where hack/lib.sh caches the binaries it builds; the e2e harness computes the same default.
CK8S_CERTS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ck8s-certs
export CK8S_CERTS_CACHE
KUBECTL := $(CK8S_CERTS_CACHE)/bin/kubectl-$(KUBE_VERSION)
CLUSTERCTL := $(CK8S_CERTS_CACHE)/bin/clusterctl-$(CLUSTERCTL_VERSION)
PROMTOOL := $(CK8S_CERTS_CACHE)/bin/promtool-$(PROMTOOL_VERSION)

RELEASE_VERSION ?= v$(shell sed -n '/^\[workspace\.package\]/,/^\[/s/^version = "\(.*\)"$$/\1/p' Cargo.toml)
RELEASE_DIR ?= _out/release
IMG ?= ghcr.io/ck8s-certs/ck8s-certs:$(RELEASE_VERSION)

SHELL := /bin/bash
CARGO ?= cargo
GO ?= go
export GOTOOLCHAIN := local
# -trimpath as hack/lib.sh builds the tools: the test programs' Kubernetes packages (nodesim and
# the bootstrap double at kube-apiserver's versions, refmanager at the newest Cluster API
# manager's) are then the same build actions, compiled once into the Go build cache.
export GOFLAGS := -mod=mod -trimpath
NODESIM := target/bin/nodesim
BOOTSTRAPDOUBLE := target/bin/bootstrapdouble
REFMANAGER := target/bin/refmanager

## CRD YAML generated from the api crate's types (a unit test fails when it is stale).
manifests:
	$(CARGO) run -q -p ck8s-certs-api --bin crdgen config/crd/bases

## The generated regions of the docs (flag, metric, reason and clusterctl variable tables, from
## the code: test/e2e/src/docsgen.rs); `make unit` fails when a committed doc differs.
docs:
	$(CARGO) run -q -p ck8s-certs-e2e --bin docsgen

.PHONY: manifests docs all build control-plane capi-manager nodesim bootstrapdouble refmanager env tools promtool monitoring-manifests monitoring-test release docker-build run unit e2e test bench fuzz lint fmt clean-env

all: build

build:
	$(CARGO) build --workspace

## Test environment binaries: kube-apiserver and etcd from pinned Go modules, cached by version
## under ~/.cache/ck8s-certs/bin (first build ~5 min on 2 cores), the node simulator, and the
## test double of the CK8s bootstrap provider's certificates controller (design.md section 8).
control-plane:
	hack/build-control-plane.sh >/dev/null

## The Cluster API core manager of each release in CAPI_VERSIONS, built and cached like the
## control plane (~3 min per release on 2 cores), for the e2e tests that run it beside the
## controller (test/e2e/src/capi_manager.rs).
capi-manager:
	hack/build-capi-manager.sh >/dev/null

nodesim:
	@mkdir -p target/bin
	cd test/nodesim && $(GO) build -o ../../$(NODESIM) .

bootstrapdouble:
	@mkdir -p target/bin
	cd test/bootstrapdouble && $(GO) build -o ../../$(BOOTSTRAPDOUBLE) .

env: control-plane nodesim bootstrapdouble

## The reference manager of `make bench`: a controller-runtime manager built the way the CK8s
## bootstrap provider's is (its caches, watches and reads), to measure ours against.
refmanager:
	@mkdir -p target/bin
	cd test/refmanager && $(GO) build -o ../../$(REFMANAGER) .

## Packaging tools, built and cached like the control plane (first build ~2-3 min each):
## kubectl (KUBE_VERSION; `kubectl kustomize`) and clusterctl (CLUSTERCTL_VERSION).
tools:
	@hack/build-tools.sh >/dev/null

## promtool (PROMTOOL_VERSION, Prometheus 3), built and cached like the tools, without Prometheus's
## service discovery plugins (first build ~2.5 min on 2 cores): checks and unit-tests the alerting
## rules of config/monitoring.
promtool:
	@hack/build-promtool.sh >/dev/null

## config/monitoring/prometheusrule.yaml from the rules file promtool tests (see hack/monitoring.sh).
monitoring-manifests:
	hack/monitoring.sh generate

## `promtool check rules` and `promtool test rules` on config/monitoring (every alert fires from
## sample series and stays silent on healthy ones); fails when prometheusrule.yaml is stale.
monitoring-test: promtool
	@PROMTOOL=$(PROMTOOL) hack/monitoring.sh test

## The clusterctl release artifacts of RELEASE_VERSION, with image IMG (see docs/install.md).
release: tools
	@RELEASE_VERSION=$(RELEASE_VERSION) RELEASE_DIR=$(RELEASE_DIR) IMG=$(IMG) KUBECTL=$(KUBECTL) \
	  hack/release.sh

## Needs a Docker engine (not available on every development machine).
docker-build:
	docker build -t $(IMG) .

## A KUBECONFIG exported in the shell may point at a production cluster: it is used only when
## asked for with CLUSTER=1, and the context and server it names are printed first.
run:
ifdef CLUSTER
	@test -n "$(KUBECONFIG)" || { echo "make run CLUSTER=1 needs KUBECONFIG set" >&2; exit 1; }
	@k=$$(command -v kubectl || echo $(KUBECTL)); \
	  echo "make run: the controller acts on KUBECONFIG=$(KUBECONFIG): context $$($$k config current-context 2>/dev/null || echo '?'), server $$($$k config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null || echo '?')"
	$(CARGO) run --bin ck8s-certs -- --kubeconfig "$(KUBECONFIG)"
else
	@if [ -n "$(KUBECONFIG)" ]; then echo "make run: KUBECONFIG is ignored; the embedded environment is used (make run CLUSTER=1 for the cluster it names)"; fi
	$(MAKE) env
	$(CARGO) build --bin ck8s-certs
	$(CARGO) build -p ck8s-certs-e2e --bin testenv
	env -u KUBECONFIG target/debug/testenv --controller target/debug/ck8s-certs
endif

## The docs checks (test/e2e/tests/docs.rs: they read the bench's flags too, so they live in the
## e2e crate) need no environment: they run here, early, and again with the e2e suite. Their
## overlay check needs the pinned kubectl: without it (no `make tools` yet) it says it did not
## run here; `make e2e` always runs it.
unit:
	$(CARGO) test --workspace --exclude ck8s-certs-e2e
	$(if $(wildcard $(KUBECTL)),CK8S_E2E_KUBECTL=$(KUBECTL),CK8S_DOCS_WITHOUT_KUBECTL=1) \
	  $(CARGO) test -p ck8s-certs-e2e --test docs
	cd test/nodesim && $(GO) test ./...
	cd test/bootstrapdouble && $(GO) test ./...
	cd test/refmanager && $(GO) test ./...

## One environment per test binary; tests isolate by cluster and node. The whole suite runs
## against the newest pinned Cluster API release; against the older ones, only the tests whose
## behaviour depends on the API version (E2E_VERSIONED: Machine and Cluster fields, the v1beta1
## bootstrap provider double, the CAPI manager, clusterctl move and release). The release test
## renders the artifacts with hack/release.sh and installs them with the pinned clusterctl.
E2E_VERSIONED := admission capi_manager cluster_move coexistence coexistence_fleet \
  control_plane_late environment fleet refresh refresh_scope release sharding steady_state
## Test binaries run E2E_JOBS at a time (default 4, hack/e2e.sh), the tests of each E2E_TEST_THREADS
## at a time (default 2); their logs are in target/e2e-logs.
e2e: env capi-manager tools promtool
	$(CARGO) build --bin ck8s-certs
	CK8S_E2E_KUBECTL=$(KUBECTL) CK8S_E2E_CLUSTERCTL=$(CLUSTERCTL) CK8S_E2E_PROMTOOL=$(PROMTOOL) \
	  CARGO=$(CARGO) hack/e2e.sh "$(CAPI_VERSIONS)" "$(E2E_VERSIONED)"

test: unit monitoring-test e2e

## Fleet-scale benchmark, not part of `make test` (~15 min at the defaults on 2 cores): a fleet
## of 50 clusters x 100 Machines, ck8s-certs (release build) and the reference manager each
## alone against it, then 1,000 refreshes; prints one table (see docs/performance.md).
## Flags: make bench BENCH_FLAGS="--clusters 10 --machines 100 --refreshes 200"
bench: env refmanager
	$(CARGO) build --release -p ck8s-certs --bin ck8s-certs -p ck8s-certs-e2e --bin bench
	target/release/bench $(BENCH_FLAGS)

## Fuzzes every parser of user or node input (docs/security.md), not part of `make test` (~15 min
## on 2 cores): FUZZ_CASES inputs each (seed corpus in fuzz/corpus, then generated and mutated
## ones), release build, one parser after the other; prints inputs, panics and time per parser.
FUZZ_CASES ?= 1000000
FUZZ_REPORT := $(CURDIR)/target/fuzz/report.txt
fuzz:
	@mkdir -p $(dir $(FUZZ_REPORT)) && rm -f $(FUZZ_REPORT)
	@echo "FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --release -p ck8s-certs --test fuzz -- --test-threads=1"
	@FUZZ_CASES=$(FUZZ_CASES) FUZZ_REPORT=$(FUZZ_REPORT) \
	  $(CARGO) test --release -p ck8s-certs --test fuzz -- --test-threads=1; status=$$?; \
	  printf '%-12s %10s %6s %9s %9s %11s %8s\n' parser inputs panics 'time(s)' 'inputs/s' 'slowest(ms)' 'avg(B)'; \
	  cat $(FUZZ_REPORT) 2>/dev/null; exit $$status

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd test/nodesim && test -z "$$(gofmt -l .)" && $(GO) vet ./...
	cd test/bootstrapdouble && test -z "$$(gofmt -l .)" && $(GO) vet ./...
	cd test/refmanager && test -z "$$(gofmt -l .)" && $(GO) vet ./...

fmt:
	$(CARGO) fmt --all
	cd test/nodesim && gofmt -w .
	cd test/bootstrapdouble && gofmt -w .
	cd test/refmanager && gofmt -w .

## Environments of killed test runs remove themselves on the next start; this removes them now.
clean-env:
	rm -rf target/e2e-env
