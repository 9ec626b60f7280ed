#!/usr/bin/env bash
# Instructions and instruction-cache misses per request under the throughput
# section's load (50 connections x pipeline 16, unique keys), from
# callgrind's cache simulation (32 KiB 8-way L1i, as the bench machine's
# cores): LOCK.ACQUIRE, the module API's floor (FLOOR.SET) and SET NX PX
# with the module loaded, and SET NX PX on a server without it. Counts, not
# times: a busy machine does not move them. `make bench-icache`; about two
# minutes. REDIS_SERVER picks the server (default: redis-server on PATH),
# REDIS_LOCK_MODULE the module (default: the release build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SERVER=${REDIS_SERVER:-redis-server}
MODULE=${REDIS_LOCK_MODULE:-$ROOT/target/release/libredis_lock.so}
REQUESTS=${ICACHE_REQUESTS:-50000}
WARMUP=20000
OWNER=8c1f6a52-3d47-4b8e-9f10-5a7e2c9d0b31
OUT=$ROOT/target/lockbench/icache
rm -rf "$OUT"
mkdir -p "$OUT"

for tool in valgrind callgrind_control redis-cli redis-benchmark cc; do
    command -v "$tool" >/dev/null || { echo "icache: $tool is missing (make deps)" >&2; exit 1; }
done
[ -f "$MODULE" ] || { echo "icache: $MODULE is missing (make release)" >&2; exit 1; }

# The C reference module, as the bench builds it (its header is the
# redis-module crate's).
header=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -path '*redis-module-2.0.*' \
    -name redismodule.h -printf '%h\n' 2>/dev/null | sort | tail -1)
[ -n "$header" ] || { echo "icache: redismodule.h not found (cargo fetch)" >&2; exit 1; }
cc -O2 -shared -fPIC -Wall -Wextra -Werror -I "$header" -o "$OUT/lockfloor.so" \
    "$ROOT/benches/cmodule/lockfloor.c"

free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 20000))
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
    done
}

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# start <name> [module arguments...]: a server under callgrind; sets PORT, PID.
start() {
    local name=$1
    shift
    local dir=$OUT/$name
    mkdir -p "$dir"
    PORT=$(free_port)
    valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file="$dir/callgrind.out" \
        "$SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$dir" --save "" \
        --appendonly no --hz 1 "$@" >"$dir/server.log" 2>&1 &
    PID=$!
    PIDS+=("$PID")
    for _ in $(seq 1 120); do
        redis-cli -p "$PORT" PING >/dev/null 2>&1 && return
        sleep 0.5
    done
    echo "icache: the $name server did not start ($dir/server.log)" >&2
    exit 1
}

# measure <label> <server> <dump> <command...>: warm up, zero the counters,
# run, dump; one Markdown row.
measure() {
    local label=$1 dir=$OUT/$2 name=$3
    shift 3
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    redis-benchmark -p "$PORT" -c 50 -P 16 -n "$WARMUP" -r 1000000000 -q "$@" >/dev/null
    redis-cli -p "$PORT" FLUSHALL >/dev/null
    callgrind_control -z "$PID" >/dev/null 2>&1
    redis-benchmark -p "$PORT" -c 50 -P 16 -n "$REQUESTS" -r 1000000000 -q "$@" >/dev/null
    callgrind_control -d "$name" "$PID" >/dev/null 2>&1
    local dump=
    for _ in $(seq 1 60); do
        dump=$(grep -l "^desc: Trigger: dump $name\$" "$dir"/callgrind.out.* 2>/dev/null) && break
        sleep 0.5
    done
    [ -n "$dump" ] || { echo "icache: no dump for $name in $dir" >&2; exit 1; }
    awk -v n="$REQUESTS" -v label="$label" '/^totals:/ {
        printf "| %s | %.0f | %.1f | %.1f |\n", label, $2 / n, $5 / n, $6 / n }' "$dump"
}

echo "#### Instruction-cache misses per request (callgrind --cache-sim, $REQUESTS requests, 50 connections x pipeline 16, unique keys)"
echo
echo "- server: $("$SERVER" --version | head -1)"
echo
echo "| command | instructions/request | L1i misses/request | L1d read misses/request |"
echo "| --- | ---: | ---: | ---: |"
start plain
measure "\`SET k v NX PX 3600000\`, no module" plain set SET "lk:__rand_int__" "$OWNER" NX PX 3600000
start module --loadmodule "$MODULE" --loadmodule "$OUT/lockfloor.so" floor-only
measure "\`LOCK.ACQUIRE k o 3600000\`" module lock-acquire LOCK.ACQUIRE "lk:__rand_int__" "$OWNER" 3600000
measure "\`FLOOR.SET k v 3600000\` (the API's floor)" module floor-set FLOOR.SET "lk:__rand_int__" "$OWNER" 3600000
measure "\`SET k v NX PX 3600000\`, module loaded" module set SET "lk:__rand_int__" "$OWNER" NX PX 3600000
