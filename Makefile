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

.PHONY: run build test test-chaos test-chaos-clock test-python test-short bench bench-scale bench-scale-server hostile hostile-ci lint fuzz fuzz-ci image clean chaos chaos-ci canaries

# A single node on 127.0.0.1:7700 (HTTP), :7701 (Raft), :7702 (gossip),
# data in ./leasehold-data. Ctrl-C stops it gracefully.
run: build
	./$(BIN) server

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/leasehold

# Every test, under the race detector: every package but chaos, twice as
# many packages at once as there are cores (their tests mostly wait on
# servers, elections and timers), the longest first (TEST_FIRST: go test
# starts packages in the order it is given them, and node and
# cmd/leasehold, minutes each, would otherwise wait for slots behind the
# packages before them in go list's order); then, side by side, the chaos package
# (the suite's in-process tier: three-server clusters under faults, two
# at a time, mostly waiting on the phases' timers), the chaos clock's own
# tests (only a build with the `chaos` tag has them) and the Python
# client's (waiting on real servers). Each of the three prints its output
# whole when it ends (make -O). The chaos suite's real-process tier (its
# harness's own tests and every scenario) and the canaries are `make
# chaos-ci` (CI runs both).
TEST_FIRST := ./node ./cmd/leasehold ./api ./cluster
test:
	$(GO) vet ./...
	$(GO) vet -tags chaos ./node/
	$(GO) test -race -count=1 -timeout 30m -p $$(( $$(nproc) * 2 )) $$($(GO) list $(TEST_FIRST) ./... | grep -v '/chaos$$')
	$(MAKE) --no-print-directory -j3 -O test-chaos test-chaos-clock test-python

test-chaos:
	$(GO) test -race -count=1 -timeout 35m ./chaos/

test-chaos-clock:
	$(GO) test -race -count=1 -tags chaos -run Clock ./node/

# The Python client (clients/python) and the fleet example
# (examples/python/fleet): unit tests, then against real servers built from
# this tree (one, and three with a leader kill), in Debian's Python
# (/usr/bin/python3: python3-aiohttp, python3-jwt, python3-pytest; .ci/run
# installs them). First the package is installed offline into a throwaway
# target, and the tests run against that installed copy.
PYTHON ?= /usr/bin/python3
test-python:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/pytest/leasehold ./cmd/leasehold
	rm -rf bin/pytest/site && $(PYTHON) -m pip install --quiet --root-user-action=ignore --no-build-isolation --no-deps --no-index \
		--target bin/pytest/site ./clients/python
	rm -rf clients/python/build clients/python/src/*.egg-info
	cd clients/python && PYTHONPATH=$(abspath bin/pytest/site) LEASEHOLD_PY_INSTALLED=1 \
		LEASEHOLD_BIN=$(abspath bin/pytest/leasehold) $(PYTHON) -m pytest -q -p no:cacheprovider tests ../../examples/python/fleet

# The chaos suite (chaos/, see docs/chaos.md). Output (history,
# porcupine HTML, timeline, summary.json, node logs) goes under CHAOS_OUT.
# Expanded once: every use in a run names the same directory.
ifndef CHAOS_OUT
CHAOS_OUT := chaos-out/$(shell date +%Y%m%d-%H%M%S)
endif
# Each canary must fail the one checker chaos/canary_test.go names for it
# (in process, or on real processes: TestNetnsCanary, root).
# canary_config_recover is caught by configuration whichever way its
# rewritten follower comes back (it stays a follower, or it elects itself
# and takes the cluster over): the start-up configuration is judged against
# what the cluster had before that start (docs/chaos.md, Canaries).
CANARIES  := canary_early_expiry canary_stale_read canary_fence_reset canary_renew_token canary_tick_at_once \
	canary_fence_repeat canary_lose_tail canary_wall_apply canary_clock_stops canary_writes_stuck canary_data_race \
	canary_config_recover canary_no_guard
# The real-process scenarios' seed: "time" places the faults differently on
# every CI run (the base seed is printed; LEASEHOLD_CHAOS_SEED=N replays it);
# the in-process tier of `make test` keeps the fixed seeds, the regression set.
CHAOS_SEED ?= time
# Scenarios `make chaos-ci` also runs against a server built with -race.
CHAOS_RACE_SCENARIOS ?= none,partition-leader,kill-leader,transfer-storm,snapshot-catchup

# CI runs it after `make test`: the real-process harness's own tests
# (TestNetnsCluster, TestNetnsClock, TestNetnsHarnessDies), then every
# scenario once against real server processes in network
# namespaces (needs root, iproute2 and nftables; about 25 minutes), then
# proof that the suite catches each deliberate bug (canary build tags).
chaos-ci:
	LEASEHOLD_CHAOS_NETNS=1 LEASEHOLD_CHAOS_SEED=$(CHAOS_SEED) LEASEHOLD_CHAOS_OUT=$(abspath $(CHAOS_OUT))/ci $(GO) test -count=1 -timeout 40m \
		-run '^(TestNetnsHarnessDies|TestNetnsScenarios|TestNetnsPowerCutCanary|TestNetnsCluster|TestNetnsClock)$$' -v ./chaos/ | grep -v '^        chaos: '; \
		rc=$${PIPESTATUS[0]}; f=$(abspath $(CHAOS_OUT))/ci/failures.txt; \
		if [ -s $$f ]; then echo "== failed scenarios ($$f):"; cat $$f; fi; test $$rc -eq 0
	LEASEHOLD_CHAOS_NETNS=1 LEASEHOLD_CHAOS_RACE=$(CHAOS_RACE_SCENARIOS) LEASEHOLD_CHAOS_SEED=$(CHAOS_SEED) \
		LEASEHOLD_CHAOS_OUT=$(abspath $(CHAOS_OUT))/race $(GO) test -count=1 -timeout 20m \
		-run '^TestNetnsRaceScenarios$$' -v ./chaos/ | grep -v '^        chaos: '; test $${PIPESTATUS[0]} -eq 0
	$(MAKE) canaries

canaries:
	@for c in $(CANARIES); do echo "== $$c: the suite must catch it"; \
		$(GO) test -count=1 -timeout 20m -tags $$c -run '^(TestCanary|TestNetnsCanary)$$' ./chaos/ || exit 1; done
	@echo "== canary_no_snapshot_gate: TestCandidateSnapshotThenLeaderLost must fail (no leader)"; \
		out=$$($(GO) test -count=1 -tags canary_no_snapshot_gate -run '^TestCandidateSnapshotThenLeaderLost$$' ./cluster/ 2>&1); \
		if [ "$$(echo "$$out" | grep -c 'no leader within')" -ge 2 ] && echo "$$out" | grep -q -- '--- FAIL: TestCandidateSnapshotThenLeaderLost/tcp' && \
			echo "$$out" | grep -q -- '--- FAIL: TestCandidateSnapshotThenLeaderLost/inmem'; then echo "caught (tcp and inmem)"; else echo "$$out"; exit 1; fi

# A longer randomized suite on real processes (root): eight runs of four
# random faults each, then every scenario once. Replay a run with the seed
# and scenario it prints.
chaos:
	$(GO) build -tags chaos -o bin/chaos/leasehold ./cmd/leasehold
	$(GO) build -o bin/chaos/leasehold-chaos ./cmd/leasehold-chaos
	./bin/chaos/leasehold-chaos --tier netns --scenario random --runs 8 --out $(CHAOS_OUT)/random
	./bin/chaos/leasehold-chaos --tier netns --scenario all --out $(CHAOS_OUT)/all

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
	bash -c "$$BENCH_SCALE_SERVER_SH" bench-scale-server $(BIN)
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
# itself (the script BENCH_SCALE_SERVER below).
bench-scale-server: build
	bash -c "$$BENCH_SCALE_SERVER_SH" bench-scale-server $(BIN)

# BENCH_SCALE_SERVER is the bash script bench-scale-server and bench run
# (exported to them as BENCH_SCALE_SERVER_SH, unexpanded by make).
# Measures one real server holding many live leases over HTTP: it starts a
# throwaway server, fills LEASES leases with `leasehold bench --workload
# fill`, then reports the server's RSS (after a GC settles), the time of a
# snapshot download (`leasehold snapshot save`) and the time from a restart
# (SIGTERM, start again on the same data directory) to /readyz, with what
# the restart spent restoring the snapshot and replaying the log (from the
# server's log). It stops by itself and removes its processes and directory.
#
# Run by `make bench-scale-server` and `make bench` as
# bash -c "$$BENCH_SCALE_SERVER_SH" NAME [BIN]   (BIN: default bin/leasehold)
# Environment: LEASES (1000000), CLIENTS (64), TTL (30m), PORT (7720, uses
# PORT..PORT+3: HTTP, Raft, gossip, pprof; RAFT_PORT, GOSSIP_PORT and
# PPROF_PORT override the last three), SERVER_ARGS (extra server
# flags), HEAP_OUT (save the filled server's heap profile there),
# SERVER_LOG_OUT (save the server's log there), KEEP (1: keep the data
# directory, to profile a restart by hand), RSS_STILL (3: how many
# seconds in a row the RSS must not fall to count as settled).
#
# "After GC" is after a forced collection (pprof's heap?gc=1) and the RSS
# no longer falling (at most 30 s): the server's GOGC=400 (relaxGC) would
# otherwise leave the fill's garbage in the figure until the next GC.
define BENCH_SCALE_SERVER
set -euo pipefail

BIN=${1:-bin/leasehold}
LEASES=${LEASES:-1000000}
CLIENTS=${CLIENTS:-64}
TTL=${TTL:-30m}
PORT=${PORT:-7720}
SERVER_ARGS=${SERVER_ARGS:-}
HTTP=127.0.0.1:$PORT
RAFT_ADDR=127.0.0.1:${RAFT_PORT:-$((PORT + 1))}
GOSSIP_ADDR=127.0.0.1:${GOSSIP_PORT:-$((PORT + 2))}
PPROF_ADDR=127.0.0.1:${PPROF_PORT:-$((PORT + 3))}
DIR=$(mktemp -d /tmp/leasehold-scale.XXXXXX)
pid=

cleanup() {
	if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [[ ${KEEP:-0} == 1 ]]; then echo "kept $DIR" >&2; else rm -rf "$DIR"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

start_server() {
	# shellcheck disable=SC2086
	"$BIN" server --node-id scale --data-dir "$DIR/data" --http-addr "$HTTP" \
		--raft-addr "$RAFT_ADDR" --gossip-addr "$GOSSIP_ADDR" \
		--log-level info --max-leases $((LEASES + 1000)) --pprof-addr "$PPROF_ADDR" $SERVER_ARGS >>"$DIR/server.log" 2>&1 &
	pid=$!
}

# wait_ready waits (up to 5 minutes) for /readyz and fails if the server died.
wait_ready() {
	local deadline=$((SECONDS + 300))
	until curl -sf "http://$HTTP/readyz" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "server exited; its log:" >&2
			tail -20 "$DIR/server.log" >&2
			exit 1
		fi
		if ((SECONDS > deadline)); then
			echo "server not ready after 5 minutes" >&2
			exit 1
		fi
		sleep 0.02
	done
}

rss_mib() { awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$pid/status"; }
# rss_parts prints the anonymous and file-backed (the Raft log's mmap) parts.
rss_parts() { awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 } END { printf "anon %.0f, file %.0f", a / 1024, f / 1024 }' "/proc/$pid/status"; }

# settled_rss waits for the RSS to stop falling (the collector and the
# scavenger returning memory; an idle server returns its free heap after
# a second without allocating), RSS_STILL (3) seconds in a row, at most
# 30 seconds, and prints it in MiB.
settled_rss() {
	local prev cur i still=0
	prev=$(rss_mib)
	for i in $(seq 1 30); do
		sleep 1
		cur=$(rss_mib)
		if ((cur >= prev - 2)); then
			still=$((still + 1))
			if ((still >= ${RSS_STILL:-3})); then break; fi
		else
			still=0
		fi
		prev=$cur
	done
	echo "$cur"
}

metric() { curl -sf "http://$HTTP/metrics" | awk -v m="$1" '$1 == m { printf "%.0f", $2 / 1048576 }'; }

mkdir -p "$DIR/data"
start_server
wait_ready

t0=$(now)
"$BIN" bench --addr "http://$HTTP" --workload fill --clients "$CLIENTS" --ttl "$TTL" \
	--max-ops "$LEASES" --duration 30m >"$DIR/fill.txt"
fill_s=$(elapsed "$t0" "$(now)")
filled=$(awk '$1 == "fill" { print $5 }' "$DIR/fill.txt")

gc() { curl -sf "http://$PPROF_ADDR/debug/pprof/heap?gc=1" -o "${1:-/dev/null}"; }
gc "${HEAP_OUT:-}"
rss=$(settled_rss)
rss_split=$(rss_parts)
heap=$(metric go_memstats_heap_inuse_bytes)

# Restart first, so that it replays what the log holds since the last
# automatic snapshot (a download takes a snapshot).
t0=$(now)
kill -TERM "$pid"
wait "$pid" 2>/dev/null || true
stop_s=$(elapsed "$t0" "$(now)")
echo "--- restart" >>"$DIR/server.log"
t0=$(now)
start_server
wait_ready
restart_s=$(elapsed "$t0" "$(now)")
gc
rss_restarted=$(settled_rss)
rss_restarted_split=$(rss_parts)

t0=$(now)
"$BIN" snapshot save --addr "http://$HTTP" "$DIR/snap.bin" >/dev/null
snap_s=$(elapsed "$t0" "$(now)")
snap_mib=$(du -m "$DIR/snap.bin" | cut -f1)
rm -f "$DIR/snap.bin"
rss_after_snap=$(rss_mib)

# What the restart did, from the server's log after the restart marker:
# restoring the snapshot, then (until ready) replaying the log and winning
# the election.
restart_log=$(sed -n '/^--- restart/,$p' "$DIR/server.log")
ts() { grep -m1 "$1" <<<"$restart_log" | sed -n 's/^time=\([^ ]*\).*/\1/p'; }
secs() { if [[ -n $1 ]]; then date -d "$1" +%s.%N; fi; }
r0=$(secs "$(ts 'starting restore from snapshot')")
r1=$(secs "$(ts 'restored from snapshot')")
won=$(secs "$(ts 'election won')")
ready=$(secs "$(ts 'ready: leader known')")
restore_s=? after_s=? election_s=?
if [[ -n $r0 && -n $r1 ]]; then restore_s=$(elapsed "$r0" "$r1"); fi
if [[ -n $r1 && -n $ready ]]; then after_s=$(elapsed "$r1" "$ready"); fi
if [[ -n $r1 && -n $won ]]; then election_s=$(elapsed "$r1" "$won"); fi
snap_index=$(grep -m1 -o 'restored from snapshot: id=[^ ]* last-index=[0-9]*' <<<"$restart_log" | sed 's/.*last-index=//' || true)

printf '%-32s %s\n' "leases filled" "$filled (in ${fill_s}s, $CLIENTS clients)" \
	"server RSS, after GC, settled" "${rss} MiB ($rss_split; Go heap in use ${heap:-?} MiB)" \
	"stop (SIGTERM to exit)" "${stop_s}s" \
	"restart to /readyz" "${restart_s}s" \
	"  snapshot restore" "${restore_s}s (snapshot at index ${snap_index:-none})" \
	"  restored -> ready" "${after_s}s (log replay + election; election won after ${election_s}s)" \
	"RSS after restart, GC, settled" "${rss_restarted} MiB ($rss_restarted_split)" \
	"snapshot download" "${snap_s}s (${snap_mib} MiB)" \
	"RSS after the download" "${rss_after_snap} MiB"
if [[ -n ${SERVER_LOG_OUT:-} ]]; then cp "$DIR/server.log" "$SERVER_LOG_OUT"; fi
endef
bench bench-scale-server: export BENCH_SCALE_SERVER_SH := $(value BENCH_SCALE_SERVER)

# Hostile load from clients with valid tokens (waiters, churn, listings,
# subscribers) against one in-memory node: reports whether the cluster clock
# keeps >= 0.9 of real time and a probe writer's p99 < 20 ms. Scale with
# LEASEHOLD_HOSTILE_WAITERS, _CHURN, _LISTERS, _SUBS (full scale by default).
hostile:
	LEASEHOLD_HOSTILE=1 $(GO) test -count=1 -run '^TestHostileLoad$$' -timeout 40m -v ./node/

# The same at a scale a shared CI machine carries (2,000 waiters, 5,000
# ended records, 10 listers, 50 subscribers), with bounds that only a
# regression like the one the load bounds fixed (0.53 of real time, a
# 789 ms p99) fails, not a busy machine: the full-scale targets (0.9, 20 ms)
# are `make hostile`'s, and not met at full scale here (docs/operations.md).
hostile-ci:
	LEASEHOLD_HOSTILE=1 LEASEHOLD_HOSTILE_WAITERS=2000 LEASEHOLD_HOSTILE_CHURN=5000 LEASEHOLD_HOSTILE_LISTERS=10 \
		LEASEHOLD_HOSTILE_SUBS=50 LEASEHOLD_HOSTILE_MIN_CLOCK=0.7 LEASEHOLD_HOSTILE_MAX_P99_MS=600 \
		$(GO) test -count=1 -run '^TestHostileLoad$$' -timeout 20m -v ./node/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Every fuzz target (found in the _test.go files) for FUZZTIME each; a
# failing input lands in that package's testdata/fuzz/ and stays a test case.
# Then the OpenAPI fuzz's long run (api/openapi_fuzz_test.go): OPENAPI_FUZZ_N
# requests generated from api/openapi.yaml (make test sends 1000); it prints
# its seed: replay with LEASEHOLD_OPENAPI_FUZZ_SEED=seed.
FUZZTIME ?= 10s
OPENAPI_FUZZ_N ?= 20000
fuzz:
	GO=$(GO) ./.ci/fuzz $(FUZZTIME)
	LEASEHOLD_OPENAPI_FUZZ_N=$(OPENAPI_FUZZ_N) $(GO) test -count=1 -timeout 60m -run '^TestOpenAPIFuzz$$' -v ./api/

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
