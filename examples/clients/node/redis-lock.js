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
// - Acquires with `LOCK.ACQUIRE key owner ttl WAIT ms BIND` on a connection
//   of its own (a duplicate of the client's: ioredis sends every command of a
//   client down one socket, so a command that blocks in the server would hold
//   up the others behind it). `BIND` ties the lock to that connection: if this
//   process dies, the server frees the lock the moment the connection closes,
//   not at the end of the lease.
// - One keepalive per connection (`LOCK.KEEPALIVE ttl` every ttl/3) renews it
//   while the work runs; it answers how many locks it renewed, so a lock
//   released or deleted behind our back shows as 0. It is stopped, and any
//   renewal in flight awaited, *before* the release: no renewal can outlive
//   the unlock. The holder connection is closed after the release (it is
//   nobody else's, so it can never carry a bound lock to another user).
// - `bind: false` (or a server that refuses `BIND`): a lease watchdog with
//   `LOCK.RENEW` on the client's own connection instead. The owner is a fresh
//   UUID per acquisition.
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
  constructor(redis, key, owner, token, ttlMs, sent, holder = null) {
    this.key = key;
    this.owner = owner;
    this.token = BigInt(token);
    this.ttlMs = ttlMs;
    // The connection the lock is bound to (BIND), this lease's alone.
    this._holder = holder;
    this._redis = holder || redis;
    // A lower bound of the server's deadline: the lease began after we asked.
    this._validUntil = sent + ttlMs;
    this._why = null;
    this._abort = new AbortController();
    this._stopped = false;
    this._timer = null;
    this._inflight = Promise.resolve();
  }

  /** True when the lock is bound to a connection of its own (BIND). */
  get bound() {
    return this._holder !== null;
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
      renewed = this.bound
        ? await this._redis.call('LOCK.KEEPALIVE', this.ttlMs)
        : await this._redis.call('LOCK.RENEW', this.key, this.owner, this.ttlMs);
    } catch (e) {
      // Transient (connection lost, timeout): try again at the next tick,
      // unless the lease may have run out meanwhile. (ioredis reconnects a
      // bound holder's connection by itself; the server freed the lock when
      // the old one closed, and the next keepalive answers 0.)
      if (now() >= this._validUntil) {
        this._lose(`renewal failed until the ttl ran out (${e.message})`);
        return false;
      }
      return true;
    }
    if (renewed >= 1) {
      this._validUntil = sent + this.ttlMs;
      return true;
    }
    this._lose(
      this.bound
        ? 'LOCK.KEEPALIVE renewed nothing: the lock was released, expired or deleted'
        : 'LOCK.RENEW answered 0: the lease expired or the key was deleted',
    );
    return false;
  }

  /** Stops the watchdog (waiting for a renewal in flight), then releases. */
  async _end() {
    this._stopped = true;
    clearTimeout(this._timer);
    await this._inflight;
    try {
      const released = await this._redis.call('LOCK.RELEASE', this.key, this.owner);
      if (released === null) this._lose('LOCK.RELEASE answered nil: the lock was no longer ours');
      return released;
    } finally {
      // Closing the holder connection frees whatever it may still hold.
      if (this._holder) this._holder.disconnect();
    }
  }
}

/**
 * Runs `work(lease)` holding `key`; returns what it returns.
 * options.ttlMs: the lease (renewed while the work runs), default 30000.
 * options.waitMs: how long to wait in the server (0: no limit; null: do not wait), default 10000.
 * options.owner: a fresh UUID by default; pass a stable id only if you mean it.
 * options.bind: tie the lock to a connection of its own (freed at once if
 *   this process dies) with one keepalive, default true; false: a lease watchdog.
 */
async function withLock(redis, key, options, work) {
  const { ttlMs = 30000, waitMs = 10000, owner = crypto.randomUUID(), bind = true } =
    options || {};
  const args = ['LOCK.ACQUIRE', key, owner, ttlMs];
  if (waitMs !== null && waitMs !== undefined) args.push('WAIT', waitMs);
  const sent = now();
  let token;
  let holder = null;
  if (bind) {
    holder = redis.duplicate();
    try {
      token = await holder.call(...args, 'BIND');
    } catch (e) {
      // Closing the connection frees the lock if it was granted meanwhile.
      holder.disconnect();
      holder = null;
      if (!/syntax error/i.test(e.message)) throw e;
      token = undefined; // a server without BIND: the lease watchdog below
    }
    if (token === null && holder) {
      holder.disconnect();
      holder = null;
    }
  }
  if (token !== undefined) {
    // decided above (granted and bound, or refused)
  } else if (args.length > 4) {
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

  const lease = new Lease(redis, key, owner, token, ttlMs, sent, holder);
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
