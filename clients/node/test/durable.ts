// Durable grants (`replicas`): a master (DURABLE_PORT) with one replica,
// whose process id is DURABLE_REPLICA_PID (SIGSTOPped here to stop its
// acknowledgements, SIGCONTed again whatever happens). With ioredis and
// node-redis, bound and through the client: a grant and its renewals
// acknowledged by the replica; with the replica paused, a grant released
// and NotDurableError, or with allowNotDurable kept with `durable` false,
// and a renewal reported through onNotDurable. Prints one line per test and
// "N passed, M failed".
import { Redis } from "ioredis";
import { createClient } from "redis";
import { Lock, NotDurableError, RedisClient } from "redis-native-lock";

const port = Number(process.env.DURABLE_PORT);
const replicaPid = Number(process.env.DURABLE_REPLICA_PID);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Polls `cond` every 20 ms for up to `ms`; whether it became true. */
async function until(cond: () => boolean, ms: number): Promise<boolean> {
  for (const end = Date.now() + ms; Date.now() < end; await sleep(20)) if (cond()) return true;
  return cond();
}
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

let paused = false;
function pause(): void {
  process.kill(replicaPid, "SIGSTOP");
  paused = true;
}
function resume(): void {
  process.kill(replicaPid, "SIGCONT");
  paused = false;
}

const tag = () => `durable:${Math.random().toString(36).slice(2, 10)}`;

async function kinds(client: RedisClient, label: string): Promise<void> {
  for (const bind of [true, false]) {
    const l = `${label}, ${bind ? "bound" : "through the client"}`;
    await test(`${l}: a grant and its renewals acknowledged by the replica`, async () => {
      const whys: string[] = [];
      const lock = Lock.exclusive(client, Buffer.from(`${tag()}\x00k`), { ttl: 6000, bind, replicas: 1, replicasTimeout: 2000, onNotDurable: (w) => whys.push(w) });
      const t0 = Date.now();
      assert(await lock.acquire(), "granted");
      console.log(`     ${l}: grant + WAIT 1 in ${Date.now() - t0} ms`);
      assert(lock.durable === true, `durable: ${lock.durable}`);
      assert(lock.bound === bind, "bound as asked");
      await sleep(2500); // a renewal at 2000 ms
      assert(lock.durable === true && whys.length === 0 && !lock.lost, `renewals acknowledged: durable ${lock.durable}, lost ${lock.lost}, told ${whys}`);
      await lock.release();
    });
    await test(`${l}: replica paused: the grant is released and NotDurableError thrown`, async () => {
      const key = tag();
      pause();
      try {
        const lock = Lock.exclusive(client, key, { bind, replicas: 1, replicasTimeout: 200 });
        const t0 = Date.now();
        let err: unknown = null;
        try {
          await lock.acquire();
        } catch (e) {
          err = e;
        }
        const took = Date.now() - t0;
        assert(err instanceof NotDurableError, `NotDurableError: ${err}`);
        const e = err as NotDurableError;
        assert(e.acknowledged === 0 && e.replicas === 1, `0 of 1: ${e.acknowledged}/${e.replicas}`);
        assert(took >= 190 && took < 5000, `took the WAIT's timeout: ${took} ms`);
        assert(!lock.held && lock.durable === null, "not held");
        assert(!(await lock.locked()), "released on the master");
        assert(await Lock.exclusive(client, key, { bind }).acquire(), "another owner gets it at once");
      } finally {
        resume();
      }
    });
    await test(`${l}: replica paused, allowNotDurable: the grant kept, durable false`, async () => {
      pause();
      let lock: Lock | null = null;
      try {
        lock = Lock.exclusive(client, tag(), { bind, replicas: 1, replicasTimeout: 200, allowNotDurable: true });
        assert(await lock.acquire(), "granted");
        assert(lock.durable === false, `durable false: ${lock.durable}`);
        assert(await lock.owned(), "held on the master");
      } finally {
        resume();
      }
      await lock!.release();
    });
    await test(`${l}: replica paused while held: the renewal's missing acknowledgement told by onNotDurable, the lease kept`, async () => {
      const whys: string[] = [];
      const lock = Lock.exclusive(client, tag(), { ttl: 3000, bind, replicas: 1, replicasTimeout: 100, onNotDurable: (w) => whys.push(w) });
      assert(await lock.acquire(), "granted");
      assert(lock.durable === true, "durable at first");
      pause();
      try {
        // Renewals every 1000 ms, each WAIT 100 ms: the first one's (a loaded
        // machine may run it late; the lease is 3 s, renewed all along).
        await until(() => whys.length > 0, 10_000);
        assert(whys.length > 0 && /0 of 1 replicas/.test(whys[0]), `told: ${whys}`);
        assert(lock.durable === false && !lock.lost && (await lock.owned()), "still held, not durable");
      } finally {
        resume();
      }
      await until(() => lock.durable === true, 10_000);
      assert(lock.durable === true, `acknowledged again after the replica resumed: ${lock.durable}`);
      await lock.release();
    });
  }
}

/** Renewals whose WAIT runs its 4.5 s timeout (the replica paused) on a 6 s
 * lease, bound and through the client (at once, under one pause): each next
 * one follows at once when its WAIT ends (it is due a third of the ttl after
 * the last was sent), so the lease is kept; waiting for the next tick
 * instead, the first one's successor came at 8 s, the lease's end. */
async function longWaits(client: RedisClient, label: string): Promise<void> {
  await test(`${label}: renewals whose WAIT runs past the next tick keep the lease, bound and through the client`, async () => {
    const locks = [true, false].map((bind) => Lock.exclusive(client, tag(), { ttl: 6000, bind, replicas: 1, replicasTimeout: 4500, onNotDurable: () => {} }));
    for (const lock of locks) assert(await lock.acquire(), "granted");
    pause();
    try {
      await sleep(10_000);
      for (const lock of locks) {
        let why = "";
        try {
          lock.check();
        } catch (e) {
          why = (e as Error).message;
        }
        assert(!lock.lost, `a 6 s lease lost under 4.5 s WAITs: ${why}`);
      }
    } finally {
      resume();
    }
    for (const lock of locks) {
      assert(await lock.owned(), "still held on the server");
      await lock.release();
    }
  });
}

async function main(): Promise<void> {
  const io = new Redis(port, "127.0.0.1");
  const nr = createClient({ url: `redis://127.0.0.1:${port}` });
  await nr.connect();
  try {
    await kinds(io, "ioredis");
    await kinds(nr, "node-redis");
    await longWaits(io, "ioredis");
    await test("a semaphore, a reentrant re-entry: the refused grant gives back its own hold only", async () => {
      const key = tag();
      const r = Lock.reentrant(io, key, { replicas: 1, replicasTimeout: 200 });
      assert(await r.acquire(), "first hold, acknowledged");
      pause();
      try {
        let err: unknown = null;
        await r.reacquire().catch((e) => (err = e));
        assert(err instanceof NotDurableError, `NotDurableError: ${err}`);
        assert(r.held && (await r.owned()), "the first hold is kept");
        const s = Lock.semaphore(io, tag(), 2, { replicas: 1, replicasTimeout: 200 });
        err = null;
        await s.acquire().catch((e) => (err = e));
        assert(err instanceof NotDurableError && !(await s.locked()), `semaphore: ${err}`);
      } finally {
        resume();
      }
      await r.release();
      assert(!(await r.locked()), "free");
    });
    await test("bad replicas options are a TypeError", async () => {
      for (const o of [{ replicas: -1 }, { replicas: 1.5 }, { replicasTimeout: 0 }, { allowNotDurable: 1 }]) {
        let e: unknown = null;
        try {
          Lock.exclusive(io, "k", o as never);
        } catch (x) {
          e = x;
        }
        assert(e instanceof TypeError, `${JSON.stringify(o)}: ${e}`);
      }
    });
  } finally {
    if (paused) resume();
    io.disconnect();
    await nr.disconnect();
  }
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}

void main();
