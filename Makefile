# The two commands that matter: `make demo` and `make test`. Both set up
# what is missing on this machine first (scripts/ensure-services.sh).
# `make help` lists every target: the text after `##` on its line.
GO        ?= go
BIN       := bin/stock
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# report its own deadline as a failure ("context deadline exceeded", no
# crasher; golang/go#75804, fixed in 1.27). 5000 inputs take about 7 s here.
FUZZTIME  ?= 5000x
# How many packages run at once is scripts/unit.sh's: the packages that load
# the machine one at a time, the others two at a time beside them.
TESTFLAGS ?= -race -count=1 -timeout 20m

.PHONY: help demo demo-quick test build services servers vet tidy tracked unit fuzz explore faults k6 clean

help: ## this list
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/make \1|\2/' | awk -F'|' '{ printf "%-17s %s\n", $$1, $$2 }'

# scripts/demo.sh brings up what is missing itself (docker compose where a
# Docker engine answers, else scripts/ensure-services.sh), builds, and runs
# lab/cmd/demo.
demo: ## set up the servers, build, run the comparison: reports/latest/index.html
	@bash scripts/demo.sh

demo-quick: ## the same, smaller: a few minutes (the catalog takes 500 SKUs)
	@DEMO_QUICK=1 bash scripts/demo.sh

test: services vet unit fuzz ## set up the servers and run the whole suite (-race, fuzzing)

build: ## build bin/stock and bin/servers
	$(GO) build -o $(BIN) ./cmd/stock
	$(GO) build -o bin/servers ./lab/cmd/servers

services: ## install and start what is missing: PostgreSQL, MariaDB, Redis; install etcd, ZooKeeper, Patroni, Galera, Chromium
	@bash scripts/ensure-services.sh

# In the foreground: Ctrl-C stops what it started. Ports already taken are
# left to whoever answers there.
servers: services ## run etcd, ZooKeeper and the Redis servers the strategies need, on their default addresses
	$(GO) run ./lab/cmd/servers

# Both modules must be tidy: go.mod and go.sum exactly as `go mod tidy`
# writes them (-diff prints what it would change and fails).
tidy: ## fail if either Go module is not tidy
	$(GO) mod tidy -diff
	cd loadtest && $(GO) mod tidy -diff

# staticcheck is pinned in go.mod as a tool (go get -tool): `go tool
# staticcheck` builds that version, the same on every machine.
vet: tidy tracked ## gofmt, go vet, staticcheck, tidy modules, no tracked executables
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

# Build outputs are never committed: a tracked file that is an executable
# (ELF) or larger than 1 MB fails.
tracked: ## fail if git tracks an executable or a file over 1 MB
	@bad=$$(git ls-files -z 2>/dev/null | xargs -0 -r sh -c 'for f; do [ -f "$$f" ] || continue; \
	  if [ "$$(head -c 4 "$$f" | od -An -c | tr -d " ")" = "177ELF" ] || [ $$(stat -c %s "$$f") -gt 1048576 ]; then echo "$$f"; fi; done' sh); \
	  if [ -n "$$bad" ]; then echo "tracked build outputs or large files: $$bad"; exit 1; fi

unit: ## go test -race ./..., in two streams (the servers must be up: make services)
	@GO='$(GO)' TESTFLAGS='$(TESTFLAGS)' bash scripts/unit.sh

# Each fuzz target in turn (go test -fuzz takes one at a time). The corpus
# checked in under internal/httpapi/testdata/fuzz runs with every go test.
fuzz: ## fuzz the order handler and the JSON string writer for FUZZTIME (default 5000x)
	$(GO) test -run '^$$' -fuzz '^FuzzPlaceOrder$$' -fuzztime $(FUZZTIME) ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz '^FuzzStartSale$$' -fuzztime $(FUZZTIME) ./internal/httpapi/
	$(GO) test -run '^$$' -fuzz '^FuzzAppendJSONString$$' -fuzztime $(FUZZTIME) ./internal/httpapi/

# The schedule explorer (lab/explore) with a budget 20 times that of
# make test: about 5 minutes here, exhaustive for 3 buyers of every strategy
# but version-cas and the lock strategies. EXPLORE_SEED=<n> replays a sample;
# EXPLORE_STRATEGY=<name> runs one strategy. Then the lifecycle's races
# (pay against expiry, retried cancel, two sweepers, a buyer for a returned
# unit, one buyer twice under PER_USER_LIMIT=1) at 5 times make test's
# budget (EXPLORE_LIFECYCLE_SCALE): about 5 minutes more.
explore: services ## every schedule of 2-3 buyers per strategy, 20x make test's budget; the lifecycle's races, 5x
	EXPLORE_SCALE=$${EXPLORE_SCALE:-20} $(GO) test -race -count=1 -timeout 90m -run 'TestEverySchedule$$' -v ./lab/explore/
	EXPLORE_SCALE=$${EXPLORE_LIFECYCLE_SCALE:-5} $(GO) test -race -count=1 -timeout 90m -run 'TestEveryLifecycleSchedule$$' -v ./lab/explore/

# The fault scenarios (lab/faults, lab/cmd/faults): kill -9, paused lock
# holders, lost Redis servers, a crashed database, retried idempotent orders,
# killed etcd/ZooKeeper leaders, the Redis reservation's Redis restarted and
# its database crashed, each against three instances under load (about 11
# minutes); then the Redis restart and wipe, the database crash and an
# instance kill with 10,000 SKUs on sale, a few of them hot (scenario 9),
# and the restart table, first 201 after a Redis restart with 200, 2,000
# and 10,000 SKUs (scenario 10): about 14 minutes more here
# (`go run ./lab/cmd/faults -bin bin/stock -scenarios 9,10` runs those alone);
# the failovers of replicated servers: Redis under Sentinel (14), PostgreSQL
# under Patroni (15), a Galera cluster (16).
# Writes reports/faults/<timestamp>/faults.{md,json} and
# reports/faults/latest, and fails when a safe configuration oversold or
# lost data. `make test` runs short forms (TestShortFaults,
# TestShortCatalogFaults).
faults: services build ## the fault scenarios against real servers (about 30 minutes)
	$(GO) run ./lab/cmd/faults -bin $(BIN)

# About 4 minutes the first time.
k6: ## build the pinned k6 (loadtest/go.mod) into the go build cache
	cd loadtest && $(GO) tool -n k6

clean: ## remove bin/
	rm -rf bin
