# batcherd — the targets a newcomer needs. `make help` lists them.
GO        ?= go
BIN       ?= bin
PKGS      ?= ./...
# Tests use their own databases on this server (created and dropped per test package).
export BATCHERD_TEST_DSN ?= batcherd:batcherd@tcp(127.0.0.1:3306)/

.PHONY: help db run-db test-deps model openapi-lint gitlab-matrix test test-race test-short lint build bench bench-isolation demo run chaos ha clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

db: ## make sure MariaDB runs and the test user exists (installs it on a fresh Debian)
	@scripts/mariadb-bootstrap.sh

test-deps: ## install what the suite needs beyond Go, git and make when missing (gcc, libc6-dev for -race; as root with apt-get)
	@scripts/test-deps.sh

openapi-lint: ## validate api/openapi.yaml with an independent OpenAPI validator (kin-openapi, installed into bin/tools when missing)
	@scripts/openapi-lint.sh

test: db test-deps openapi-lint ## the test command: bootstrap MariaDB, install test tools, lint api/openapi.yaml, go vet, go test -race
	$(GO) vet $(PKGS)
	BATCHERD_REQUIRE_TOOLS=1 $(GO) test -race -count=1 -timeout 12m $(PKGS)

gitlab-matrix: db ## the scanner's end-to-end scenarios (publish → merge, failure isolation, crash resume) against every simulated GitLab version × merge method (9 cells; the suite runs 3)
	BATCHERD_GITLAB_MATRIX=full $(GO) test -race -count=1 -run TestGitLabMatrix ./internal/scanner/

model: ## model-check the protocol with spin: the model holds every property and every mutant is caught (installs spin when missing; a few minutes; docs/MODEL.md)
	@scripts/model.sh full

test-race: test ## alias of test (the suite always runs under -race)

test-short: db ## quick run without the race detector
	$(GO) test -count=1 -short $(PKGS)

lint: ## gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

build: ## build binaries into ./bin
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

bench: db build ## measure admission, claims, settlement, contention and an end-to-end run against the database's own limits; writes BENCHMARKS.md (under 15 minutes)
	@scripts/bench-tools.sh
	$(GO) run ./bench/cmd/benchrun -out BENCHMARKS.md -bin $(BIN)
	$(GO) run ./bench/cmd/isolation -out BENCHMARKS.md

bench-isolation: db ## failure isolation against its limit alone (pipeline runs, load-independent): updates its section of BENCHMARKS.md
	$(GO) run ./bench/cmd/isolation -out BENCHMARKS.md

demo: db build ## the quickstart: fresh database, GitLab simulator, 3 replicas as processes, ~300 operations, one replica killed (about a minute)
	$(BIN)/batcherd-demo -bin $(BIN)

run-db: ## create the database and user the README's run section uses (batcherd, batcherd_run/batcherd_run; as root)
	@scripts/mariadb-bootstrap.sh --run-db

run: build ## one replica against your own MySQL and GitLab, configured by BATCHERD_* variables (bin/batcherd help lists them; bin/batcherd migrate once first)
	exec $(BIN)/batcherd serve

chaos: build ## the chaos run: 4 replicas, gitlab-sim and a private MariaDB (restarted once), 3 min of kill -9, connection kills, GitLab faults and human merges, then every end check (CHAOS_FLAGS="-duration 5m -v"; BATCHERD_CHAOS_DURATION)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/batcherd-chaos ./test/chaos
	$(BIN)/batcherd-chaos -bin $(BIN) $(CHAOS_FLAGS)

HA_MODE  ?= single
ha: build ## batcherd on a 3-node MariaDB Galera cluster behind HAProxy (installs galera-4/haproxy if missing): the chaos load, the writer node killed -9 mid-run, during a claim and during a settlement, rejoined each time; then every chaos end check and the unavailability window (HA_MODE=multi: each replica writes through another node; HA_FLAGS="-v")
	@scripts/ha/install.sh
	CGO_ENABLED=0 $(GO) build -o $(BIN)/batcherd-chaos ./test/chaos
	$(BIN)/batcherd-chaos -bin $(BIN) -ha $(HA_MODE) -replicas 3 -duration 90s $(HA_FLAGS)

clean: ## remove build output
	rm -rf $(BIN)
