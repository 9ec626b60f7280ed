#!/usr/bin/env bash
# Runs the integration tests with every redis-server (and so the module) under
# valgrind memcheck, then summarizes what memcheck found.
#
#   scripts/valgrind.sh                 # every tests/*.rs but the soak
#   VALGRIND_TESTS="commands waiting" scripts/valgrind.sh
#
# How: the test harness (tests/common/mod.rs) starts `$REDIS_SERVER`; this
# points it at a wrapper that execs
#   valgrind --leak-check=full --error-exitcode=99 --log-file=<dir>/valgrind.%p.log redis-server "$@"
# (exec: the harness checks that the PID answering is its child's).
#
# redis-server is linked with jemalloc: `--soname-synonyms=somalloc=*jemalloc*`
# makes memcheck replace malloc/free in libjemalloc.so too, so every
# allocation (Redis's and the module's, which goes through RedisModule_Alloc)
# is tracked. Without it memcheck sees jemalloc's arenas as plain memory and
# finds next to nothing.
#
# A few reports from Redis itself are suppressed (see redis.supp below).
#
# Limits: the harness kills servers with SIGKILL when a test ends, and a killed
# process writes no leak summary; invalid reads/writes and uses of
# uninitialised memory are logged as they happen, so they are always caught.
# Servers that shut down cleanly (persistence tests, the live fuzz, which ends
# with SHUTDOWN NOSAVE) also get a leak check. Timing assertions may fail under
# valgrind (everything is ~30x slower): those failures are reported but are
# not memory errors.
#
# Environment: VALGRIND_DIR (default target/valgrind), VALGRIND_TESTS (test
# names, default all but soak), VALGRIND_TEST_THREADS (default 2),
# LIVE_FUZZ_COMMANDS (default here 30000). Exit status: 1 when memcheck found
# an error or a definite/indirect leak with a frame in the module, else 0;
# everything else is listed in the summary.
set -uo pipefail

cd "$(dirname "$0")/.."
root=$PWD
out=${VALGRIND_DIR:-$root/target/valgrind}
case $out in /*) ;; *) out=$root/$out ;; esac

command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 2; }
server=$(command -v redis-server) || { echo "redis-server is not installed"; exit 2; }

cargo build || exit 2

rm -rf "$out"
mkdir -p "$out/logs"

# Known reports from Redis itself, not the module:
# - lzf_compress reads its uninitialised hash table on purpose (Redis's own
#   src/valgrind.sup suppresses it);
# - the cluster bus code branches on, and sends, uninitialised bytes of its
#   messages;
# - a module whose OnLoad fails (the tests that pass bad loadmodule
#   arguments) is dlclose()d and redis-server exits at once: the data type
#   and the detached context created during the load are then unreferenced.
cat >"$out/redis.supp" <<'SUPP'
{
   redis-lzf-uninitialised-hash-table
   Memcheck:Cond
   fun:lzf_compress
}
{
   redis-lzf-uninitialised-hash-table-8
   Memcheck:Value8
   fun:lzf_compress
}
{
   redis-cluster-bus-uninitialised
   Memcheck:Cond
   fun:cluster*
}
{
   redis-cluster-bus-write-uninitialised
   Memcheck:Param
   write(buf)
   ...
   fun:clusterWriteHandler
}
{
   redis-failed-module-load-datatype
   Memcheck:Leak
   match-leak-kinds: definite,indirect
   ...
   fun:RM_CreateDataType
   ...
   fun:moduleLoad
}
{
   redis-failed-module-load-detached-context
   Memcheck:Leak
   match-leak-kinds: definite,indirect
   ...
   fun:RM_GetDetachedThreadSafeContext
   ...
   fun:moduleLoad
}
SUPP

wrapper=$out/redis-server
cat >"$wrapper" <<EOF
#!/bin/sh
exec valgrind --tool=memcheck --leak-check=full \\
    --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect \\
    --error-exitcode=99 --num-callers=40 \\
    --soname-synonyms=somalloc=*jemalloc* \\
    --suppressions=$out/redis.supp \\
    --log-file=$out/logs/valgrind.%p.log \\
    $server "\$@"
EOF
chmod +x "$wrapper"

if [ -n "${VALGRIND_TESTS:-}" ]; then
    tests=$VALGRIND_TESTS
else
    tests=$(ls tests/it/*.rs | xargs -n1 basename | sed 's/\.rs$//' | grep -vx 'soak\|main' | tr '\n' ' ')
fi
# One test binary (tests/it): each area is a filter on its module path.
targets=()
for t in $tests; do targets+=("$t::"); done

echo "== valgrind: tests: $tests"
echo "== valgrind: logs in $out/logs"
export REDIS_SERVER=$wrapper
export REDIS_LOCK_MODULE=$root/target/debug/libredis_lock.so
export REDIS_LOCK_TEST_STARTUP_SECS=${REDIS_LOCK_TEST_STARTUP_SECS:-180}
export LIVE_FUZZ_COMMANDS=${LIVE_FUZZ_COMMANDS:-30000}
start=$(date +%s)
cargo test --no-fail-fast --test it -- "${targets[@]}" --test-threads="${VALGRIND_TEST_THREADS:-2}" \
    >"$out/cargo-test.log" 2>&1
test_status=$?
elapsed=$(( $(date +%s) - start ))

# --- Summary -----------------------------------------------------------------
# Each memcheck record (an error or a leak, up to its blank line) is put in
# one class: "crash" when it comes from the memory test Redis runs in its
# crash report after an assertion (memtest scans all mapped memory: noise,
# but the assertion is a real failure, shown by the test that hit it),
# "module" when a frame is in the module (redis_lock), "redis" otherwise.
summary=$out/summary.txt
records=$out/records.txt
awk '
    FNR == 1 { file = FILENAME; sub(".*/", "", file) }
    {
        line = $0; sub(/^==[0-9]+== ?/, "", line)
        if (!inrec && line ~ /^(Invalid (read|write|free)|Mismatched free|Conditional jump|Use of uninitialised|Syscall param|Source and destination overlap|Argument .* of function|Jump to the invalid|.* (definitely|indirectly) lost in loss record)/) {
            inrec = 1; head = line; mod = 0; memtest = 0
            kind = (line ~ / lost in loss record/) ? "leak" : "error"
            next
        }
        if (inrec) {
            if (line == "") {
                gsub(/[0-9,]+ (\([^)]*\) )?bytes in [0-9,]+ blocks/, "N bytes in M blocks", head)
                sub(/ in loss record.*/, "", head)
                cls = memtest ? "crash" : (mod ? "module" : "redis")
                print cls "\t" kind "\t" file "\t" head
                inrec = 0
            } else if (line ~ /doFastMemoryTest/) {
                memtest = 1
            } else if (line ~ /redis_lock/) {
                mod = 1
            }
        }
    }
' "$out"/logs/valgrind.*.log >"$records" 2>/dev/null
count() { awk -F'\t' -v c="$1" -v k="$2" '$1 == c && $2 == k' "$records" | wc -l; }
n=$(ls "$out"/logs/valgrind.*.log 2>/dev/null | wc -l)
clean_exit=$(grep -l 'ERROR SUMMARY' "$out"/logs/valgrind.*.log 2>/dev/null | wc -l)
module_errors=$(count module error); module_leaks=$(count module leak)
{
    echo "valgrind memcheck over: $tests"
    echo "cargo test exit status: $test_status, ${elapsed}s (failures under valgrind: see below; timing ones are expected)"
    grep -E '^test result:|^test .* FAILED$' "$out/cargo-test.log" | sed 's/^/  /'
    echo "server processes: $n; exited cleanly (leak-checked): $clean_exit; killed by the harness: $((n - clean_exit))"
    echo "records with a frame in the module: $module_errors error(s), $module_leaks leak(s)"
    echo "records from Redis itself: $(count redis error) error(s), $(count redis leak) leak(s)"
    echo "records from Redis's crash-report memtest: $(count crash error) (in $(awk -F'\t' '$1 == "crash"' "$records" | cut -f3 | sort -u | wc -l) server(s) that hit an assertion)"
    echo "distinct records (class, kind, first line):"
    cut -f1,2,4 "$records" | sort | uniq -c | sort -rn | sed 's/^/  /'
    echo "per log:"
    cut -f1,3 "$records" | sort | uniq -c | sed 's/^/  /'
    echo "leak summaries of the cleanly exited servers:"
    grep -h -A2 'LEAK SUMMARY' "$out"/logs/valgrind.*.log 2>/dev/null | grep -E 'definitely|indirectly' \
        | sed -E 's/^==[0-9]+== +//' | sort | uniq -c | sed 's/^/  /'
} >"$summary"
cat "$summary"
echo "== valgrind: summary in $summary, records in $records, logs in $out/logs"
if [ "$module_errors" -gt 0 ] || [ "$module_leaks" -gt 0 ]; then
    exit 1
fi
exit 0
