# Leasehold. The two commands a newcomer needs: `make run` and `make test`.
SHELL     := /bin/bash
GO        ?= go
BIN       := bin/leasehold
BENCH_ARGS ?= --workload all --clients 64 --duration 10s
IMAGE     ?= leasehold:latest
# Stamped into the binary: `leasehold version` prints both.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS   := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.PHONY: run build test test-short bench bench-scale bench-scale-server hostile lint fuzz fuzz-ci image clean chaos chaos-ci canaries

# A single node on 127.0.0.1:7700 (HTTP), :7701 (Raft), :7702 (gossip),
# data in ./leasehold-data. Ctrl-C stops it gracefully.
run: build
	./$(BIN) server

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/leasehold

# Every test, under the race detector (the chaos package, with the suite's
# in-process tier, on its own: it loads the machine); then the chaos clock's
# own tests, which only a build with the `chaos` tag has. The chaos suite's
# real-process scenarios and canaries are `make chaos-ci` (CI runs both).
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m $$($(GO) list ./... | grep -v '/chaos$$')
	$(GO) test -race -count=1 -timeout 20m ./chaos/
	$(GO) vet -tags chaos ./node/
	$(GO) test -race -count=1 -tags chaos -run Clock ./node/

# The chaos suite (chaos/, see docs/chaos.md). Output (history,
# porcupine HTML, timeline, summary.json, node logs) goes under CHAOS_OUT.
CHAOS_OUT ?= chaos-out/$(shell date +%Y%m%d-%H%M%S)
CANARIES  := canary_early_expiry canary_stale_read canary_fence_reset canary_renew_token canary_tick_at_once

# CI runs it after `make test`: every scenario once against real server processes in network
# namespaces (needs root, iproute2 and nftables; about ten minutes), then
# proof that the suite catches each deliberate bug (canary build tags).
chaos-ci:
	LEASEHOLD_CHAOS_NETNS=1 LEASEHOLD_CHAOS_OUT=$(abspath $(CHAOS_OUT))/ci $(GO) test -count=1 -timeout 25m \
		-run '^TestNetnsScenarios$$' -v ./chaos/ | grep -v '^        chaos: '; test $${PIPESTATUS[0]} -eq 0
	$(MAKE) canaries

canaries:
	@for c in $(CANARIES); do echo "== $$c: the suite must catch it"; \
		$(GO) test -count=1 -tags $$c -run '^TestCanary$$' ./chaos/ || exit 1; done

# A longer randomized suite on real processes (root): eight runs of four
# random faults each, then every scenario once. Replay a run with the seed
# and scenario it prints.
chaos:
	$(GO) build -tags chaos -o bin/leasehold-chaos ./cmd/leasehold
	./bin/leasehold-chaos chaos --tier netns --scenario random --runs 8 --out $(CHAOS_OUT)/random
	./bin/leasehold-chaos chaos --tier netns --scenario all --out $(CHAOS_OUT)/all

test-short:
	$(GO) test -count=1 -short ./...

# The performance figures (docs/operations.md#performance), about ten
# minutes: a throwaway single server, then a throwaway three-server cluster,
# on free loopback ports (data in a temporary directory, removed after),
# each leader driven by `leasehold bench` (one table, a servers column);
# then one server holding a million leases (RSS, restart, snapshot); then
# 100,000 leases ending together while a writer writes.
bench: build
	./$(BIN) bench --spawn 1,3 $(BENCH_ARGS)
	./scripts/bench-scale-server.sh ./$(BIN)
	$(GO) test -run '^$$' -bench 'ExpiryStormWrites' -benchtime 1x ./node/

# State-machine scale figures: a million leases (heap, snapshot, restore), a
# 100k expiry storm, command encoding, and the embedded API on disk.
bench-scale:
	$(GO) test -run '^$$' -bench 'MillionLeases|ExpiryStorm' -benchtime 1x ./fsm/
	$(GO) test -run '^$$' -bench 'EncodeDecode' ./fsm/
	$(GO) test -run '^$$' -bench . -benchtime 3s ./node/

# One real server over HTTP with a million live leases (LEASES=n for
# another count): RSS after GC, stop, restart to /readyz (snapshot restore
# and log replay), snapshot download; about 3-5 minutes, cleans up after
# itself (scripts/bench-scale-server.sh).
bench-scale-server: build
	./scripts/bench-scale-server.sh ./$(BIN)

# Hostile load from clients with valid tokens (waiters, churn, listings,
# subscribers) against one in-memory node: reports whether the cluster clock
# keeps >= 0.9 of real time and a probe writer's p99 < 20 ms. Scale with
# LEASEHOLD_HOSTILE_WAITERS, _CHURN, _LISTERS, _SUBS (full scale by default).
hostile:
	LEASEHOLD_HOSTILE=1 $(GO) test -count=1 -run '^TestHostileLoad$$' -timeout 40m -v ./node/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Every fuzz target (found in the _test.go files) for FUZZTIME each; a
# failing input lands in that package's testdata/fuzz/ and stays a test case.
FUZZTIME ?= 10s
fuzz:
	GO=$(GO) ./.ci/fuzz $(FUZZTIME)

# The same, briefly, as CI runs it after `make test` (about two minutes).
fuzz-ci:
	GO=$(GO) ./.ci/fuzz 4s

# The container image (deploy/Dockerfile, FROM scratch: nothing is pulled):
# a static binary built here, copied into the image. deploy/README.md has the rest.
image:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o deploy/leasehold ./cmd/leasehold
	mkdir -p deploy/.empty
	docker build -t $(IMAGE) deploy

clean:
	rm -rf bin deploy/leasehold deploy/.empty
