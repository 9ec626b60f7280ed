// The package as a user installs it (`npm install ./clients/node`), from a
// TypeScript script: every kind with ioredis and node-redis, against a
// single server (REDIS_LOCK_PORT) and a 3-master cluster
// (REDIS_LOCK_CLUSTER_PORT), and RedLock over five servers (REDLOCK_PORTS,
// REDLOCK_DOWN of them, the last ones, stopped). Prints one line per test
// and "N passed, M failed".
import Redis, { Cluster } from "ioredis";
import { createClient, createCluster } from "redis";
import { DeadlockError, LeaseLostError, Lock, RedLock } from "redis-native-lock";

const port = Number(process.env.REDIS_LOCK_PORT);
const clusterPort = Number(process.env.REDIS_LOCK_CLUSTER_PORT);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
let passed = 0;
let failed = 0;

function assert(cond: unknown, what: string): void {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}

async function test(name: string, f: () => Promise<void>): Promise<void> {
  try {
    await f();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${(e as Error)?.stack ?? e}`);
  }
}

const tag = () => `{${Math.random().toString(36).slice(2, 10)}}`;

async function everyKind(client: unknown, label: string): Promise<void> {
  await test(`${label}: every kind`, async () => {
    const t = tag();
    const a = Lock.exclusive(client, `${t}x`);
    assert(await a.acquire(), "granted");
    assert(!(await Lock.exclusive(client, `${t}x`).acquire(0)), "a second owner is refused");
    const first = a.token!;
    await a.release();
    const b = Lock.exclusive(client, `${t}x`);
    await b.with(async (l) => assert(l.token! > first, "tokens increase"));
    const r = Lock.reentrant(client, `${t}r`);
    assert((await r.acquire()) && (await r.acquire()), "re-entered");
    await r.release();
    assert(await r.owned(), "one hold left");
    await r.release();
    assert(!(await r.locked()), "free");
    const [ra, rb] = [Lock.read(client, `${t}rw`), Lock.read(client, `${t}rw`)];
    assert((await ra.acquire()) && (await rb.acquire()), "readers share");
    assert(!(await Lock.write(client, `${t}rw`).acquire(0)), "the writer waits for readers");
    await ra.release();
    await rb.release();
    const s = [0, 1, 2].map(() => Lock.semaphore(client, `${t}sem`, 2));
    assert((await s[0].acquire(0)) && (await s[1].acquire(0)), "two permits");
    assert(!(await s[2].acquire(0)), "no third");
    await s[0].release();
    assert(await s[2].acquire(0), "a freed permit");
    await s[1].release();
    await s[2].release();
    const m = Lock.multi(client, [`${t}m1`, `${t}m2`]);
    assert(await m.acquire(), "both keys");
    assert(m.tokens.length === 2, "a token per key");
    assert(!(await Lock.exclusive(client, `${t}m2`).acquire(0)), "all or none");
    await m.release();
  });
}

async function main(): Promise<void> {
  const io = new Redis(port, "127.0.0.1");
  const nr = createClient({ url: `redis://127.0.0.1:${port}` });
  nr.on("error", () => {}); // the CLIENT KILL test closes it too: it reconnects
  await nr.connect();
  await everyKind(io, "ioredis");
  await everyKind(nr, "node-redis");

  await test("ioredis: a waiter is granted when the holder releases", async () => {
    const t = tag();
    const holder = Lock.exclusive(io, `${t}w`);
    assert(await holder.acquire(), "held");
    setTimeout(() => void holder.release(), 300);
    const start = Date.now();
    const waiter = Lock.exclusive(io, `${t}w`, { wait: 5000 });
    assert(await waiter.acquire(), "granted after the release");
    assert(Date.now() - start < 3000, "in time");
    assert(waiter.bound, "bound to its own connection");
    await waiter.release();
  });

  await test("the keepalive renews; a deleted lock is signalled lost", async () => {
    for (const bind of [true, false]) {
      const key = `${tag()}k`;
      let why = "";
      const l = Lock.exclusive(io, key, { ttl: 600, bind, onLost: (w) => (why = w) });
      assert(await l.acquire(), "held");
      await sleep(1500);
      assert(!l.lost && (await l.owned()), "renewed");
      await io.del(key);
      for (let i = 0; i < 60 && !l.lost; i++) await sleep(50);
      assert(l.lost && l.signal.aborted && why !== "", "lost, signalled");
      let threw = false;
      await l.release().catch((e) => (threw = e instanceof LeaseLostError));
      assert(threw, "release throws LeaseLostError");
    }
  });

  await test("a bound lock is freed when its connection dies", async () => {
    const key = `${tag()}b`;
    const l = Lock.exclusive(io, key, { ttl: 900 });
    assert(await l.acquire(), "held");
    await io.call("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes");
    await sleep(100);
    const io2 = new Redis(port, "127.0.0.1");
    assert(await Lock.exclusive(io2, key, { wait: 500 }).acquire(), "freed at once");
    io2.disconnect();
  });

  await test("DEADLOCK is its own error", async () => {
    const t = tag();
    const io3 = new Redis(port, "127.0.0.1");
    const a1 = Lock.exclusive(io3, `${t}d1`, { owner: "A" });
    const b2 = Lock.exclusive(io3, `${t}d2`, { owner: "B" });
    assert((await a1.acquire()) && (await b2.acquire()), "held");
    const aWaits = Lock.exclusive(io3, `${t}d2`, { owner: "A", wait: 5000 });
    const pending = aWaits.acquire();
    await sleep(300);
    let deadlock = false;
    await Lock.exclusive(io3, `${t}d1`, { owner: "B", wait: 5000 })
      .acquire()
      .catch((e) => (deadlock = e instanceof DeadlockError));
    assert(deadlock, "DeadlockError");
    await b2.release();
    assert(await pending, "A got d2");
    await aWaits.release();
    await a1.release();
    io3.disconnect();
  });

  await test("ioredis keyPrefix is applied", async () => {
    const pre = new Redis(port, "127.0.0.1", { keyPrefix: "app:" });
    const key = `${tag()}p`;
    const l = Lock.exclusive(pre, key);
    assert(await l.acquire(), "held");
    assert((await io.call("LOCK.INFO", `app:${key}`)) !== null, "the prefixed key holds the lock");
    await l.release();
    pre.disconnect();
  });

  if (clusterPort) {
    const ioc = new Cluster([{ host: "127.0.0.1", port: clusterPort }]);
    const nrc = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${clusterPort}` }] });
    await nrc.connect();
    await everyKind(ioc, "ioredis Cluster");
    await everyKind(nrc, "node-redis cluster");
    ioc.disconnect();
    await nrc.disconnect();
  }

  const ports = (process.env.REDLOCK_PORTS ?? "").split(",").filter(Boolean).map(Number);
  if (ports.length === 5) {
    const down = Number(process.env.REDLOCK_DOWN ?? 0);
    await test(`RedLock with ${down} of 5 servers stopped`, async () => {
      const servers = ports.map((p) => new Redis(p, "127.0.0.1", { maxRetriesPerRequest: 0, connectTimeout: 200, enableOfflineQueue: false, retryStrategy: () => null }));
      servers.forEach((s) => s.on("error", () => {}));
      await sleep(300);
      const rl = new RedLock(servers, { retries: 2, retryDelay: 50 });
      const key = `red${tag()}`;
      const lease = await rl.acquire(key, 10_000);
      if (down <= 2) {
        assert(lease !== null && lease.tokens.size === 5 - down, "a quorum granted it");
        assert((await new RedLock(servers, { retries: 1 }).acquire(key, 10_000)) === null, "a second client is refused");
        assert((await rl.release(lease!)) === 5 - down, "released everywhere");
      } else {
        assert(lease === null, "no quorum");
      }
      servers.forEach((s) => s.disconnect());
    });
  }

  io.disconnect();
  await nr.disconnect();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main().catch((e) => {
  console.log(`FAIL main: ${e?.stack ?? e}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
