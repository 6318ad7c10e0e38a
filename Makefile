# Relaymesh. The two commands for a fresh machine are `make demo` and
# `make test`; both install the Debian packages they need when missing
# (hack/deps.sh) and build the pinned third-party binaries they run first
# (hack/tools.sh, cached per pin under ~/.cache/relaymesh/bin): `make demo`
# only kube-apiserver, etcd and kubectl, `make test` all of them (`make tools`).
# `make test-unit` is the fast tier beside `make test`: the pure tests only
# (-short skips every test that starts a local cluster or another process,
# where the helper that would start it calls localcluster.SkipIfShort), in
# a few minutes, with nothing to build or install but Go and gcc. It keeps Go's
# test cache: after an edit it re-runs the packages the edit reaches
# (TEST_UNIT_FLAGS=-count=1: every package, cold). -p 4 on 2 cores: several
# packages' tests mostly wait (timers, handshakes, certificate lifetimes),
# so four at a time overlap that waiting with other packages' links —
# 239 s → 218 s for the whole tier, cold, on this 2-core machine. With Go's
# own linker, the test helpers' self-tests left out and the heaviest pure
# tests at a smaller size under -short: 3 min 56 s → 2 min 47 s (446 → 319
# CPU-s), cold, warm build cache, same machine and command.
SHELL := /bin/bash
BIN := .cache/bin
# -ldflags='-s -w': test binaries without DWARF and the ELF symbol table link
# in about half the CPU time (dashboard's race test binary: 14–20 s user →
# 9 s with -w; server's 10.5 → 9.5 s more with -s); race reports, panics and
# stack traces come from the Go function table (pclntab), which stays.
TEST_LDFLAGS := -ldflags='-s -w'
GO_TEST_FLAGS ?= -race -count=1 -timeout 45m $(TEST_LDFLAGS)
TEST_UNIT_FLAGS ?=
# make test starts the longest packages first. go test runs packages in the
# order they are named (./... lists the rest once more; go test runs each
# once), two at a time on 2 cores; in ./...'s order test/e2e and test/helm
# (10 and 8 minutes) started last and ran alone at the end with one core
# idle (the tail of a 46-minute run on 12-07).
TEST_FIRST := ./test/e2e ./test/helm ./test/fleet ./test/ha ./server/app ./cmd/relaymesh ./test/dataplane ./server ./test/istiod
# The fast tier links with Go's own linker: the same binaries without a
# gcc run per link (measured on eight of its packages: 51–53 → 44 CPU-s,
# most of it system time), since linking is half of the tier. make test
# keeps the default (gcc for the packages with cgo: ca/hsm's PKCS#11).
TEST_UNIT_LDFLAGS := -ldflags='-s -w -linkmode=internal'
# Left out of the fast tier (make test runs them): packages whose every test
# starts a local cluster or another process (under -short they would only
# link a race test binary to skip everything), and the tests of test
# helpers — the integration harness under test/, relaytest, worldtest and
# catest — which check the harness, not the product, each at the cost of a
# race test binary's link.
TEST_UNIT_EXCLUDE := server/heads server/leader relay/relaytest translation/worldtest ca/catest
TEST_UNIT_EXCLUDE_TREES := test
FUZZTIME ?= 10s
# The image `make image` builds is the charts' default: appVersion and
# image.repository of charts/relaymesh-*/ (test/helm and tools/image check).
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/relaymesh-server/Chart.yaml)
IMAGE_REPOSITORY ?= ghcr.io/relaymesh/relaymesh
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64

.PHONY: demo test test-unit test-rotation test-rbac deps tools gen verify image charts-lint bench fuzz clean help

help: ## show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

demo: ## run the main job end to end on local clusters; builds only what it runs (DEMO_EXIT=1: exit after the summary)
	hack/demo.sh

test: deps-test tools ## run every test, with -race, including integration tests on real kube-apiservers
	go test $(GO_TEST_FLAGS) $(TEST_FIRST) ./...
	@# -race needs cgo: the cgo-less build (the image's) is tested without it.
	CGO_ENABLED=0 go test -count=1 -run NoCgo ./ca/hsm/
	cd tools/image && go test $(GO_TEST_FLAGS) ./...

test-unit: ## the fast tier: every pure test, with -race and -short (skips what starts a local cluster or another process); needs only Go and gcc
	go test -race -short -timeout 15m -p 4 $(TEST_UNIT_LDFLAGS) $(TEST_UNIT_FLAGS) $$(go list ./... | grep -v $(foreach p,$(TEST_UNIT_EXCLUDE),-e '/$(p)$$') $(foreach p,$(TEST_UNIT_EXCLUDE_TREES),-e '/$(p)/'))

test-rotation: deps-test tools ## the data plane's root rotation under load, rolled back from every phase (docs/dataplane.md)
	go test $(GO_TEST_FLAGS) -run 'TestFederation/root_rotation' -v ./test/dataplane/ -args -dataplane.rollbacks=all

test-rbac: deps-test tools ## the charts' least-privilege RBAC with each of their rules removed in turn (make test removes those first used at the server's start and, per chart, one first used in each later step)
	go test $(GO_TEST_FLAGS) -run 'TestRBACByRealProcesses' -v ./test/helm/ -args -helm.rules=all

deps: ## install the Debian packages every target needs, when missing (gcc, softhsm2, protoc, ca-certificates)
	hack/deps.sh all

deps-%:
	hack/deps.sh $*

tools: ## build pinned kube-apiserver, etcd, kubectl, istioctl, pilot-discovery, controller-gen, staticcheck, cfssl, step-ca, helm, spire-server, spire-agent
	hack/tools.sh

gen: deps-gen ## regenerate deepcopy functions, CRD manifests (api/, copied to the server chart's crds/) and protobuf code (relay/proto, test/internal/workloadapi)
	hack/tools.sh controller-gen protoc-gen-go protoc-gen-go-grpc
	PATH="$(CURDIR)/$(BIN):$$PATH" protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative relay/proto/relay.proto
	PATH="$(CURDIR)/$(BIN):$$PATH" hack/gen-workloadapi.sh
	rm -f api/crds/*.yaml
	$(BIN)/controller-gen object:headerFile=/dev/null paths=./api/...
	$(BIN)/controller-gen crd:allowDangerousTypes=true,crdVersions=v1 paths=./api/... output:crd:artifacts:config=api/crds
	rm -f charts/relaymesh-server/crds/*.yaml
	cp api/crds/*.yaml charts/relaymesh-server/crds/

verify: gen ## gofmt, go vet, staticcheck, the layering rules, go.mod tidy, generated code up to date
	hack/tools.sh staticcheck
	go run ./cmd/relaymesh docs --check docs/cli.md
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	@# Which package may import which (internal/layering; docs/architecture.md).
	go test -count=1 ./internal/layering/
	$(BIN)/staticcheck ./...
	go mod tidy -diff
	cd tools && go mod tidy -diff
	cd tools/istio && go mod tidy -diff
	cd tools/proto && go mod tidy -diff
	cd tools/pki && go mod tidy -diff
	cd tools/spire && go mod tidy -diff
	cd tools/helm && go mod tidy -diff
	cd tools/image && go mod tidy -diff
	@if [ -n "$$(git status --porcelain -- api relay/proto charts/relaymesh-server/crds test/internal/workloadapi)" ]; then echo "generated code is stale; run make gen and commit:"; git status --porcelain -- api relay/proto charts/relaymesh-server/crds test/internal/workloadapi; exit 1; fi

image: deps-image ## build the OCI image (static relaymesh, non-root, no shell; IMAGE_PLATFORMS) into _out/image and _out/relaymesh-VERSION.oci.tar, without a daemon
	cd tools/image && go run . --repo ../.. --out ../../_out/image --tar ../../_out/relaymesh-$(VERSION).oci.tar \
		--version $(VERSION) --repository $(IMAGE_REPOSITORY) --platforms $(IMAGE_PLATFORMS)

charts-lint: ## helm lint --strict both charts, with their defaults and their production values
	hack/tools.sh helm
	for c in relaymesh-server relaymesh-agent; do \
		$(BIN)/helm lint --strict charts/$$c && $(BIN)/helm lint --strict charts/$$c -f charts/$$c/values-production.yaml || exit 1; \
	done

bench: tools ## run every benchmark once (numbers go to docs/benchmarks.md)
	go test -run '^$$' -bench . -benchmem -count=1 ./...

.PHONY: screenshots
screenshots: deps-test tools ## regenerate the dashboard's screenshots in docs/images/dashboard (the browser test on the demo world, headless Chromium)
	go test -count=1 -run '^TestDashboard$$' ./dashboard/ -args -screenshots=$(CURDIR)/docs/images/dashboard

fuzz: ## run every native fuzz target for FUZZTIME each
	hack/fuzz.sh $(FUZZTIME)

clean: ## remove local state and bin/ (not the cached third-party binaries)
	rm -rf _demo _out bin .cache/bin .cache/demo
