// The package as a user installs it (`npm install ./clients/node`), from a
// TypeScript script: every kind with ioredis and node-redis, against a
// single server (REDIS_LOCK_PORT) and a 3-master cluster
// (REDIS_LOCK_CLUSTER_PORT), and RedLock over five servers (REDLOCK_PORTS,
// REDLOCK_DOWN of them, the last ones, stopped). Prints one line per test
// and "N passed, M failed".
import { Redis, Cluster } from "ioredis";
import { createClient, createCluster } from "redis";
import { DeadlockError, LeaseLostError, Lock, LockError, RedLock, RedisClient } from "redis-native-lock";

const port = Number(process.env.REDIS_LOCK_PORT);
const clusterPort = Number(process.env.REDIS_LOCK_CLUSTER_PORT);
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

async function everyKind(client: RedisClient, label: string): Promise<void> {
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
    assert(await r.acquire(), "held");
    await r.reacquire(); // re-entered: a second hold
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
    // A guarded write routed with the lock key (same slot), run while held.
    const g = Lock.exclusive(client, `${t}g`);
    assert(await g.acquire(), "held");
    assert(String(await g.guard("SET", `${t}gdata`, "v")) === "OK", "the guarded SET's reply");
    assert(String(await g.guard("GET", `${t}gdata`)) === "v", "the guarded GET read it");
    await g.release();
  });
}

/** A string key's value through a fresh ioredis connection. */
async function valueOf(key: string): Promise<string | null> {
  const r = new Redis(port, "127.0.0.1");
  try {
    return await r.get(key);
  } finally {
    r.disconnect();
  }
}

/** What `f` rejects with (null: it resolved). */
async function rejection(f: () => Promise<unknown>): Promise<unknown> {
  try {
    await f();
  } catch (e) {
    return e;
  }
  return null;
}

async function guardTests(client: RedisClient, label: string): Promise<void> {
  await test(`${label}: guard() runs the command on every held kind and on hold()'s Held; its reply and its error as the command's`, async () => {
    const t = tag();
    const { read } = Lock.readWrite(client, `${t}rw`);
    const kinds: [string, Lock][] = [
      ["exclusive", Lock.exclusive(client, `${t}x`)],
      ["reentrant", Lock.reentrant(client, `${t}r`)],
      ["read", read],
      ["write", Lock.write(client, `${t}w`)],
      ["semaphore", Lock.semaphore(client, `${t}s`, 2)],
    ];
    for (const [kind, l] of kinds) {
      assert(await l.acquire(), `${kind} held`);
      assert(String(await l.guard("SET", `${t}job:${kind}`, `done by ${kind}`)) === "OK", `${kind}: SET's reply`);
      assert((await valueOf(`${t}job:${kind}`)) === `done by ${kind}`, `${kind}: written`);
      assert(Number(await l.guard("INCR", `${t}n`)) === kinds.findIndex(([k]) => k === kind) + 1, `${kind}: INCR's reply`);
      await l.release();
    }
    {
      await using held = await Lock.exclusive(client, `${t}h`).hold(1000);
      assert(String(await held.guard("SET", `${t}job:held`, "done")) === "OK", "Held: SET's reply");
      const e = await rejection(() => held.guard("INCR", `${t}job:held`));
      assert(e instanceof Error && !(e instanceof LockError) && /not an integer/.test(e.message), `the command's own error, as the client throws it: ${e}`);
      assert(!held.lost, "a command's error leaves the lease alone");
      assert(String(await held.guard("SET", `${t}job:held`, "again")) === "OK", "still guarded");
    }
    assert((await valueOf(`${t}job:held`)) === "again", "written");
    assert(!(await Lock.exclusive(client, `${t}h`).locked()), "released at the end of the scope");
  });

  await test(`${label}: guard() after the lease was lost elsewhere: LeaseLostError from the server's NOTHELD, nothing written`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    await raw.set(`${t}data`, "before");
    // bind: false, a long ttl: the package cannot know, only the server's check refuses.
    let why = "";
    const l = Lock.exclusive(client, `${t}k`, { bind: false, ttl: 30_000, onLost: (w) => (why = w) });
    assert(await l.acquire(), "held");
    assert(Number(await raw.call("LOCK.RELEASE", `${t}k`, l.owner as string)) === 1, "released behind its back");
    assert(!l.lost, "the package does not know yet");
    const e = await rejection(() => l.guard("SET", `${t}data`, "after"));
    assert(e instanceof LeaseLostError, `LeaseLostError, not ${e}`);
    assert(l.lost && l.signal.aborted && /NOTHELD/.test(why), `marked lost: ${why}`);
    assert((await valueOf(`${t}data`)) === "before", "nothing written");
    const again = await rejection(() => l.guard("SET", `${t}data`, "after"));
    assert(again instanceof LeaseLostError, `again LeaseLostError, not ${again}`);
    assert((await l.release().catch((x) => x)) instanceof LeaseLostError, "release: LeaseLostError");
    raw.disconnect();
  });

  await test(`${label}: guard() while another owner holds the key is refused; that owner's data is unchanged`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    const a = Lock.exclusive(client, `${t}k`, { bind: false, ttl: 30_000 });
    assert(await a.acquire(), "A holds");
    await raw.del(`${t}k`); // A's lease gone (as if expired while A paused)
    const b = Lock.exclusive(client, `${t}k`);
    assert(await b.acquire(), "B holds");
    assert(String(await b.guard("SET", `${t}data`, "B")) === "OK", "B's guarded write");
    const e = await rejection(() => a.guard("SET", `${t}data`, "A"));
    assert(e instanceof LeaseLostError, `A: LeaseLostError, not ${e}`);
    assert((await valueOf(`${t}data`)) === "B", "B's write stands");
    assert(!b.lost && (await b.owned()), "B still holds");
    await b.release();
    raw.disconnect();
  });

  await test(`${label}: guard() sends the lock's token: a stale Lock object is refused though its owner name holds the key again`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    const owner = `worker-${t}`;
    const stale = Lock.exclusive(client, `${t}k`, { owner, bind: false, ttl: 30_000 });
    assert(await stale.acquire(), "held");
    assert(Number(await raw.call("LOCK.RELEASE", `${t}k`, owner)) === 1, "released behind its back");
    const fresh = Lock.exclusive(client, `${t}k`, { owner });
    assert(await fresh.acquire(), "the same owner name holds it again");
    assert(fresh.token! > stale.token!, "under a newer token");
    assert(String(await fresh.guard("SET", `${t}data`, "fresh")) === "OK", "the current holder's guard runs");
    const e = await rejection(() => stale.guard("SET", `${t}data`, "stale"));
    assert(e instanceof LeaseLostError, `the stale token: LeaseLostError, not ${e}`);
    assert((await valueOf(`${t}data`)) === "fresh", "nothing written by the stale one");
    await fresh.release();
    raw.disconnect();
  });

  await test(`${label}: guard() of a lease known lost throws at once; of a lock not held or multi-key, LockError`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    await raw.set(`${t}data`, "before");
    const l = Lock.exclusive(client, `${t}k`, { ttl: 30_000 });
    assert(await l.acquire(), "held");
    await raw.del(`${t}k`); // the watcher tells a bound lock at once
    for (let i = 0; i < 100 && !l.lost; i++) await sleep(5);
    assert(l.lost, "known lost");
    await raw.call("LOCK.ACQUIRE", `${t}k`, l.owner as string, 30_000); // held again under the owner name, another token
    const e = await rejection(() => l.guard("SET", `${t}data`, "after"));
    assert(e instanceof LeaseLostError, `LeaseLostError, not ${e}`);
    assert((await valueOf(`${t}data`)) === "before", "nothing written");
    const free = await rejection(() => Lock.exclusive(client, `${t}free`).guard("SET", `${t}data`, "x"));
    assert(free instanceof LockError && !(free instanceof LeaseLostError) && /not held/.test((free as Error).message), `not held: ${free}`);
    const m = Lock.multi(client, [`${t}m1`, `${t}m2`]);
    assert(await m.acquire(), "multi held");
    const me = await rejection(() => m.guard("SET", `${t}data`, "x"));
    assert(me instanceof LockError && /multi-key/.test((me as Error).message), `multi-key: ${me}`);
    await m.release();
    assert((await valueOf(`${t}data`)) === "before", "nothing written");
    raw.disconnect();
  });
}

/** Info holders' owners, as bytes, through a fresh ioredis connection. */
async function holders(key: string | Buffer): Promise<Buffer[]> {
  const r = new Redis(port, "127.0.0.1");
  try {
    const info = (await r.callBuffer("LOCK.INFO", key)) as unknown;
    if (!Array.isArray(info)) return [];
    const hs = info[3] as unknown[][];
    return hs.map((h) => h[0] as Buffer);
  } finally {
    r.disconnect();
  }
}

async function issueTests(client: RedisClient, label: string): Promise<void> {
  await test(`${label}: acquire() with no argument does not wait, whatever the wait option`, async () => {
    const key = `${tag()}nw`;
    const holder = Lock.exclusive(client, key);
    assert(await holder.acquire(), "held");
    const other = Lock.exclusive(client, key, { wait: 5000 });
    const t0 = Date.now();
    assert(!(await other.acquire()), "refused");
    assert(Date.now() - t0 < 2000, `at once, not the 5 s wait (${Date.now() - t0} ms)`);
    await holder.release();
  });

  for (const kind of ["exclusive", "reentrant", "write", "read"] as const) {
    await test(`${label}: one ${kind} Lock object shared by 8 concurrent tasks: never two inside, the others refused with a clear LockError (fenced counter)`, async () => {
      const key = `${tag()}sh`;
      const shared = Lock[kind](client, key, { ttl: 5000 });
      let inside = 0;
      let maxInside = 0;
      let counter = 0;
      let lastToken = 0;
      let refused = 0;
      let refusedMsg = "";
      const held: string[] = []; // the refusals that found the object holding (not an acquire in flight)
      const caller = async () => {
        for (let done = 0; done < 3; ) {
          try {
            if (!(await shared.acquire(2000))) continue;
          } catch (e) {
            if (!(e instanceof LockError)) throw e;
            refused++;
            refusedMsg = (e as Error).message;
            if (/already holds/.test(refusedMsg)) held.push(refusedMsg);
            await sleep(2 + Math.random() * 10);
            continue;
          }
          inside++;
          maxInside = Math.max(maxInside, inside);
          const token = shared.token!;
          assert(token > lastToken, "the storage accepts only a higher token");
          lastToken = token;
          const seen = counter;
          await sleep(3);
          counter = seen + 1; // a lost update if two were inside
          inside--;
          done++;
          await shared.release();
        }
      };
      await Promise.all(Array.from({ length: 8 }, caller));
      assert(maxInside === 1, `one inside at a time (max ${maxInside})`);
      assert(counter === 24, `no lost update (${counter})`);
      assert(refused > 0 && /same Lock object|already holds/.test(refusedMsg), `the others got a clear LockError: ${refusedMsg}`);
      if (kind !== "exclusive") assert(held.every((m) => /reacquire\(\)/.test(m)), `a refusal while held names reacquire(): ${held[0]}`);
    });
  }

  await test(`${label}: reacquire() adds a hold of a reentrant, read or write lock (one release() each); LockError for the other kinds and when not held`, async () => {
    const t = tag();
    for (const kind of ["reentrant", "write", "read"] as const) {
      const l = Lock[kind](client, `${t}${kind}`);
      assert((await rejection(() => l.reacquire())) instanceof LockError, `${kind}: not held`);
      assert(await l.acquire(), `${kind}: held`);
      const token = l.token;
      await l.reacquire();
      await l.reacquire();
      assert(l.token === token, `${kind}: the same grant`);
      const hs = await holders(`${t}${kind}`);
      assert(hs.length === 1, `${kind}: one holder`);
      await l.release();
      await l.release();
      assert(await l.owned(), `${kind}: one hold left`);
      await l.release();
      assert(!(await l.locked()), `${kind}: free after three releases`);
    }
    for (const l of [Lock.exclusive(client, `${t}x`), Lock.semaphore(client, `${t}s`, 2), Lock.multi(client, [`${t}m1`, `${t}m2`])]) {
      assert(await l.acquire(), "held");
      const e = await rejection(() => l.reacquire());
      assert(e instanceof LockError && /one hold/.test((e as Error).message), `one hold: ${e}`);
      await l.release();
    }
    {
      await using held = await Lock.reentrant(client, `${t}h`).hold(1000);
      await held.reacquire();
      await held.reacquire();
      await held.release();
      assert(await held.lock.owned(), "two holds left");
    }
    assert(!(await Lock.exclusive(client, `${t}h`).locked()), "the end of the scope gave back every hold the Held took");
  });

  await test(`${label}: a stale holder (its grant gone behind its back, the same owner name granted again) cannot release, renew or extend the new grant: LeaseLostError, the new holder keeps it`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    const owner = `worker-${t}`;
    const kinds: [string, (k: string, o: { bind: boolean; ttl: number }) => Lock][] = [
      ["exclusive", (k, o) => Lock.exclusive(client, k, { owner, ...o })],
      ["reentrant", (k, o) => Lock.reentrant(client, k, { owner, ...o })],
      ["read", (k, o) => Lock.read(client, k, { owner, ...o })],
      ["write", (k, o) => Lock.write(client, k, { owner, ...o })],
      ["semaphore", (k, o) => Lock.semaphore(client, k, 3, { owner, ...o })],
    ];
    for (const bind of [false, true])
      for (const [kind, make] of kinds) {
        const what = `${kind}, ${bind ? "bound" : "unbound"}`;
        const key = `${t}${kind}${bind}`;
        const a = make(key, { bind, ttl: 30_000 });
        assert(await a.acquire(), `${what}: A holds`);
        await raw.del(key); // A's grant gone behind its back (as an expiry during a pause, a failover)
        const b = make(key, { bind: false, ttl: 30_000 });
        assert(await b.acquire(), `${what}: B holds, under A's owner name`);
        assert(b.token! > a.token!, `${what}: a newer token`);
        const ext = await rejection(() => a.extend(30_000));
        assert(ext instanceof LeaseLostError || (bind && a.lost), `${what}: A's extend(): LeaseLostError, not ${ext}`);
        assert(!(await a.owned()), `${what}: A's owned() is false (B's grant is not A's)`);
        const rel = await rejection(() => a.release());
        assert(rel instanceof LeaseLostError, `${what}: A's release(): LeaseLostError, not ${rel}`);
        assert(!b.lost && (await b.owned()), `${what}: B still holds`);
        const hs = await holders(key);
        assert(hs.length === 1, `${what}: one holder (${hs.length})`);
        await b.release();
        assert(!(await b.locked()), `${what}: B's release frees it`);
      }
    // multi-key: each key's own token
    const m = Lock.multi(client, [`${t}m1`, `${t}m2`], { owner, bind: false });
    assert(await m.acquire(), "multi: A holds");
    await raw.del(`${t}m1`, `${t}m2`);
    const mb = Lock.multi(client, [`${t}m1`, `${t}m2`], { owner, bind: false });
    assert(await mb.acquire(), "multi: B holds");
    assert((await rejection(() => m.release())) instanceof LeaseLostError, "multi: A's release(): LeaseLostError");
    assert((await holders(`${t}m1`)).length === 1 && (await holders(`${t}m2`)).length === 1, "multi: B holds both keys");
    await mb.release();
    raw.disconnect();
  });

  await test(`${label}: a stale unbound holder's renewal (LOCK.RENEW TOKEN) answers 0: it is told lost and B's lease is not renewed by it`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const t = tag();
    const owner = `worker-${t}`;
    let why = "";
    const a = Lock.exclusive(client, `${t}k`, { owner, bind: false, ttl: 3000, onLost: (w) => (why = w) });
    assert(await a.acquire(), "A holds");
    await raw.del(`${t}k`);
    const b = Lock.exclusive(client, `${t}k`, { owner, bind: false, ttl: 30_000 });
    assert(await b.acquire(), "B holds");
    for (let i = 0; i < 100 && !a.lost; i++) await sleep(50); // A's next renewal is at 1000 ms
    assert(a.lost && /LOCK.RENEW answered 0/.test(why), `A told lost by its renewal: ${why}`);
    assert((await rejection(() => a.release())) instanceof LeaseLostError, "A's release(): LeaseLostError");
    assert(!b.lost && (await b.owned()), "B still holds");
    await b.release();
    raw.disconnect();
  });

  await test(`${label}: reacquire() after the grant was deleted: LeaseLostError, the new grant it got given back`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const key = `${tag()}ra`;
    const l = Lock.reentrant(client, key, { bind: false, ttl: 30_000 });
    assert(await l.acquire(), "held");
    await raw.del(key);
    const e = await rejection(() => l.reacquire());
    assert(e instanceof LeaseLostError && l.lost, `LeaseLostError: ${e}`);
    for (let i = 0; i < 50 && (await l.locked()); i++) await sleep(10);
    assert(!(await l.locked()), "the grant the re-entry made was given back");
    raw.disconnect();
  });

  // "At once" is asserted as "by the event itself, long before the next keepalive": a ttl of 30 s (a
  // keepalive every 10 s), told within 5 s and for the event's reason (a bound no loaded machine
  // misses); the time it took is printed.
  await test(`${label}: a bound holder hears its connection close at once (CLIENT KILL); lost stays true`, async () => {
    const key = `${tag()}kl`;
    let lostAt = 0;
    let why = "";
    const l = Lock.exclusive(client, key, {
      ttl: 30_000,
      onLost: (w) => {
        lostAt = Date.now();
        why = w;
      },
    });
    assert(await l.acquire(), "held");
    assert(l.bound, "bound");
    const killer = new Redis(port, "127.0.0.1");
    const list = String(await killer.call("CLIENT", "LIST"));
    // the bound connection is the newest one whose client tracking is redirected to the watcher
    const id = list
      .split("\n")
      .filter((line) => /redir=\d+/.test(line))
      .map((line) => Number(/id=(\d+)/.exec(line)![1]))
      .sort((a, b) => a - b)
      .pop()
      ?.toString();
    assert(id, `the bound connection in CLIENT LIST:\n${list}`);
    const killedAt = Date.now();
    await killer.call("CLIENT", "KILL", "ID", id!);
    for (let i = 0; i < 500 && lostAt === 0; i++) await sleep(10);
    killer.disconnect();
    console.log(`     ${label}: CLIENT KILL of a bound connection told after ${lostAt ? `${lostAt - killedAt} ms` : "never"}`);
    assert(lostAt !== 0 && /connection the lock was bound to/.test(why), `told by the connection's end, not a renewal (${lostAt ? lostAt - killedAt : "never"}: ${why})`);
    assert(l.lost && l.signal.aborted, "lost, signal aborted");
    let threw = false;
    await l.release().catch((e) => (threw = e instanceof LeaseLostError));
    assert(threw, "release throws LeaseLostError");
    assert(l.lost, "lost stays true after the release");
    const again = Lock.exclusive(client, key);
    assert(await again.acquire(), "the server freed it");
    await again.release();
  });

  await test(`${label}: DEL or SET over a held bound lock is told at once by the watcher (one per client); lost stays true`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    const watchers = async () => Number(((await raw.call("PUBSUB", "NUMSUB", "__redis__:invalidate")) as unknown[])[1]);
    const before = await watchers(); // 0 unless another client's bound locks are held
    const other = Lock.exclusive(client, `${tag()}other`, { ttl: 10_000 });
    assert(await other.acquire(), "another bound lock held");
    for (const op of ["DEL", "SET"] as const) {
      const key = `${tag()}wd`;
      let lostAt = 0;
      const whys: string[] = [];
      // SET: a reentrant lock re-entered, extended and renewed once first (each a write of its own, after which it reads the key again to stay tracked)
      const l = (op === "DEL" ? Lock.exclusive : Lock.reentrant)(client, key, {
        ttl: op === "DEL" ? 30_000 : 6000,
        onLost: (why) => {
          lostAt = Date.now();
          whys.push(why);
        },
      });
      assert(await l.acquire(), "held");
      assert(l.bound, "bound");
      if (op === "SET") {
        await l.reacquire(); // re-entered
        await l.extend(6000);
        // One renewal (about 2000 ms in; the next 2000 ms later), seen in
        // the server's count of renewals: a loaded machine may run it late.
        const renewals = async () => {
          const stats = String(await raw.info("commandstats"));
          return [...stats.matchAll(/cmdstat_lock\.(?:keepalive|renew):calls=(\d+)/g)].reduce((n, m) => n + Number(m[1]), 0);
        };
        const renewalsBefore = await renewals();
        let renewed = false;
        for (let i = 0; i < 300 && !renewed; i++) {
          await sleep(50);
          renewed = (await renewals()) > renewalsBefore;
        }
        assert(renewed, "renewed once");
      } else await sleep(50);
      assert(!l.lost, "not lost yet");
      const now = await watchers();
      assert(now === before + 1, `one watcher for two bound locks (${now - before})`);
      const t0 = Date.now();
      if (op === "DEL") await raw.del(key);
      else await raw.set(key, "x");
      for (let i = 0; i < 1000 && lostAt === 0; i++) await sleep(1);
      const took = lostAt - t0;
      console.log(`     ${label}: ${op} over a held bound lock told after ${lostAt ? `${took} ms` : "never"}`);
      assert(lostAt !== 0, "told");
      assert(/told by the server at once/.test(whys[0] ?? ""), `told by the watcher, not a renewal (${took} ms): ${whys}`);
      assert(l.lost && l.signal.aborted, "lost, signal aborted");
      let threw = false;
      await l.release().catch((e) => (threw = e instanceof LeaseLostError));
      assert(threw, "release throws LeaseLostError");
      assert(l.lost, "lost stays true after the release");
      await sleep(20);
      assert(l.lost && whys.length === 1, `lost stays true, told once (${whys.length})`);
    }
    assert(!other.lost && (await other.owned()), "the other lock is untouched");
    await other.release();
    let left = -1;
    for (let i = 0; i < 50 && left !== before; i++) {
      left = await watchers();
      if (left !== before) await sleep(10);
    }
    assert(left === before, `the watcher closes with the last bound lock (${left - before} left)`);
    raw.disconnect();
  });

  await test(`${label}: WRONGTYPE or a missing key at release, extend and renewal is LeaseLostError`, async () => {
    const raw = new Redis(port, "127.0.0.1");
    for (const bind of [true, false]) {
      const key = `${tag()}wt`;
      const l = Lock.exclusive(client, key, { bind });
      assert(await l.acquire(), "held");
      await raw.del(key);
      await raw.set(key, "x");
      let e1: unknown = null;
      await l.extend().catch((e) => (e1 = e));
      assert(e1 instanceof LeaseLostError, `extend: LeaseLostError, not ${e1}`);
      assert(l.lost, "lost");
      let e2: unknown = null;
      await l.release().catch((e) => (e2 = e));
      assert(e2 instanceof LeaseLostError, `release: LeaseLostError, not ${e2}`);
      const m = Lock.exclusive(client, `${key}2`, { bind });
      assert(await m.acquire(), "held");
      await raw.del(`${key}2`);
      let e3: unknown = null;
      await m.release().catch((e) => (e3 = e));
      assert(e3 instanceof LeaseLostError, `release of a missing key: LeaseLostError, not ${e3}`);
      let why = "";
      // A lease a loaded machine keeps: the first renewal (a third of the
      // way) must be the one that hears WRONGTYPE, before the lease runs out.
      const n = Lock.exclusive(client, `${key}3`, { bind: false, ttl: 3000, onLost: (w) => (why = w) });
      assert(await n.acquire(), "held");
      await raw.del(`${key}3`);
      await raw.set(`${key}3`, "x");
      for (let i = 0; i < 300 && why === ""; i++) await sleep(20);
      assert(/WRONGTYPE/.test(why), `the renewal's WRONGTYPE told as lost: ${why}`);
      await n.release().catch(() => {});
    }
    raw.disconnect();
  });

  await test(`${label}: owner honoured by every kind, binary keys and owners`, async () => {
    const owner = Buffer.from([0, 0xff, 0x80, 0x41]);
    const t = tag();
    const k = (s: string) => Buffer.concat([Buffer.from(`${t}`), Buffer.from([0, 0xfe]), Buffer.from(s)]);
    const locks = [
      Lock.exclusive(client, k("x"), { owner }),
      Lock.reentrant(client, k("r"), { owner }),
      Lock.read(client, k("rd"), { owner }),
      Lock.write(client, k("wr"), { owner }),
      Lock.semaphore(client, k("s"), 3, { owner }),
      Lock.multi(client, [k("m1"), k("m2")], { owner }),
    ];
    for (const l of locks) {
      assert(await l.acquire(), "held");
      assert(Buffer.compare(l.owner as Buffer, owner) === 0, "owner kept");
      assert(await l.owned(), "owned()");
    }
    for (const key of ["x", "r", "rd", "wr", "s", "m1", "m2"]) {
      const hs = await holders(k(key));
      assert(hs.length === 1 && hs[0].equals(owner), `the server's holder of ${key} is the owner given`);
    }
    for (const l of locks) await l.release();
  });

  await test(`${label}: a mode change on one read-write object is the server's error at once`, async () => {
    const rw = Lock.readWrite(client, `${tag()}rw`);
    assert(Buffer.from(rw.read.owner).equals(Buffer.from(rw.write.owner)), "one owner");
    assert(await rw.read.acquire(), "read held");
    const t0 = Date.now();
    let err: unknown = null;
    await rw.write.acquire(5000).catch((e) => (err = e));
    assert(err !== null && /shared/.test(String((err as Error).message)), `the server's error: ${err}`);
    assert(Date.now() - t0 < 2000, "at once, not the 5 s wait");
    assert(await rw.read.owned(), "the read hold is unchanged");
    await rw.read.release();
  });

  await test(`${label}: bad input is a clear TypeError`, async () => {
    const cases: [string, () => unknown][] = [
      ["a plain string to Lock.multi", () => Lock.multi(client, "ab" as unknown as string[])],
      ["no keys", () => Lock.multi(client, [])],
      ["an empty key", () => Lock.exclusive(client, "")],
      ["an empty owner", () => Lock.exclusive(client, "k", { owner: "" })],
      ["a ttl of 0", () => Lock.exclusive(client, "k", { ttl: 0 })],
      ["a fractional ttl", () => Lock.exclusive(client, "k", { ttl: 1.5 })],
      ["a limit of 0", () => Lock.semaphore(client, "k", 0)],
      ["an unknown option", () => Lock.exclusive(client, "k", { wiat: 5 } as never)],
      ["not a client", () => Lock.exclusive({} as never, "k")],
    ];
    for (const [what, f] of cases) {
      let e: unknown = null;
      try {
        f();
      } catch (x) {
        e = x;
      }
      assert(e instanceof TypeError && /redis-native-lock: /.test((e as Error).message), `${what}: ${e}`);
    }
    let e: unknown = null;
    await Lock.exclusive(client, `${tag()}neg`).acquire(-1).catch((x) => (e = x));
    assert(e instanceof TypeError, "a negative wait");
  });

  await test(`${label}: await using acquires, releases at the end of the scope, reports a lost lease`, async () => {
    const key = `${tag()}au`;
    {
      await using held = await Lock.exclusive(client, key).hold(1000);
      assert(held.token > 0, "a token");
      assert(await held.lock.owned(), "held inside the scope");
    }
    assert(!(await Lock.exclusive(client, key).locked()), "released at the end of the scope");
    let err: unknown = null;
    try {
      await using held = await Lock.exclusive(client, key, { bind: false }).hold(1000);
      assert(held.token > 0, "a token");
      const raw = new Redis(port, "127.0.0.1");
      await raw.del(key);
      raw.disconnect();
    } catch (e) {
      err = e;
    }
    assert(err instanceof LeaseLostError, `the lost lease is thrown at the end of the scope: ${err}`);
  });
}

async function main(): Promise<void> {
  if (process.env.REDLOCK_PORTS) {
    await redlockTest();
    console.log(`${passed} passed, ${failed} failed`);
    process.exit(failed ? 1 : 0);
  }
  const io = new Redis(port, "127.0.0.1");
  const nr = createClient({ url: `redis://127.0.0.1:${port}` });
  nr.on("error", () => {}); // the CLIENT KILL test closes it too: it reconnects
  await nr.connect();
  await everyKind(io, "ioredis");
  await everyKind(nr, "node-redis");

  for (const [c, label] of [
    [io, "ioredis"],
    [nr, "node-redis"],
  ] as const) {
    await issueTests(c, label);
    await guardTests(c, label);
  }

  await test("ioredis: guard(), release(), extend() and a renewal send the grant's TOKEN (LOCK.GUARD, LOCK.RELEASE, LOCK.RENEW)", async () => {
    // No ready check (INFO) on the monitor's connection (session.ts says why).
    const base = new Redis(port, "127.0.0.1", { enableReadyCheck: false });
    const mon = await base.monitor();
    const seen: string[][] = [];
    mon.on("monitor", (_time: string, args: string[]) => seen.push(args));
    const t = tag();
    const l = Lock.exclusive(io, `${t}k`, { owner: "worker-1" });
    assert(await l.acquire(), "held");
    await l.guard("SET", "job:1", "done");
    await l.release();
    const m = Lock.multi(io, [`${t}m1`, `${t}m2`], { owner: "worker-1", bind: false, ttl: 1500 });
    assert(await m.acquire(), "held");
    await m.extend(1500);
    const renews = () => seen.filter((a) => a[0] === "LOCK.RENEW" && a[1] === `${t}m1`).length;
    for (let i = 0; i < 100 && renews() < 2; i++) await sleep(50); // extend()'s, then the keeper's (at 500 ms)
    await m.release();
    await sleep(50);
    mon.disconnect();
    base.disconnect();
    const sent = (want: string[]) => assert(seen.some((a) => JSON.stringify(a) === JSON.stringify(want)), `sent ${JSON.stringify(want)}; the monitor saw ${JSON.stringify(seen.filter((a) => a[0] === want[0]))}`);
    sent(["LOCK.GUARD", `${t}k`, "worker-1", "TOKEN", String(l.token), "CALL", "SET", "job:1", "done"]);
    sent(["LOCK.RELEASE", `${t}k`, "worker-1", "TOKEN", String(l.token)]);
    for (const [i, k] of [`${t}m1`, `${t}m2`].entries()) {
      sent(["LOCK.RELEASE", k, "worker-1", "TOKEN", String(m.tokens[i])]);
      assert(seen.filter((a) => JSON.stringify(a) === JSON.stringify(["LOCK.RENEW", k, "worker-1", "1500", "TOKEN", String(m.tokens[i])])).length >= 2, `extend() and a renewal of ${k} sent its token`);
    }
    assert(!seen.some((a) => (a[0] === "LOCK.RELEASE" || a[0] === "LOCK.RENEW") && a[1].startsWith(t) && a[a.length - 2] !== "TOKEN"), "no release or renewal without a token");
    await io.del("job:1");
  });

  await test("ioredis: a waiter is granted when the holder releases", async () => {
    const t = tag();
    const holder = Lock.exclusive(io, `${t}w`);
    assert(await holder.acquire(), "held");
    setTimeout(() => void holder.release(), 300);
    const start = Date.now();
    const waiter = Lock.exclusive(io, `${t}w`);
    assert(await waiter.acquire(5000), "granted after the release");
    assert(Date.now() - start < 3000, "in time");
    assert(waiter.bound, "bound to its own connection");
    await waiter.release();
  });

  await test("the keepalive renews; a deleted lock is signalled lost", async () => {
    for (const bind of [true, false]) {
      const key = `${tag()}k`;
      let why = "";
      // Past the ttl, held: renewed (every 1333 ms: a lease a loaded machine
      // keeps; at 2000 ms a stall of the process of 1.4 s let it run out).
      const l = Lock.exclusive(io, key, { ttl: 4000, bind, onLost: (w) => (why = w) });
      assert(await l.acquire(), "held");
      await sleep(4500);
      assert(!l.lost && (await l.owned()), "renewed");
      await io.del(key);
      // Told by the watcher (bound) or at the next renewal (not bound), waited for.
      for (let i = 0; i < 600 && !l.lost; i++) await sleep(50);
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
    assert(await Lock.exclusive(io2, key).acquire(500), "freed at once");
    io2.disconnect();
  });

  await test("DEADLOCK is its own error", async () => {
    const t = tag();
    const io3 = new Redis(port, "127.0.0.1");
    const a1 = Lock.exclusive(io3, `${t}d1`, { owner: "A" });
    const b2 = Lock.exclusive(io3, `${t}d2`, { owner: "B" });
    assert((await a1.acquire()) && (await b2.acquire()), "held");
    const aWaits = Lock.exclusive(io3, `${t}d2`, { owner: "A" });
    const pending = aWaits.acquire(5000);
    await sleep(300);
    let deadlock = false;
    await Lock.exclusive(io3, `${t}d1`, { owner: "B" })
      .acquire(5000)
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
    assert(String(await l.guard("SET", `${key}data`, "v")) === "OK", "a guarded SET");
    assert((await io.get(`app:${key}data`)) === "v" && (await io.get(`${key}data`)) === null, "the guarded command's key prefixed as in a direct call");
    assert(String(await l.guard("MSET", `${key}d1`, "1", `${key}d2`, "2")) === "OK", "a guarded MSET");
    assert((await io.mget(`app:${key}d1`, `app:${key}d2`)).join() === "1,2", "each of its keys prefixed");
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

  io.disconnect();
  await nr.disconnect();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

/** RedLock over five servers (REDLOCK_PORTS), REDLOCK_DOWN of them, the last ones, stopped. */
async function redlockTest(): Promise<void> {
  const ports = (process.env.REDLOCK_PORTS ?? "").split(",").filter(Boolean).map(Number);
  if (ports.length === 5) {
    const down = Number(process.env.REDLOCK_DOWN ?? 0);
    await test(`RedLock with ${down} of 5 servers stopped`, async () => {
      const servers = ports.map((p) => new Redis(p, "127.0.0.1", { maxRetriesPerRequest: 0, connectTimeout: 200, enableOfflineQueue: false, retryStrategy: () => null }));
      servers.forEach((s) => s.on("error", () => {}));
      await sleep(300);
      // The live servers connected (a loaded machine may take longer than the sleep; no offline queue here).
      for (const s of servers.slice(0, 5 - down)) for (let i = 0; i < 200 && s.status !== "ready"; i++) await sleep(50);
      const rl = new RedLock(servers, { retries: 2, retryDelay: 50 });
      const key = `red${tag()}`;
      const lease = await rl.acquire(key, 10_000);
      if (down <= 2) {
        assert(lease !== null && lease.tokens.size === 5 - down, "a quorum granted it");
        assert((await new RedLock(servers, { retries: 1 }).acquire(key, 10_000)) === null, "a second client is refused");
        assert(await rl.extend(lease!, 10_000), "extended on a quorum");
        assert((await rl.release(lease!)) === 5 - down, "released everywhere");
        const owner = Buffer.from([1, 0, 2]);
        const got = await rl.with(`${key}w`, 5000, async (l) => {
          assert(Buffer.from(l.owner).equals(owner), "the owner given");
          return l.tokens.size;
        }, { owner });
        assert(got === 5 - down, "with() held it on the live servers");
        // A stale lease (its grants gone, the same owner granted again) releases and extends nothing.
        const o = `redlock-worker-${tag()}`;
        const stale = await rl.acquire(`${key}s`, 10_000, { owner: o });
        assert(stale !== null, "the first lease");
        await Promise.all(servers.map((s) => s.del(`${key}s`).catch(() => 0)));
        const fresh = await rl.acquire(`${key}s`, 10_000, { owner: o });
        assert(fresh !== null && [...fresh.tokens.values()].every((tk, i) => tk > [...stale!.tokens.values()][i]), "the same owner granted again, newer tokens");
        assert(!(await rl.extend(stale!, 10_000)), "the stale lease's extend renews nothing");
        assert((await rl.release(stale!)) === 0, "the stale lease releases nothing");
        assert((await new RedLock(servers, { retries: 1 }).acquire(`${key}s`, 10_000)) === null, "the fresh lease still holds");
        assert((await rl.release(fresh!)) === 5 - down, "the fresh lease releases");
      } else {
        assert(lease === null, "no quorum");
      }
      servers.forEach((s) => s.disconnect());
    });
  }

}

main().catch((e) => {
  console.log(`FAIL main: ${e?.stack ?? e}`);
  console.log(`${passed} passed, ${failed + 1} failed`);
  process.exit(1);
});
