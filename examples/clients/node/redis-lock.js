'use strict';
// A lock helper for the redis-lock module, with ioredis.
//
//   const Redis = require('ioredis');
//   const { withLock, LeaseLost, LockNotAcquired } = require('./redis-lock');
//
//   const redis = new Redis({ host: '127.0.0.1', port: 6379 });
//   await withLock(redis, 'orders:42', { ttlMs: 30000, waitMs: 10000 }, async (lease) => {
//     await doTheWork({ signal: lease.signal });   // aborted if the lease is lost
//     lease.check();                               // throws LeaseLost if it was
//     await storage.write(data, { fencingToken: lease.token });
//   });
//
// - Acquires with `LOCK.ACQUIRE key owner ttl WAIT ms` on a duplicate of the
//   connection: ioredis sends every command of a client down one socket, so a
//   command that blocks in the server would hold up the renewals behind it.
// - A watchdog renews the lease every ttl/3 while the work runs. It is stopped,
//   and any renewal in flight awaited, *before* the release: no renewal can
//   outlive the unlock. The owner is a fresh UUID per acquisition.
// - The release runs in `finally`, also when the work throws.
// - If the lease is lost (a renewal answered 0, the release answered nil),
//   `lease.signal` aborts at once, `lease.check()` throws, and withLock throws
//   LeaseLost once the work returns: what the work did after that point was
//   protected only by the fencing token.
// - Tokens are returned as BigInt (64-bit integers; compare them with `<`).

const crypto = require('node:crypto');

class LockError extends Error {}
class LockNotAcquired extends LockError {}
class LeaseLost extends LockError {}
for (const E of [LockError, LockNotAcquired, LeaseLost]) {
  Object.defineProperty(E.prototype, 'name', { value: E.name });
}

const now = () => performance.now(); // monotonic, ms

class Lease {
  constructor(redis, key, owner, token, ttlMs, sent) {
    this.key = key;
    this.owner = owner;
    this.token = BigInt(token);
    this.ttlMs = ttlMs;
    this._redis = redis;
    // A lower bound of the server's deadline: the lease began after we asked.
    this._validUntil = sent + ttlMs;
    this._why = null;
    this._abort = new AbortController();
    this._stopped = false;
    this._timer = null;
    this._inflight = Promise.resolve();
  }

  /** Aborted the moment the lease is known to be lost. */
  get signal() {
    return this._abort.signal;
  }

  /** True once the lease is gone, or may have run out. */
  get lost() {
    return this._abort.signal.aborted || now() >= this._validUntil;
  }

  /** Throws LeaseLost if the lease is gone: call it before a protected write. */
  check() {
    if (this.lost) throw new LeaseLost(this._message());
  }

  _message() {
    const why = this._why || 'its ttl ran out without a successful renewal';
    return `lease on '${this.key}' (token ${this.token}) lost: ${why}`;
  }

  _lose(why) {
    if (this._why === null) this._why = why;
    this._abort.abort(new LeaseLost(this._message()));
  }

  _startWatchdog() {
    const tick = () => {
      this._timer = setTimeout(() => {
        this._inflight = this._renew().then((again) => {
          if (again && !this._stopped) tick();
        });
      }, this.ttlMs / 3);
    };
    tick();
  }

  async _renew() {
    if (this._stopped) return false;
    const sent = now();
    let renewed;
    try {
      renewed = await this._redis.call('LOCK.RENEW', this.key, this.owner, this.ttlMs);
    } catch (e) {
      // Transient (connection lost, timeout): try again at the next tick,
      // unless the lease may have run out meanwhile.
      if (now() >= this._validUntil) {
        this._lose(`renewal failed until the ttl ran out (${e.message})`);
        return false;
      }
      return true;
    }
    if (renewed === 1) {
      this._validUntil = sent + this.ttlMs;
      return true;
    }
    this._lose('LOCK.RENEW answered 0: the lease expired or the key was deleted');
    return false;
  }

  /** Stops the watchdog (waiting for a renewal in flight), then releases. */
  async _end() {
    this._stopped = true;
    clearTimeout(this._timer);
    await this._inflight;
    const released = await this._redis.call('LOCK.RELEASE', this.key, this.owner);
    if (released === null) this._lose('LOCK.RELEASE answered nil: the lock was no longer ours');
    return released;
  }
}

/**
 * Runs `work(lease)` holding `key`; returns what it returns.
 * options.ttlMs: the lease (renewed while the work runs), default 30000.
 * options.waitMs: how long to wait in the server (0: no limit; null: do not wait), default 10000.
 * options.owner: a fresh UUID by default; pass a stable id only if you mean it.
 */
async function withLock(redis, key, options, work) {
  const { ttlMs = 30000, waitMs = 10000, owner = crypto.randomUUID() } = options || {};
  const args = ['LOCK.ACQUIRE', key, owner, ttlMs];
  if (waitMs !== null && waitMs !== undefined) args.push('WAIT', waitMs);
  const sent = now();
  let token;
  if (args.length > 4) {
    const waiter = redis.duplicate();
    try {
      token = await waiter.call(...args);
    } catch (e) {
      // It may have been granted as we stopped listening: give it back.
      await redis.call('LOCK.RELEASE', key, owner).catch(() => {});
      throw e;
    } finally {
      waiter.disconnect();
    }
  } else {
    token = await redis.call(...args);
  }
  if (token === null) throw new LockNotAcquired(`'${key}' not acquired within ${waitMs} ms`);

  const lease = new Lease(redis, key, owner, token, ttlMs, sent);
  lease._startWatchdog();
  let result;
  try {
    result = await work(lease);
  } catch (e) {
    // The work failed: release, and let its own error through.
    await lease._end().catch(() => {});
    throw e;
  }
  if ((await lease._end()) === null) throw new LeaseLost(lease._message());
  return result;
}

module.exports = { withLock, Lease, LockError, LockNotAcquired, LeaseLost };
