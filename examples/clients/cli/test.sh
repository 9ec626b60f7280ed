#!/usr/bin/env bash
# Tests of with-lock.sh against a real server with the module.
#
#   bash test.sh PORT      (server on 127.0.0.1:PORT)
#
# Run by tests/it/clients.rs (`make test`). Prints one line per test, then
# "N passed, M failed"; exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")"
PORT=$1
export REDIS_CLI="redis-cli -h 127.0.0.1 -p $PORT"
r() { $REDIS_CLI "$@"; }
WITH_LOCK=$PWD/with-lock.sh
passed=0 failed=0

fail() { echo "  $*" >&2; return 1; }
run() {
  local name=$1
  if ( set -e; "$name" ); then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name"
  fi
}
renew_calls() { r INFO commandstats | sed -n 's/^cmdstat_lock\.renew:calls=\([0-9]*\).*/\1/p' | grep . || echo 0; }

holds_the_lock_and_passes_the_token() {
  out=$("$WITH_LOCK" sh:basic 10000 1000 bash -c \
    'echo "$LOCK_TOKEN"; redis-cli -h 127.0.0.1 -p '"$PORT"' LOCK.INFO sh:basic | sed -n 4p') \
    || fail "exit $?"
  token=$(echo "$out" | sed -n 1p) owner=$(echo "$out" | sed -n 2p)
  [[ $token =~ ^[0-9]+$ ]] || fail "LOCK_TOKEN: $token"
  [[ $owner == *-* ]] || fail "holder while the command ran: $owner"
  [ -z "$(r LOCK.INFO sh:basic)" ] || fail "not released"
}

returns_the_commands_exit_status() {
  status=0
  "$WITH_LOCK" sh:status 10000 1000 bash -c 'exit 7' || status=$?
  [ $status -eq 7 ] || fail "status $status"
  [ -z "$(r LOCK.INFO sh:status)" ] || fail "not released"
}

waits_in_the_server_until_the_lease_expires() {
  first=$(r LOCK.ACQUIRE sh:wait holder 300)
  out=$("$WITH_LOCK" sh:wait 10000 10000 printenv LOCK_TOKEN) || fail "exit $?"
  [ "$out" -gt "$first" ] || fail "token $out after $first"
}

a_wait_running_out_exits_75() {
  r LOCK.ACQUIRE sh:busy holder 30000 >/dev/null
  status=0
  "$WITH_LOCK" sh:busy 1000 100 touch "$TMP/ran" 2>/dev/null || status=$?
  [ $status -eq 75 ] || fail "status $status"
  [ ! -e "$TMP/ran" ] || fail "the command ran"
  [ "$(r LOCK.RELEASE sh:busy holder)" = 1 ] || fail "holder lost its lock"
}

the_watchdog_keeps_the_lease_and_stops_at_release() {
  before=$(renew_calls)
  "$WITH_LOCK" sh:long 900 1000 bash -c '
    for i in 1 2 3 4; do
      sleep 0.3
      [ "$(redis-cli -h 127.0.0.1 -p '"$PORT"' LOCK.INFO sh:long | sed -n 4p)" = "$LOCK_OWNER" ] || exit 9
    done' || fail "exit $?"
  after=$(renew_calls)
  [ $((after - before)) -ge 2 ] || fail "only $((after - before)) renewals"
  sleep 0.7 # two watchdog intervals
  [ "$(renew_calls)" = "$after" ] || fail "a renewal was sent after the release"
  [ -z "$(r LOCK.INFO sh:long)" ] || fail "not released"
}

a_lost_lease_stops_the_command_and_exits_76() {
  status=0
  "$WITH_LOCK" sh:lost 300 1000 bash -c '
    redis-cli -h 127.0.0.1 -p '"$PORT"' DEL sh:lost >/dev/null
    redis-cli -h 127.0.0.1 -p '"$PORT"' LOCK.ACQUIRE sh:lost successor 10000 >/dev/null
    sleep 5; touch "$0"' "$TMP/ran-to-the-end" 2>"$TMP/err" || status=$?
  [ $status -eq 76 ] || fail "status $status"
  grep -q "lease on sh:lost (token [0-9]*) lost: LOCK.RENEW answered 0" "$TMP/err" \
    || fail "message: $(cat "$TMP/err")"
  [ ! -e "$TMP/ran-to-the-end" ] || fail "the command was not stopped"
  [ "$(r LOCK.INFO sh:lost | sed -n 4p)" = successor ] || fail "the successor's lock was touched"
}

the_fencing_token_rejects_the_stale_write() {
  status=0
  store=$TMP/store
  # A protected write: refused if its token is older than the last one seen.
  cat >"$TMP/write" <<'EOF'
#!/usr/bin/env bash
last=$(cat "$1.token" 2>/dev/null || echo 0)
[ "$LOCK_TOKEN" -ge "$last" ] || exit 1
echo "$LOCK_TOKEN" >"$1.token"; echo "$2" >"$1"
EOF
  chmod +x "$TMP/write"
  "$WITH_LOCK" sh:fence 10000 1000 bash -c '
    "$0" "$1" "from a"
    redis-cli -h 127.0.0.1 -p '"$PORT"' DEL sh:fence >/dev/null   # a stalls, loses the lock
    "'"$WITH_LOCK"'" sh:fence 10000 1000 "$0" "$1" "from b" || exit 8
    "$0" "$1" "late from a" && exit 9
    exit 0' "$TMP/write" "$store" 2>/dev/null || status=$?
  [ $status -eq 76 ] || fail "status $status"
  [ "$(cat "$store")" = "from b" ] || fail "store: $(cat "$store")"
}

TMP=$(mktemp -d)
export TMP
trap 'rm -rf "$TMP"' EXIT
for t in holds_the_lock_and_passes_the_token returns_the_commands_exit_status \
  waits_in_the_server_until_the_lease_expires a_wait_running_out_exits_75 \
  the_watchdog_keeps_the_lease_and_stops_at_release a_lost_lease_stops_the_command_and_exits_76 \
  the_fencing_token_rejects_the_stale_write; do
  run "$t"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
