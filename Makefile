# ck8s-certs developer entry points. See README.md.
#
#   make run    the controller: against $KUBECONFIG's cluster if set, else against the embedded
#               test environment (built on first use)
#   make test   unit tests, then the e2e suite against the real environment, on every pinned
#               Cluster API release
#   make lint   rustfmt, clippy, gofmt, go vet

include hack/versions.env
export KUBE_VERSION ETCD_VERSION

SHELL := /bin/bash
CARGO ?= cargo
GO ?= go
export GOTOOLCHAIN := local
export GOFLAGS := -mod=mod
NODESIM := target/bin/nodesim

## CRD YAML generated from the api crate's types (a unit test fails when it is stale).
manifests:
	$(CARGO) run -q -p ck8s-certs-api --bin crdgen config/crd/bases

.PHONY: manifests all build control-plane nodesim env run unit e2e test lint fmt clean-env

all: build

build:
	$(CARGO) build --workspace

## Test environment binaries: kube-apiserver and etcd from pinned Go modules, cached by version
## under ~/.cache/ck8s-certs/bin (first build ~5 min on 2 cores), and the node simulator.
control-plane:
	hack/build-control-plane.sh >/dev/null

nodesim:
	@mkdir -p target/bin
	cd test/nodesim && $(GO) build -o ../../$(NODESIM) .

env: control-plane nodesim

run:
ifdef KUBECONFIG
	$(CARGO) run --bin ck8s-certs -- --kubeconfig "$(KUBECONFIG)"
else
	$(MAKE) env
	$(CARGO) build --bin ck8s-certs
	$(CARGO) build -p ck8s-certs-e2e --bin testenv
	target/debug/testenv --controller target/debug/ck8s-certs
endif

unit:
	$(CARGO) test --workspace --exclude ck8s-certs-e2e
	cd test/nodesim && $(GO) test ./...

## One environment per test binary; tests isolate by cluster and node. Run once per pinned
## Cluster API release (oldest and newest supported).
e2e: env
	$(CARGO) build --bin ck8s-certs
	@set -e; for v in $(CAPI_VERSIONS); do \
	  echo "== e2e against Cluster API $$v CRDs"; \
	  CK8S_E2E_CAPI_VERSION=$$v $(CARGO) test -p ck8s-certs-e2e --test '*' -- --nocapture; \
	done

test: unit e2e

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd test/nodesim && test -z "$$(gofmt -l .)" && $(GO) vet ./...

fmt:
	$(CARGO) fmt --all
	cd test/nodesim && gofmt -w .

## Environments of killed test runs remove themselves on the next start; this removes them now.
clean-env:
	rm -rf target/e2e-env
