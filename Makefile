# tether — see README.md. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

BUF_VERSION := v1.75.0
GOLANGCI_LINT_VERSION := v2.15.0
PROTOC_GEN_GO_VERSION := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.0
PROTOVALIDATE_VERSION := v1.2.2

MODULES := ./pkg/... ./services/executor/... ./services/runnergw/... ./services/backup/... ./services/runnerd/...
# Modules outside go.work (heavy dependencies of their own), tested in place.
OWN_MODULES := deploy/k8s
# protovalidate's validate.proto, vendored: buf resolves the import from this
# workspace module (buf.yaml), on a fresh clone, for any language's generator.
PROTODEPS := third_party/protovalidate/buf/validate/validate.proto

.PHONY: help tools protodeps generate check-generate lint release-api build test demo up up-auth bench fuzz

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

tools: ## install pinned code generators and linters (buf, protoc-gen-go, protoc-gen-go-grpc, golangci-lint)
	@$(GOBIN)/golangci-lint version 2>/dev/null | grep -q 'version $(GOLANGCI_LINT_VERSION:v%=%) ' || $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	@test -x $(GOBIN)/buf && $(GOBIN)/buf --version | grep -qx '$(BUF_VERSION:v%=%)' || $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@$(GOBIN)/protoc-gen-go --version 2>/dev/null | grep -q '$(PROTOC_GEN_GO_VERSION)' || $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@$(GOBIN)/protoc-gen-go-grpc --version 2>/dev/null | grep -q '$(PROTOC_GEN_GO_GRPC_VERSION:v%=%)' || $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

protodeps: ## refresh the vendored validate.proto (third_party/protovalidate) from protovalidate $(PROTOVALIDATE_VERSION) in the Go module cache; commit it
	@dir=$$(cd pkg && $(GO) mod download -json github.com/bufbuild/protovalidate@$(PROTOVALIDATE_VERSION) | sed -n 's/.*"Dir": "\(.*\)",/\1/p'); \
	  mkdir -p $(dir $(PROTODEPS)) && cp $$dir/proto/protovalidate/buf/validate/validate.proto $(PROTODEPS) && chmod 0644 $(PROTODEPS)

generate: tools ## regenerate pkg/gen from proto/
	rm -rf pkg/gen
	buf generate

# check-generate generates into a scratch directory and compares: pkg/gen is
# never removed under a build or test running beside it (make test and make
# test-continuity in one checkout).
check-generate: tools ## fail when committed generated code is stale
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; buf generate -o "$$tmp" || exit 1; \
	  diff -r "$$tmp/pkg/gen" pkg/gen && test -z "$$(git status --porcelain -- pkg/gen)" || { echo "pkg/gen is stale: run make generate and commit"; exit 1; }

GOFILES = $(shell git ls-files '*.go' | grep -v '^pkg/gen/')
CMDS := ./services/executor/cmd/executor ./services/executor/cmd/tetherctl ./services/executor/tools/tether-demo \
        ./services/executor/tools/tether-bench-stack \
        ./services/runnergw/cmd/runnergw ./services/backup/cmd/backup-verifier \
        ./services/runnerd/cmd/runnerd ./services/runnerd/tools/fake-codex-app-server ./services/runnerd/tools/fake-acp-agent ./services/runnerd/tools/fake-opencode \
        ./services/runnerd/tools/mock-model

# -trimpath: compiled packages are cached by content, not by the clone's
# directory, so a clone at another path (a fresh clone, a worktree) reuses
# what any other one compiled instead of compiling everything with -race
# again (2-4 min of CPU on a 2-core box). Stack traces and test failures
# then name files by import path (github.com/tether-run/tether/...).
TRIMPATH := -trimpath

# SPEC L4: the API of the newest release (CHANGELOG.md). buf breaking compares
# proto/ with it; at a release, `make release-api VERSION=vX.Y.Z` writes the new
# image, commit it and point RELEASE_API at it.
RELEASE_API := proto/releases/v0.1.0.binpb

lint: tools ## gofmt, go vet, golangci-lint (.golangci.yml), buf lint and buf breaking against the newest release's API
	@out=$$(gofmt -l $(GOFILES)); test -z "$$out" || { echo "gofmt would change:"; echo "$$out"; exit 1; }
	$(GO) vet $(TRIMPATH) $(MODULES)
	$(GOBIN)/golangci-lint run $(MODULES)
	@for m in $(OWN_MODULES); do (cd $$m && GOWORK=off $(GO) vet $(TRIMPATH) ./...) || exit 1; done
	buf lint
	buf breaking proto --against $(RELEASE_API)

release-api: tools ## write proto/releases/$(VERSION).binpb, the API image later versions are checked against
	buf build proto --exclude-source-info -o proto/releases/$(VERSION).binpb

# bin/ holds the binaries the tests, the demo and the benchmarks run, not
# release artifacts: they are linked without the symbol table and DWARF
# (panics and profiles still name functions, files and lines). That took
# make build from 20 s to 15 s (38 to 28 CPU-s) on a fresh clone of this
# 2-core VM, before every test can start. For a debugger:
# make build BUILD_LDFLAGS=
BUILD_LDFLAGS ?= -s -w
# SPEC L4: every binary answers -version with VERSION (git describe: a tag
# such as v0.1.0, or <tag>-<n>-g<commit>[-dirty]) and the commit and commit
# time go build records (-buildvcs, on in a git checkout; workspace builds
# do not stamp them by default).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
BUILDVCS := $(shell git rev-parse --is-inside-work-tree >/dev/null 2>&1 && echo true || echo false)
VERSION_LDFLAGS := -X github.com/tether-run/tether/pkg/buildinfo.version=$(VERSION)
build: ## build every binary into bin/ (BUILD_LDFLAGS= keeps debug information; VERSION= overrides the version)
	@mkdir -p bin
	$(GO) build $(TRIMPATH) -buildvcs=$(BUILDVCS) -ldflags='$(BUILD_LDFLAGS) $(VERSION_LDFLAGS)' -o bin/ $(CMDS)

# The binaries are built once (bin/) for every package whose tests run real
# processes (TETHER_TEST_BIN, see pkg/testing/testbin) instead of once per package.
# The end-to-end package is the long pole: it starts at once, beside the
# other packages, instead of after most of them. Its tests mostly wait on
# real processes (a test's stack uses a fraction of a core), so it runs
# E2E_PARALLEL of them at once instead of GOMAXPROCS. Lint (after
# check-generate) and the modules outside go.work
# run in the background too, instead of before and after everything.
# The background runs' output follows the main run's. The other packages
# run TEST_P programs (builds, links, test binaries) at once instead of
# GOMAXPROCS (2): a package whose tests mostly wait (the gateway's, 1–2 min)
# then no longer holds one of two slots while the rest is built. 4, not 3:
# the last ~30 small packages (a link and a second or two of tests each)
# otherwise left a core idle for the run's last 40 s (fresh clone,
# 2026-12-02: 4m56 at 3, 4m20 at 4, 461 CPU-s).
E2E := ./services/executor/internal/e2e
E2E_PARALLEL ?= 4
TEST_P ?= 4
# The longest of the other packages come first on go test's command line,
# which builds and runs packages in that order as slots free up: a long one
# taken last (the gateway's sorts late) otherwise runs alone at the end.
# The ones of 9-20 s (runner, grpcx, archive, prp, digest, runnerd's main)
# follow: taken in name order they ran one after another at the end, beside
# two idle slots (2026-12-02: runner's 13 s alone in the last 15 s).
TEST_FIRST := ./services/runnergw/internal/gateway ./services/executor/internal/store ./pkg/testing/pgtest \
              ./services/executor/internal/dispatch ./services/executor/internal/api ./services/runnerd/internal/codex \
              ./services/runnerd/internal/runner ./pkg/grpcx ./pkg/archive ./pkg/prp ./pkg/digest ./services/runnerd/cmd/runnerd
# The console's browser tests (SPEC U4, TestU4_ in the end-to-end package)
# run in make test: TETHER_REQUIRE_BROWSER makes a missing Chromium a
# failure instead of a skip (.ci/run installs Debian's chromium), and their
# screenshots are kept in artifacts/console/<test>/.
# Everything make test writes to a temporary directory — each test's
# directories, the PostgreSQL clusters, runnerd state roots, go test's build
# directories and the test binaries it links — goes to a fresh directory
# under TEST_TMPDIR, removed afterwards. TEST_TMPDIR is /dev/shm when that is
# a memory file system with at least 4 GiB free. On the 2-core VM this was
# measured on (ext4 mounted with discard, a guest whose page faults, context
# switches and disk requests are dear) creating, writing and deleting those
# files was kernel time the CPU-bound run paid for: PostgreSQL's CPU in the
# store package's tests fell from 33-38 s to 23-24 s, in all of make test
# from 172 s to 129 s, runnerd's from 65 s to 54 s (process accounting,
# 2026-12-02). Elsewhere (TEST_TMPDIR empty) it is $$TMPDIR or /tmp.
TEST_TMPDIR ?= $(shell test "$$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs && df -Pk /dev/shm | awk 'NR==2 && $$4 >= 4194304 {print "/dev/shm"}')
test: check-generate build ## lint, check generated code, and run every test with -race
	@base='$(TEST_TMPDIR)'; tmp=$$(mktemp -d "$${base:-$${TMPDIR:-/tmp}}/tether-test.XXXXXX") && chmod 1777 "$$tmp" || exit 1; \
	  trap 'rm -rf "$$tmp"' EXIT; export TMPDIR=$$tmp; echo "temporary files: $$tmp"; \
	  export TETHER_TEST_BIN=$(CURDIR)/bin TETHER_REQUIRE_BROWSER=1 TETHER_TEST_ARTIFACTS=$(CURDIR)/artifacts/console; out=$$(mktemp -d); \
	  echo "$(GO) test $(TRIMPATH) -race -count=1 -timeout 40m -parallel $(E2E_PARALLEL) $(E2E) (in the background)"; \
	  $(GO) test $(TRIMPATH) -race -count=1 -timeout 40m -parallel $(E2E_PARALLEL) $(E2E) >$$out/e2e 2>&1 & e2e=$$!; \
	  echo "make lint (in the background)"; \
	  $(MAKE) --no-print-directory lint >$$out/lint 2>&1 & lint=$$!; \
	  echo "$(GO) test $(TRIMPATH) -race -count=1 -timeout 10m ./... in $(OWN_MODULES) (in the background)"; \
	  for m in $(OWN_MODULES); do (cd $$m && GOWORK=off $(GO) test $(TRIMPATH) -race -count=1 -timeout 10m ./...) || exit 1; done >$$out/own 2>&1 & own=$$!; \
	  echo "$(GO) test $(TRIMPATH) -race -count=1 -timeout 40m -p $(TEST_P) $(MODULES) (but $(E2E); $(TEST_FIRST) first)"; \
	  first=$$($(GO) list $(TEST_FIRST)); \
	  $(GO) test $(TRIMPATH) -race -count=1 -timeout 40m -p $(TEST_P) $$first $$($(GO) list $(MODULES) | grep -v '/internal/e2e$$' | grep -vxF "$$first"); rc=$$?; \
	  wait $$e2e; erc=$$?; cat $$out/e2e; \
	  wait $$own; orc=$$?; cat $$out/own; \
	  wait $$lint; lrc=$$?; echo "make lint:"; cat $$out/lint; rm -rf $$out; \
	  test $$rc = 0 && test $$erc = 0 && test $$orc = 0 && test $$lrc = 0

demo: build ## run three warm turns through the whole stack on an ephemeral PostgreSQL
	bin/tether-demo

up: build ## keep the stack running on the default ports until interrupted
	bin/tether-demo -up

up-auth: build ## as up, with tenancy enforced: development tokens for acme, globex and an operator in a printed directory
	bin/tether-demo -up -auth

bench: ## measure tether against raw baselines in one run (ephemeral durable PostgreSQL, or TETHER_DATABASE_URL); BENCHFLAGS=-h lists knobs; FAIRFLAGS='-fair-samples 200' tunes the fairness curve
	@mkdir -p bin
	$(MAKE) --no-print-directory build
	$(GO) build -o bin/ ./services/executor/tools/tether-bench
	bin/tether-bench $(BENCHFLAGS)
	bin/tether-bench -curves $(CURVEFLAGS)
	bin/tether-bench-stack
	bin/tether-bench-stack -sessions 10,50
	bin/tether-bench-stack -cancels 200
	bin/tether-bench-stack -takeovers 20
	bin/tether-bench-stack -takeovers 10 -same-host-takeover=false
	bin/tether-bench-stack -takeovers 10 -same-host-takeover=false -sigterm -lease-ttl 60s
	bin/tether-bench-stack -throughput 300 -gateways 1
	bin/tether-bench-stack -throughput 300 -gateways 3
	bin/tether-bench-stack -fairness 0,1000,10000,100000 $(FAIRFLAGS)
	$(GO) build -o bin/ ./services/runnerd/tools/warm-turn-bench
	bin/warm-turn-bench -fake bin/fake-codex-app-server
	$(MAKE) --no-print-directory bench-backup
	$(GO) build -o bin/ ./services/runnergw/tools/relay-bench
	bin/relay-bench

FUZZTIME ?= 1m
# A run that ends with the fuzz engine's own "context deadline exceeded"
# (its coordinator timing out on a loaded machine, no failing input found)
# is retried once; a real finding is written under testdata/fuzz and fails.
fuzz: ## run every fuzz target of the repository for FUZZTIME each (default 1m; e.g. make fuzz FUZZTIME=10s)
	@set -e; for f in $$(git grep -l '^func Fuzz' -- '*_test.go'); do \
	  dir=./$$(dirname $$f); \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    echo "== fuzz $$dir $$t ($(FUZZTIME))"; \
	    for try in 1 2; do \
	      if out=$$($(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) $$dir 2>&1); then echo "$$out" | tail -1; break; fi; \
	      if [ $$try = 1 ] && echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written'; then \
	        echo "   (fuzz engine timed out without a finding; retrying)"; continue; fi; \
	      echo "$$out"; exit 1; \
	    done; \
	  done; \
	done

.PHONY: test-continuity
test-continuity: ## opt-in SPEC C: the remote continuity regression in a disposable process tree (KEEP=1 keeps a failed case's processes and files)
	TETHER_CONTINUITY=1 $(GO) test -race -count=1 -timeout 15m -v -run '^TestC[0-9]' ./services/executor/internal/e2e/

.PHONY: test-clients
test-clients: build ## opt-in SPEC U2: the TypeScript client (clients/typescript): npm ci (pinned by package-lock.json; the npm registry once), generated code current, its Node suite against bin/tether-demo -up -auth (offline)
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "test-clients needs node (>= 20) and npm"; exit 1; }
	cd clients/typescript && npm ci --no-audit --no-fund
	TETHER_CLIENTS=1 TETHER_TEST_BIN=$(CURDIR)/bin $(GO) test -count=1 -timeout 10m -v -run '^TestU2_' ./services/executor/tools/tether-demo/ ./pkg/failure/

.PHONY: image image-check
image: ## SPEC L4: the service image as a docker-archive (bin/tether-image.tar; LOAD=1 loads it), reproducible from the static binaries and a cached Debian rootfs (debootstrap once, no Docker Hub), labelled with VERSION and the commit
	VERSION=$(VERSION) bash scripts/image.sh

image-check: ## SPEC L4: two image builds of the same tree give the same image id (TestL4_MakeImageIsReproducible…)
	TETHER_IMAGE_TEST=1 $(GO) test -count=1 -run '^TestL4_MakeImageIsReproducible' ./pkg/buildinfo/

.PHONY: test-upgrade
test-upgrade: build ## opt-in SPEC L3: executors of the previous release (v0.1.0, built from its commit into .cache/upgrade/) and of main on one database during a rolling upgrade with runs in flight; audit clean
	TETHER_UPGRADE=1 TETHER_TEST_BIN=$(CURDIR)/bin $(GO) test -count=1 -timeout 10m -v -run '^TestL3_ExecutorsOfThePreviousRelease' ./services/executor/internal/e2e/

.PHONY: test-chaos
test-chaos: ## SPEC X2: the fault matrix over real processes (>= 204 runs, 6 warm sessions, two gateways, >= 10 faults of each kind incl. host kill, fail-back, runnerd kill after a checkpoint), then tetherctl audit (wedged sessions too) and an orphan-provider scan; SEED=n reproduces a plan
	TETHER_CHAOS=1 SEED=$(SEED) $(GO) test -count=1 -timeout 25m -v -run '^TestX2_' ./services/executor/internal/e2e/

CODEX_VERSION := 0.169.0
CODEX_CACHE := .cache/codex
CODEX_BIN := $(CODEX_CACHE)/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex
.PHONY: test-k8s
test-k8s: build ## opt-in SPEC D4: deploy/k8s against a real kube-apiserver over etcd (built once from their Go modules into .cache/k8s), offline: every object server-side applied (dry run, then for real) and read back, then the manifest checks; no kubelet runs
	TETHER_TEST_BIN=$(CURDIR)/bin bash deploy/k8s/test.sh

.PHONY: test-compose
test-compose: ## opt-in SPEC D1 (root): deploy/docker-compose.yml on a real Docker engine, offline (private dockerd, compose CLI and images cached in .cache/compose); 3 warm turns, docker kill of the executor mid-turn, audit, down -v
	bash deploy/compose/test.sh

.PHONY: test-codex
test-codex: ## opt-in: provider scenario suite against the real codex app-server (npm @openai/codex into .cache/codex) and a loopback mock model
	@test -x $(CODEX_BIN) && $(CODEX_BIN) --version | grep -qx 'codex-cli $(CODEX_VERSION)' || { \
	  mkdir -p $(CODEX_CACHE) && cd $(CODEX_CACHE) && { test -f package.json || echo '{"name":"tether-codex-cache","private":true}' > package.json; } && \
	  npm install --no-audit --no-fund @openai/codex@$(CODEX_VERSION); }
	@test -x $(CODEX_BIN) || { echo "native codex binary not found at $(CODEX_BIN)"; exit 1; }
	@mkdir -p $(CODEX_CACHE)/tmp
	@# codex refuses to create its sandbox helper when CODEX_HOME is under /tmp
	@# (an accepted approval then fails: bwrap: execvp codex-linux-sandbox), so
	@# the suite's temporary homes live under .cache/codex/tmp.
	@set -o pipefail; TMPDIR=$(abspath $(CODEX_CACHE))/tmp TETHER_CODEX_BIN=$(abspath $(CODEX_BIN)) $(GO) test -count=1 -timeout 10m -v -run '^TestR2_ScenarioSuiteAgainstRealCodex$$' ./services/runnerd/internal/testing/scenario/ 2>&1 \
	  | tee $(CODEX_CACHE)/test-codex.log | grep -E '^(test-codex:|--- |ok |FAIL|panic)' \
	  || { echo "test-codex failed; full log: $(CODEX_CACHE)/test-codex.log"; tail -40 $(CODEX_CACHE)/test-codex.log; exit 1; }

.PHONY: test-providers
test-providers: ## opt-in SPEC R7/R10/R11/R12: pinned real providers (npm into .cache/) offline against the loopback mock model, driver suites and through the whole stack; every section runs and is reported; PROVIDERS="opencode opencode-stack codex codex-stack acpx-codex acpx-codex-stack acpx-claude acpx-claude-stack" selects
	bash scripts/test-providers.sh

.PHONY: bench-curves
bench-curves: build ## scale curves only (claim vs blocked backlog, fair share vs another company's backlog, renewal vs leases, append vs table size, WatchRun vs watchers, memory per idle warm session); CURVEFLAGS=-h lists knobs, FAIRFLAGS the through-stack fairness curve's (tether-bench-stack -h)
	$(GO) build -o bin/ ./services/executor/tools/tether-bench
	bin/tether-bench -curves $(CURVEFLAGS)
	bin/tether-bench-stack -sessions 10,50
	bin/tether-bench-stack -cancels 200
	bin/tether-bench-stack -takeovers 20
	bin/tether-bench-stack -takeovers 10 -same-host-takeover=false
	bin/tether-bench-stack -takeovers 10 -same-host-takeover=false -sigterm -lease-ttl 60s
	bin/tether-bench-stack -fairness 0,1000,10000,100000 $(FAIRFLAGS)

.PHONY: bench-backup
bench-backup: ## deep-verify digest throughput vs raw sha256 baselines (1 GiB in 10 files, 100 MiB in 10,000 files); BACKUPBENCHFLAGS=-h lists knobs
	@mkdir -p bin
	$(GO) build -o bin/ ./services/backup/tools/tether-bench-backup
	bin/tether-bench-backup $(BACKUPBENCHFLAGS)
