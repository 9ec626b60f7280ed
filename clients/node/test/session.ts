// Sessions (LOCK.SESSION) as a user gets them: with ioredis and node-redis,
// against a single server (REDIS_LOCK_PORT) and a 3-master cluster
// (REDIS_LOCK_CLUSTER_PORT, when given). Many locks renewed by one
// keepalive; the fault test (every connection of the holder killed every
// 100 ms: none lost; the same with BIND: all lost at the first kill); a
// session ended from outside (CLOSE, or a server that does not answer past
// the ttl); close() and the end of an `await using` scope. Prints one line
// per test and "N passed, M failed". FAULT_LOCKS (default 1000) and
// FAULT_MS (default 6000) size the fault test; ONLY (ioredis or node-redis)
// runs one client library's single-server tests.
import { Redis, Cluster } from "ioredis";
import { createClient, createCluster } from "redis";
import { LeaseLostError, Lock, LockError, RedisClient, Session } from "redis-native-lock";

const port = Number(process.env.REDIS_LOCK_PORT);
const clusterPort = Number(process.env.REDIS_LOCK_CLUSTER_PORT);
const faultLocks = Number(process.env.FAULT_LOCKS ?? 1000);
const faultMs = Number(process.env.FAULT_MS ?? 6000);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let passed = 0;
let failed = 0;

function assert(cond: unknown, what: string): void {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}

async function test(name: string, f: () => Promise<void>): Promise<void> {
  const started = Date.now();
  try {
    await f();
    passed++;
    console.log(`ok   ${name} (${Date.now() - started} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${(e as Error)?.stack ?? e}`);
  }
}

const tag = () => `{${Math.random().toString(36).slice(2, 10)}}`;

/** Polls `cond` every 20 ms for up to `ms`; whether it became true. */
async function until(cond: () => boolean, ms: number): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(20)) if (cond()) return true;
  return cond();
}

type Lib = "ioredis" | "node-redis";

/** Until an ioredis client is ready (its ready check answered): a MONITOR
 * set up while another connection's first commands are in flight can read
 * one of them as a reply (ioredis's "Command queue state error"). */
async function ready(c: Redis): Promise<void> {
  if (c.status !== "ready") await new Promise((r) => c.once("ready", r));
}

/** A client of the single server named `name` (CLIENT SETNAME at each connect), reconnecting as the library does by default. */
async function named(lib: Lib, name: string): Promise<RedisClient & { close(): Promise<void> }> {
  if (lib === "ioredis") {
    const c = new Redis(port, "127.0.0.1", { connectionName: name });
    c.on("error", () => {});
    await ready(c);
    return Object.assign(c, { close: async () => c.disconnect() });
  }
  const c = createClient({ url: `redis://127.0.0.1:${port}`, name });
  c.on("error", () => {});
  await c.connect();
  return Object.assign(c, {
    close: async () => {
      await c.disconnect().catch(() => {});
    },
  }) as unknown as RedisClient & { close(): Promise<void> };
}

/** Kills every connection named `name` (CLIENT LIST), from `admin`'s own connection; how many. */
async function killAll(admin: Redis, name: string): Promise<number> {
  const list = String(await admin.call("CLIENT", "LIST", "TYPE", "normal"));
  const ids = list
    .split("\n")
    .filter((l) => l.includes(` name=${name} `))
    .map((l) => /id=(\d+)/.exec(l)?.[1])
    .filter((id): id is string => id !== undefined);
  await Promise.all(ids.map((id) => admin.call("CLIENT", "KILL", "ID", id).catch(() => 0)));
  return ids.length;
}

async function singleServer(lib: Lib): Promise<void> {
  const admin = new Redis(port, "127.0.0.1");
  await ready(admin);

  await test(`${lib}: many locks in one Session: one LOCK.SESSION KEEPALIVE renews them all, no LOCK.RENEW; grants carry SESSION id and no BIND; release carries TOKEN`, async () => {
    const client = await named(lib, `many${tag()}`);
    // No ready check (INFO) on the monitor's connection nor its base's: an
    // INFO seen as a monitor line while the monitor's own awaits its reply
    // is ioredis's "Command queue state error".
    const base = new Redis(port, "127.0.0.1", { enableReadyCheck: false });
    const mon = await base.monitor();
    const seen: string[][] = [];
    mon.on("monitor", (_time: string, args: string[]) => seen.push(args));
    const t = tag();
    // A ttl a loaded machine keeps through its renewals (a third of it apart).
    const session = new Session(client, { ttl: 2500 });
    const locks: Lock[] = [];
    for (let i = 0; i < 40; i++) locks.push(Lock.exclusive(client, `${t}x${i}`, { session, ttl: 2500 }));
    locks.push(Lock.reentrant(client, `${t}r`, { session }), Lock.read(client, `${t}rw`, { session }), Lock.semaphore(client, `${t}s`, 3, { session }));
    locks.push(Lock.multi(client, [`${t}m1`, `${t}m2`], { session }));
    const granted = await Promise.all(locks.map((l) => l.acquire()));
    assert(granted.every(Boolean), "every lock granted");
    const id = session.ids.get("");
    assert(typeof id === "number" && session.ids.size === 1, `one session opened: ${[...session.ids]}`);
    assert(locks.every((l) => !l.bound), "none bound");
    const begin = seen.length;
    await sleep(5200); // more than twice the ttl
    assert(locks.every((l) => l.held && !l.lost), "all held past two ttls");
    assert((await Promise.all(locks.map((l) => l.owned()))).every(Boolean), "the server says each is held under its token");
    const e = await locks[0].extend().then(() => null, (x: unknown) => x);
    assert(e instanceof LockError, `extend() of a session lock is refused: ${e}`);
    for (const l of locks) await l.release();
    await sleep(50);
    mon.disconnect();
    base.disconnect();
    const mine = (a: string[]) => a.some((x) => x.startsWith(t));
    const renews = seen.filter((a) => a[0].toUpperCase() === "LOCK.RENEW" && mine(a)).length;
    const keepalives = seen.slice(begin).filter((a) => a[0].toUpperCase() === "LOCK.SESSION" && a[1].toUpperCase() === "KEEPALIVE" && a[2] === String(id)).length;
    assert(renews === 0, `no LOCK.RENEW for session locks (saw ${renews})`);
    assert(keepalives >= 3 && keepalives < locks.length, `one keepalive per tick for ${locks.length} locks (saw ${keepalives} in 5.2 s at a tick of a third of the ttl)`);
    const grants = seen.filter((a) => /^LOCK\.(ACQUIRE|RACQUIRE|READ|SEMAPHORE|MACQUIRE)$/i.test(a[0]) && mine(a));
    assert(grants.length === locks.length && grants.every((a) => a.includes("SESSION") && a[a.indexOf("SESSION") + 1] === String(id) && !a.includes("BIND")), "each grant: SESSION id, no BIND");
    const x0 = locks[0];
    assert(seen.some((a) => JSON.stringify(a) === JSON.stringify(["LOCK.RELEASE", `${t}x0`, String(x0.owner), "TOKEN", String(x0.token)])), "release: LOCK.RELEASE key owner TOKEN t");
    assert((await session.close()) === 0, "nothing left to close");
    await client.close();
  });

  await test(`${lib}: ${faultLocks} locks in a Session survive every connection of the holder killed every 100 ms for ${faultMs} ms; with BIND they are all lost at the first kill`, async () => {
    const name = `fault${tag()}`.replace(/[{}]/g, "");
    const client = await named(lib, name);
    const t = tag();
    let lostCalls = 0;
    let why = "";
    // A ttl of 3 s: some 30 kills per ttl, and room for a loaded machine's slow replies.
    const session = new Session(client, { ttl: 3000, onLost: (_l, w) => ((why = w), lostCalls++) });
    const locks = Array.from({ length: faultLocks }, (_, i) => Lock.exclusive(client, `${t}f${i}`, { session }));
    assert((await Promise.all(locks.map((l) => l.acquire()))).every(Boolean), "all granted");
    const tokens = locks.map((l) => l.token);
    let kills = 0;
    let rounds = 0;
    for (const end = Date.now() + faultMs; Date.now() < end; await sleep(100)) {
      kills += await killAll(admin, name);
      rounds++;
    }
    console.log(`     ${lib}: ${kills} connections of the holder killed in ${rounds} rounds, ${faultLocks} session locks`);
    await sleep(300);
    assert(lostCalls === 0 && locks.every((l) => l.held && !l.lost), `none lost (${locks.filter((l) => l.lost).length} lost, ${lostCalls} callbacks: ${why}; the last keepalive failure: ${session.lastError})`);
    const owned = await Promise.all(locks.map((l) => l.owned()));
    assert(owned.every(Boolean), `all held on the server under their tokens (${owned.filter((o) => !o).length} not)`);
    assert(locks.every((l, i) => l.token === tokens[i]), "the same tokens");
    // A round finds no connection while the client is still reconnecting (ioredis 6 waits longer between tries).
    assert(kills >= rounds / 4, `the holder's connections were killed again and again (${kills} kills in ${rounds} rounds)`);
    for (const l of locks) await l.release();
    await session.close();
    await client.close();

    // The same with BIND (no session): each lock bound to a connection of its own; one kill ends them all.
    const bname = `bind${tag()}`.replace(/[{}]/g, "");
    const bclient = await named(lib, bname);
    const n = Math.min(faultLocks, 200);
    const bound = Array.from({ length: n }, (_, i) => Lock.exclusive(bclient, `${t}b${i}`, { ttl: 30_000 }));
    assert((await Promise.all(bound.map((l) => l.acquire()))).every(Boolean), "all granted, bound");
    assert(bound.every((l) => l.bound), "bound");
    assert((await killAll(admin, bname)) >= n, "the first kill closes every bound connection");
    assert(await until(() => bound.every((l) => l.lost), 5000), `all lost at the first kill (${bound.filter((l) => !l.lost).length} not)`);
    const infos = await Promise.all(bound.map((_, i) => admin.call("LOCK.INFO", `${t}b${i}`)));
    assert(infos.every((i) => i === null), "the server freed them all");
    await bclient.close();
  });

  await test(`${lib}: a session closed from outside: every lock lost, onLost once per lock (the lock's and the session's), the next lock opens a new session`, async () => {
    const client = await named(lib, `out${tag()}`);
    const t = tag();
    const perSession = new Map<Lock, number>();
    const session = new Session(client, { ttl: 3000, onLost: (l) => perSession.set(l, (perSession.get(l) ?? 0) + 1) });
    const perLock = new Map<number, number>();
    const locks = Array.from({ length: 20 }, (_, i) => Lock.exclusive(client, `${t}o${i}`, { session, onLost: () => perLock.set(i, (perLock.get(i) ?? 0) + 1) }));
    assert((await Promise.all(locks.map((l) => l.acquire()))).every(Boolean), "granted");
    const id = session.ids.get("") as number;
    assert(Number(await admin.call("LOCK.SESSION", "CLOSE", id)) === 20, "CLOSE ended the 20 holders");
    assert(await until(() => locks.every((l) => l.lost), 6000), "all lost (found by the next keepalive)");
    await sleep(1200); // more keepalive ticks: nothing is told twice
    assert(locks.every((l, i) => perLock.get(i) === 1 && perSession.get(l) === 1), "each callback once per lock");
    assert(locks.every((l) => l.signal.aborted), "signals aborted");
    const r = await locks[0].release().then(() => null, (e: unknown) => e);
    assert(r instanceof LeaseLostError, `release() of a lost session lock: LeaseLostError (${r})`);
    const again = Lock.exclusive(client, `${t}again`, { session });
    assert(await again.acquire(), "a later lock on the same Session");
    const id2 = session.ids.get("");
    assert(typeof id2 === "number" && id2 !== id, `in a new session (${id} -> ${id2})`);
    await again.release();
    await session.close();
    await client.close();
  });

  await test(`${lib}: a session whose keepalives go unanswered past its ttl (CLIENT PAUSE): every lock lost at the deadline, before the server answers again`, async () => {
    const client = await named(lib, `pause${tag()}`);
    const t = tag();
    const perLock = new Map<number, number>();
    let perSession = 0;
    const session = new Session(client, { ttl: 600, onLost: () => perSession++ });
    const locks = Array.from({ length: 20 }, (_, i) => Lock.exclusive(client, `${t}p${i}`, { session, onLost: () => perLock.set(i, (perLock.get(i) ?? 0) + 1) }));
    assert((await Promise.all(locks.map((l) => l.acquire()))).every(Boolean), "granted");
    const pauser = new Redis(port, "127.0.0.1");
    await pauser.call("CLIENT", "PAUSE", 4000, "ALL");
    const pausedAt = Date.now();
    const allLost = await until(() => locks.every((l) => l.lost && perLock.get(locks.indexOf(l)) === 1), 3000);
    const told = Date.now();
    await pauser.call("CLIENT", "UNPAUSE");
    pauser.disconnect();
    assert(allLost && told - pausedAt < 4000, `all lost and told while the server was paused (${locks.filter((l) => !l.lost).length} not)`);
    assert(perSession === 20, `the session's onLost once per lock (${perSession})`);
    assert(session.ids.size === 0, "the session is ended here");
    // The best-effort CLOSE sent at the deadline frees them once the server answers.
    let free = false;
    for (let i = 0; i < 100 && !free; i++, await sleep(50)) free = (await Promise.all(locks.map((_, j) => admin.call("LOCK.INFO", `${t}p${j}`)))).every((x) => x === null);
    assert(free, "freed on the server");
    await session.close();
    await client.close();
  });

  await test(`${lib}: close() ends the session's locks on the server (a waiter is granted), reported released; an await using scope closes it`, async () => {
    const client = await named(lib, `close${tag()}`);
    const t = tag();
    let told = 0;
    const session = new Session(client, { ttl: 30_000, onLost: () => told++ });
    const a = Lock.exclusive(client, `${t}c`, { session, onLost: () => told++ });
    const b = Lock.exclusive(client, `${t}d`, { session });
    assert((await a.acquire()) && (await b.acquire()), "held");
    const waiter = Lock.exclusive(admin, `${t}c`);
    const waiting = waiter.acquire(10_000);
    await sleep(100);
    assert((await session.close()) === 2, "CLOSE ended both holders");
    assert(await waiting, "the waiter is granted");
    await waiter.release();
    assert(!a.held && !a.lost && !a.signal.aborted && told === 0, "reported released, not lost");
    await a.release(); // nothing left to do
    const e = await Lock.exclusive(client, `${t}e`, { session })
      .acquire()
      .then(() => null, (x: unknown) => x);
    assert(e instanceof LockError, `a lock on a closed Session is refused: ${e}`);
    let id = 0;
    {
      await using s = new Session(client);
      const l = Lock.exclusive(client, `${t}u`, { session: s });
      assert(await l.acquire(), "held in the scope");
      id = s.ids.get("") as number;
    }
    assert((await admin.call("LOCK.SESSION", "INFO", id)) === null, "the session is closed at the end of the scope");
    assert(await Lock.exclusive(admin, `${t}u`).acquire(), "its lock is free");
    await client.close();
  });

  admin.disconnect();
}

async function clusterTests(): Promise<void> {
  const ioc = new Cluster([{ host: "127.0.0.1", port: clusterPort }]);
  const nrc = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${clusterPort}` }] });
  await nrc.connect();
  // Both clients at once: each waits past its session's ttl.
  const clients = [
    [ioc, "ioredis Cluster"],
    [nrc, "node-redis cluster"],
  ] as const;
  await Promise.all(clients.map(([c, label]) =>
    test(`${label}: locks on keys of several nodes open one session per node, kept alive, closed on each`, async () => {
      const t = Math.random().toString(36).slice(2, 8);
      const session = new Session(c, { ttl: 3000 }); // kept through renewals on a loaded machine
      const locks = Array.from({ length: 12 }, (_, i) => Lock.exclusive(c, `{${t}${i}}k`, { session }));
      assert((await Promise.all(locks.map((l) => l.acquire()))).every(Boolean), "granted");
      const ids = session.ids;
      assert(ids.size >= 2, `a session on each node touched (${[...ids]})`);
      // Ids are each node's own (two nodes may draw the same number): the map is by node.
      await sleep(3500);
      assert(locks.every((l) => l.held && !l.lost), "held past the ttl on every node");
      assert((await Promise.all(locks.map((l) => l.owned()))).every(Boolean), "held on the servers");
      for (const [node, id] of ids) {
        const [host, p] = node.split(":");
        const r = new Redis(Number(p), host);
        assert((await r.call("LOCK.SESSION", "INFO", id)) !== null, `session ${id} lives on ${node}`);
        r.disconnect();
      }
      await locks[0].release();
      assert((await session.close()) === 11, "close() ended the other 11 holders, on every node");
      assert(!(await Promise.all(locks.map((l) => l.locked()))).some(Boolean), "all free");
    }),
  ));
  ioc.disconnect();
  await nrc.disconnect();
}

async function main(): Promise<void> {
  if (process.env.ONLY !== "node-redis") await singleServer("ioredis");
  if (process.env.ONLY !== "ioredis") await singleServer("node-redis");
  if (clusterPort) await clusterTests();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL main: ${e?.stack ?? e}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
