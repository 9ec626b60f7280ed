// RedLock over independent servers.

import { adapt, Arg, RedisClient, Reply } from "./clients";
import { Bytes, checkBytes, checkInt, randomOwner, show } from "./checks";
import { LeaseLostError, LockNotAcquiredError } from "./errors";

export interface RedLockOptions {
  /** Attempts (default 3). */
  retries?: number;
  /** Up to this many ms (random) between attempts (default 200). */
  retryDelay?: number;
  /** Clock drift allowance, a fraction of the ttl (default 0.01). */
  driftFactor?: number;
  /** Timeout of each command on each server, ms (default: each client's, as for Lock; never past the ttl). */
  timeout?: number;
}

export interface RedLockLease {
  readonly key: Bytes;
  readonly owner: Bytes;
  /** Server index -> fencing token, for the servers that granted it. */
  readonly tokens: Map<number, number>;
  /** Date.now() past which the lease may have ended anywhere. */
  validUntil: number;
}

/** RedLock over independent servers (clients of independent masters). */
export class RedLock {
  readonly quorum: number;
  private opts: RedLockOptions;
  constructor(
    private servers: RedisClient[],
    opts: RedLockOptions = {},
  ) {
    if (!Array.isArray(servers) || servers.length === 0) throw new TypeError("redis-native-lock: RedLock takes a non-empty array of clients");
    for (const k of Object.keys(opts)) if (!["retries", "retryDelay", "driftFactor", "timeout"].includes(k)) throw new TypeError(`redis-native-lock: unknown RedLock option ${JSON.stringify(k)}`);
    this.opts = opts;
    this.quorum = Math.floor(servers.length / 2) + 1;
  }

  /** `command(i)` on every server i at once; a server it gives null for is not asked (its reply: null). */
  private async each(command: (server: number) => Arg[] | null, limit: number): Promise<(Reply | Error)[]> {
    return Promise.all(
      this.servers.map(async (s, i) => {
        const args = command(i);
        if (args === null) return null;
        try {
          const a = adapt(s, args[1] as Bytes, this.opts.timeout);
          return await a.shared.call(args, Math.min(a.timeout, limit));
        } catch (e) {
          return e instanceof Error ? e : new Error(String(e));
        }
      }),
    );
  }

  /** A lease (`tokens` per server that granted it) or null when no quorum granted it within the ttl. */
  async acquire(key: Bytes, ttl: number, opts: { owner?: Bytes } = {}): Promise<RedLockLease | null> {
    checkBytes(key, "key");
    checkInt(ttl, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    const owner = opts.owner === undefined ? randomOwner() : checkBytes(opts.owner, "owner");
    const retries = this.opts.retries ?? 3;
    for (let attempt = 0; attempt < retries; attempt++) {
      if (attempt) await new Promise((r) => setTimeout(r, Math.random() * (this.opts.retryDelay ?? 200)));
      const started = Date.now();
      const replies = await this.each(() => ["LOCK.ACQUIRE", key, owner, ttl], ttl);
      const tokens = new Map<number, number>();
      replies.forEach((r, i) => {
        if (typeof r === "number") tokens.set(i, r);
      });
      const validity = ttl - (Date.now() - started) - (ttl * (this.opts.driftFactor ?? 0.01) + 2);
      if (tokens.size >= this.quorum && validity > 0) return { key, owner, tokens, validUntil: started + validity };
      // No quorum: give back each grant (by its token), and by owner where the reply never came (a grant may have crossed it).
      await this.each((i) => (tokens.has(i) ? ["LOCK.RELEASE", key, owner, "TOKEN", tokens.get(i)!] : replies[i] instanceof Error ? ["LOCK.RELEASE", key, owner] : null), ttl);
    }
    return null;
  }

  /** Renews the lease's grant on every server that granted it (`LOCK.RENEW ... TOKEN`: never a later grant to the same owner name); true when a quorum renewed it within the ttl (`validUntil` updated). */
  async extend(lease: RedLockLease, ttl: number): Promise<boolean> {
    checkInt(ttl, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    const started = Date.now();
    const replies = await this.each((i) => (lease.tokens.has(i) ? ["LOCK.RENEW", lease.key, lease.owner, ttl, "TOKEN", lease.tokens.get(i)!] : null), ttl);
    const renewed = replies.filter((r) => r === 1).length;
    const validity = ttl - (Date.now() - started) - (ttl * (this.opts.driftFactor ?? 0.01) + 2);
    if (renewed >= this.quorum && validity > 0) {
      lease.validUntil = started + validity;
      return true;
    }
    return false;
  }

  /** Releases the lease's grant on every server that granted it (`LOCK.RELEASE ... TOKEN`: never a later grant to the same owner name); how many released it. */
  async release(lease: RedLockLease): Promise<number> {
    return (await this.each((i) => (lease.tokens.has(i) ? ["LOCK.RELEASE", lease.key, lease.owner, "TOKEN", lease.tokens.get(i)!] : null), Infinity)).filter((r) => r === 0 || r === 1).length;
  }

  /** Holds the lease for `work`: LockNotAcquiredError without a quorum; LeaseLostError if the lease's validity ran out before the work ended. */
  async with<T>(key: Bytes, ttl: number, work: (lease: RedLockLease) => Promise<T>, opts: { owner?: Bytes } = {}): Promise<T> {
    const lease = await this.acquire(key, ttl, opts);
    if (lease === null) throw new LockNotAcquiredError(`${show([key])}: no quorum of ${this.quorum}`);
    let out: T;
    try {
      out = await work(lease);
    } finally {
      await this.release(lease);
    }
    if (Date.now() > lease.validUntil) throw new LeaseLostError(`RedLock lease on ${show([key])} ended before the work did`);
    return out;
  }
}
