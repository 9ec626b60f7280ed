/**
 * Locks for the redis-lock Redis module, for ioredis (`Redis`, `Cluster`)
 * and node-redis (`createClient`, `createCluster`).
 *
 *     import { Redis } from "ioredis";
 *     import { Lock } from "redis-native-lock";
 *
 *     const lock = Lock.exclusive(new Redis(), "orders:42", { ttl: 30_000, wait: 10_000 });
 *     await lock.with(async (l) => {
 *       l.check();                                 // throws LeaseLostError if the lease is gone
 *       await storage.write(data, l.token);        // the fencing token
 *     });
 *     {
 *       await using held = await Lock.exclusive(redis, "orders:42").hold(10_000);
 *       ...                                        // released at the end of the scope
 *     }
 *
 * The kinds: `Lock.exclusive` (LOCK.ACQUIRE), `Lock.reentrant`
 * (LOCK.RACQUIRE), `Lock.readWrite` -> `{ read, write }` sharing one owner,
 * `Lock.read` / `Lock.write` (a read-write lock), `Lock.semaphore` (one
 * permit of `limit`), `Lock.multi` (every key or none; `tokens` per key).
 * Times are milliseconds. Keys and owners are strings or Buffers. One Lock
 * object is one holder: its second acquire() while it holds or acquires is
 * a LockError (give each task its own Lock); a reentrant, read or write
 * lock's next hold is `reacquire()`.
 *
 * The files: `lock.ts` (Lock, Held), `session.ts` (Session: one lease for
 * many locks, LOCK.SESSION), `redlock.ts`, `clients.ts` (ioredis and
 * node-redis behind one Adapter), `watcher.ts` (the invalidation watcher),
 * `errors.ts`, `checks.ts` (argument checks).
 *
 * A holder acquires on a connection of its own (`duplicate()` of the
 * client, no reconnects, connect timeout from the client's settings) with
 * BIND, so the server frees the lock the moment this process or that
 * connection dies; a timer per held connection sends LOCK.KEEPALIVE at a
 * third of the ttl. A bound lock hears at once when its key is deleted,
 * overwritten or freed by anyone else: one watcher per client (a RESP2
 * subscriber to `__redis__:invalidate`) gets the server's invalidations for
 * the keys each bound connection tracks (`CLIENT TRACKING ON REDIRECT`).
 * With `bind: false`, on a cluster client, or on a server
 * without BIND: LOCK.RENEW through the client, a loss found at a renewal. Every command has a timeout
 * (the client's command timeout, else its connect timeout; a renewal's
 * never past the end of the lease). A lost lease sets `lost` (it stays
 * true), aborts `signal`, calls `onLost`, and makes `check()` and
 * `release()` throw LeaseLostError. ioredis's `keyPrefix` is applied to the
 * keys. With `replicas: N`, `WAIT N replicasTimeout` follows each grant and
 * renewal on its connection: a grant fewer replicas acknowledged is released
 * (NotDurableError) or, with `allowNotDurable`, kept with `durable` false; a
 * renewal fewer acknowledged calls `onNotDurable`.
 */

export { DeadlockError, LeaseLostError, LockError, LockNotAcquiredError, LockTimeoutError, NotDurableError } from "./errors";
export type { Bytes } from "./checks";
export type { IoredisClient, NodeRedisClient, RedisClient } from "./clients";
export { Held, Lock } from "./lock";
export type { LockOptions } from "./lock";
export { RedLock } from "./redlock";
export { Session } from "./session";
export type { SessionOptions } from "./session";
export type { RedLockLease, RedLockOptions } from "./redlock";
