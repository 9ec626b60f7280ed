#!/usr/bin/env bash
# with-lock.sh: run a command while holding a redis-lock lock (like flock(1),
# across machines), with redis-cli.
#
#   with-lock.sh KEY TTL_MS WAIT_MS COMMAND [ARG...]
#
#   REDIS_CLI   how to reach the server (default: redis-cli), word-split, e.g.
#               REDIS_CLI="redis-cli -h 10.0.0.5 -p 6380 --user app --pass s3cret"
#
# - Waits in the server up to WAIT_MS (0: no limit) with LOCK.ACQUIRE ... WAIT.
# - The command gets LOCK_KEY, LOCK_OWNER and LOCK_TOKEN in its environment:
#   hand LOCK_TOKEN (the fencing token) to whatever it writes.
# - A watchdog renews the lease every TTL_MS/3 while the command runs; it is
#   stopped, and a renewal in flight finished, before the release, so no
#   renewal outlives the unlock.
# - If the lease is lost (a renewal answers 0: it expired or was DELeted), the
#   command is sent SIGTERM at once.
# - The lock is released when the command ends, also on Ctrl-C or SIGTERM.
#
# Exit status: the command's; 75 if the lock was not acquired within WAIT_MS;
# 76 if the lease was lost (the command may have been stopped part-way);
# 1 on a usage or server error (message on stderr).
set -uo pipefail

NOT_ACQUIRED=75
LEASE_LOST=76

die() { echo "with-lock: $*" >&2; exit 1; }
[ $# -ge 4 ] || die "usage: with-lock.sh KEY TTL_MS WAIT_MS COMMAND [ARG...]"
key=$1 ttl=$2 wait_ms=$3
shift 3
[[ $ttl =~ ^[1-9][0-9]*$ ]] || die "TTL_MS must be a positive integer: $ttl"
[[ $wait_ms =~ ^(0|[1-9][0-9]*)$ ]] || die "WAIT_MS must be an integer >= 0: $wait_ms"
read -r -a cli <<<"${REDIS_CLI:-redis-cli}"
owner="$(hostname 2>/dev/null || echo host)-$$-$(cat /proc/sys/kernel/random/uuid 2>/dev/null || echo "$RANDOM$RANDOM$RANDOM")"

now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

# Acquire: the token, or an empty line when the wait ran out.
sent=$(now_ms)
token=$("${cli[@]}" LOCK.ACQUIRE "$key" "$owner" "$ttl" WAIT "$wait_ms") \
  || die "cannot reach the server (${cli[*]})"
if [ -z "$token" ]; then
  echo "with-lock: $key not acquired within $wait_ms ms" >&2
  exit $NOT_ACQUIRED
fi
[[ $token =~ ^[0-9]+$ ]] || die "LOCK.ACQUIRE $key: $token"

dir=$(mktemp -d)
mkfifo "$dir/stop"

# The command, in the background so the watchdog can stop it (stdin kept).
LOCK_KEY=$key LOCK_OWNER=$owner LOCK_TOKEN=$token "$@" <&0 &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' INT TERM HUP

# The watchdog: renews every ttl/3 until the stop fifo is closed (EOF).
(
  trap - INT TERM HUP
  interval=$(printf '%d.%03d' $((ttl / 3000)) $((ttl / 3 % 1000)))
  valid_until=$((sent + ttl))
  while :; do
    read -r -t "$interval" _ <&3
    [ $? -gt 128 ] || exit 0 # EOF: stop now
    sent=$(now_ms)
    renewed=$("${cli[@]}" LOCK.RENEW "$key" "$owner" "$ttl" 2>/dev/null)
    if [ "$renewed" = 1 ]; then
      valid_until=$((sent + ttl))
    elif [ "$renewed" = 0 ] || [ "$(now_ms)" -ge "$valid_until" ]; then
      echo "LOCK.RENEW answered ${renewed:-nothing}" >"$dir/lost"
      kill -TERM "$pid" 2>/dev/null
      exit 0
    fi # else a transient error: try again at the next tick
  done
) 3<"$dir/stop" &
watchdog=$!
exec {stop}>"$dir/stop" # opens once the watchdog has the reading end

# Wait for the command (again if a signal interrupted the wait).
while :; do
  wait "$pid"
  status=$?
  kill -0 "$pid" 2>/dev/null || break
done

# Stop the watchdog, then release.
exec {stop}>&-
wait "$watchdog"
released=$("${cli[@]}" LOCK.RELEASE "$key" "$owner") || released=error
if [ -e "$dir/lost" ] || [ -z "$released" ]; then
  why=$(cat "$dir/lost" 2>/dev/null || echo "LOCK.RELEASE answered nil")
  echo "with-lock: lease on $key (token $token) lost: $why" >&2
  status=$LEASE_LOST
elif [ "$released" != 1 ]; then
  echo "with-lock: LOCK.RELEASE $key: $released (the lease ends at its ttl)" >&2
fi
rm -rf "$dir"
exit "$status"
