// A stalled server stalls nothing else. Three servers (STALL_PORTS), the
// third's process id in STALL_PID: locks on each (ioredis bound and through
// the client, node-redis bound), then the third server is SIGSTOPped for
// three lease lengths (SIGCONT at the end, whatever happens). The locks on
// the other two are kept; the stalled server's are reported lost within a
// lease; every call on the stalled server returns within its timeout. Then
// the third server is killed (SIGKILL) under bound locks: told at once (by the
// connection's end, long before the next keepalive; the time is printed).
// Prints one line per test and "N passed, M failed".
import { Redis } from "ioredis";
import { createClient } from "redis";
import { LeaseLostError, Lock, LockTimeoutError } from "redis-native-lock";

const ports = (process.env.STALL_PORTS ?? "").split(",").map(Number);
const pid = Number(process.env.STALL_PID);
const TTL = 3000;
// How late a timer may run on a loaded machine (both cores busy): the bounds below are the package's
// (a call ends at its timeout, a lease is told lost by its end), not a figure.
const SLACK = 1500;
const TIMEOUT = 1000; // the clients' connect timeout, which the package takes as its command timeout
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let passed = 0;
let failed = 0;

function check(cond: unknown, what: string): void {
  if (cond) {
    passed++;
    console.log(`ok   ${what}`);
  } else {
    failed++;
    console.log(`FAIL ${what}`);
  }
}

async function timedCall(what: string, limit: number, f: () => Promise<unknown>): Promise<unknown> {
  const t0 = Date.now();
  let outcome: unknown;
  try {
    outcome = await Promise.race([f(), sleep(limit + SLACK + 2000).then(() => "HUNG")]);
  } catch (e) {
    outcome = e;
  }
  const took = Date.now() - t0;
  check(outcome !== "HUNG" && took <= limit + SLACK, `${what} returned within ${limit} ms (${took} ms: ${outcome})`);
  return outcome;
}

async function main(): Promise<void> {
  if (ports.length !== 3 || !pid) throw new Error("STALL_PORTS (3) and STALL_PID are needed");
  const ios = ports.map((p) => new Redis(p, "127.0.0.1", { connectTimeout: TIMEOUT }));
  const nrs = ports.map((p) => createClient({ url: `redis://127.0.0.1:${p}`, socket: { connectTimeout: TIMEOUT } }));
  ios.forEach((c) => c.on("error", () => {}));
  nrs.forEach((c) => c.on("error", () => {}));
  await Promise.all(nrs.map((c) => c.connect()));

  const lostAt: number[][] = [[], [], []];
  const locks = ports.map((_, i) => {
    const onLost = (j: number) => () => (lostAt[i][j] = Date.now());
    return [
      Lock.exclusive(ios[i], `stall-io-bound-${i}`, { ttl: TTL, onLost: onLost(0) }),
      Lock.exclusive(ios[i], `stall-io-renew-${i}`, { ttl: TTL, bind: false, onLost: onLost(1) }),
      Lock.exclusive(nrs[i], `stall-nr-bound-${i}`, { ttl: TTL, onLost: onLost(2) }),
    ];
  });
  for (const ls of locks) for (const l of ls) if (!(await l.acquire())) throw new Error("not granted");

  process.kill(pid, "SIGSTOP");
  const stoppedAt = Date.now();
  try {
    // Calls on the stalled server meanwhile: each returns within its timeout.
    const during = [
      timedCall("a new bound lock's acquire() on the stalled server (ioredis)", TIMEOUT, () => Lock.exclusive(ios[2], "stall-new").acquire()),
      timedCall("a new bound lock's acquire(500) on the stalled server (node-redis)", TIMEOUT + 500, () => Lock.exclusive(nrs[2], "stall-new").acquire(500)),
      timedCall("an unbound acquire(0) on the stalled server", TIMEOUT, () => Lock.exclusive(ios[2], "stall-new2", { bind: false }).acquire(0)),
      timedCall("locked() on the stalled server", TIMEOUT, () => locks[2][0].locked()),
    ];
    await sleep(3 * TTL);
    await Promise.all(during);
    for (const i of [0, 1]) {
      for (const [j, l] of locks[i].entries()) {
        check(!l.lost && lostAt[i][j] === undefined && (await l.owned()), `server ${i} lock ${j} kept for 3 lease lengths`);
      }
    }
    for (const [j, l] of locks[2].entries()) {
      const when = lostAt[2][j];
      check(l.lost && when !== undefined && when - stoppedAt <= TTL + SLACK, `the stalled server's lock ${j} reported lost within a lease (${when === undefined ? "never" : when - stoppedAt} ms)`);
      const e = await timedCall(`release() of the stalled server's lock ${j}`, TIMEOUT, () => l.release());
      check(e instanceof LeaseLostError, `release() of the stalled server's lock ${j} throws LeaseLostError (${e})`);
    }
    const e = await timedCall("extend() of a kept lock", TIMEOUT, () => locks[0][0].extend());
    check(e === undefined, `extend() of a kept lock succeeds (${e})`);
    const e2 = await timedCall("an unbound acquire(0) on the stalled server, again", TIMEOUT, () => Lock.exclusive(nrs[2], "stall-new3", { bind: false }).acquire(0));
    check(e2 instanceof LockTimeoutError, `it is a LockTimeoutError (${e2})`);
  } finally {
    process.kill(pid, "SIGCONT");
  }
  // Then the third server killed (kill -9) under bound locks of both clients: each holder told at once.
  const killed: Lock[] = [];
  const killedLost: number[] = [];
  const killedWhy: string[] = [];
  for (const [j, c] of [ios[2], nrs[2]].entries()) {
    const l = Lock.exclusive(c, `stall-killed-${j}`, {
      ttl: 30_000, // a keepalive every 10 s
      onLost: (why) => {
        killedLost[j] = Date.now();
        killedWhy[j] = why;
      },
    });
    // The continued server answers again (its clients may have timed out meanwhile).
    for (let i = 0; i < 50; i++) {
      try {
        if (await l.acquire()) break;
      } catch {
        await sleep(100);
      }
    }
    check(l.held && l.bound, `a bound lock on the continued server (${j ? "node-redis" : "ioredis"})`);
    killed.push(l);
  }
  const killedAt = Date.now();
  process.kill(pid, "SIGKILL");
  for (let i = 0; i < 500 && killedLost.filter((t) => t !== undefined).length < 2; i++) await sleep(10);
  for (const [j, l] of killed.entries()) {
    const took = killedLost[j] === undefined ? "never" : `${killedLost[j] - killedAt} ms`;
    console.log(`     ${j ? "node-redis" : "ioredis"}: a bound lock on a server killed (kill -9) told after ${took}`);
    check(l.lost && /connection the lock was bound to/.test(killedWhy[j] ?? ""), `the killed server's bound lock told by its connection's end, not a renewal (${took}: ${killedWhy[j]})`);
  }
  for (const i of [0, 1]) for (const l of locks[i]) await l.release();
  ios.forEach((c) => c.disconnect());
  await Promise.all(nrs.map((c) => c.disconnect().catch(() => {})));
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL main: ${e?.stack ?? e}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
