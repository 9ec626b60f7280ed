/**
 * Locks for the redis-lock Redis module, for ioredis (`Redis`, `Cluster`)
 * and node-redis (`createClient`, `createCluster`).
 *
 *     import Redis from "ioredis";
 *     import { Lock } from "redis-native-lock";
 *
 *     const lock = Lock.exclusive(new Redis(), "orders:42", { ttl: 30_000 });
 *     await lock.with(async (l) => {
 *       l.check();                                 // throws LeaseLostError if the lease is gone
 *       await storage.write(data, l.token);        // the fencing token
 *     });
 *
 * The kinds: `Lock.exclusive` (LOCK.ACQUIRE), `Lock.reentrant`
 * (LOCK.RACQUIRE), `Lock.read` / `Lock.write` (a read-write lock),
 * `Lock.semaphore` (one permit of `limit`), `Lock.multi` (every key or none;
 * `tokens` per key). Times are milliseconds.
 *
 * A holder acquires on a connection of its own (`duplicate()` of the
 * client, without a command timeout: the reply comes when the lock frees)
 * with BIND, so the server frees the lock the moment this process or that
 * connection dies, and one keepalive timer per held connection sends
 * LOCK.KEEPALIVE at a third of the ttl. With `bind: false`, on a cluster
 * client, or on a server without BIND: LOCK.RENEW through the client. A
 * lost lease sets `lost`, aborts `signal`, calls `onLost`, and makes
 * `check()` and `release()` throw LeaseLostError. ioredis's `keyPrefix` is
 * applied to the keys.
 */

export class LockError extends Error {}

/** Waiting would have closed a cycle of lock waits: nothing changed. */
export class DeadlockError extends LockError {}

/** The lease ended before the holder let go. */
export class LeaseLostError extends LockError {}

/** Not granted within the wait (`with`). */
export class LockNotAcquiredError extends LockError {}

export interface LockOptions {
  /** The lease, ms (default 30 000), renewed while held. */
  ttl?: number;
  /** How long to wait in the server, ms (default 10 000); 0 or null: do not wait; Infinity: without limit. */
  wait?: number | null;
  /** A fresh random id by default. */
  owner?: string;
  /** BIND to a connection of its own (default true). */
  bind?: boolean;
  /** Called once when the lease is found lost. */
  onLost?: (why: string) => void;
}

type Reply = null | number | string | Buffer | Reply[];

/** What the lock needs from a client or a connection. */
interface Conn {
  call(args: (string | number)[]): Promise<Reply>;
  close(): Promise<void>;
}

interface Adapter {
  /** Commands through the client itself (routed by the client in a cluster). */
  shared: Conn;
  /** A connection of its own without command timeout, or null where the client cannot make one (clusters). */
  dedicated(): Promise<Conn | null>;
  prefix: string;
}

function randomOwner(): string {
  // crypto.randomUUID is in Node 14.17+.
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  return require("crypto").randomUUID();
}

function isIoredis(c: any): boolean {
  return typeof c?.call === "function" && typeof c?.duplicate === "function" && c?.options !== undefined;
}

function isIoredisCluster(c: any): boolean {
  return typeof c?.call === "function" && typeof c?.nodes === "function";
}

function isNodeRedisCluster(c: any): boolean {
  return typeof c?.sendCommand === "function" && typeof c?.getMasters === "function";
}

function adapt(client: any, firstKey: string): Adapter {
  if (isIoredisCluster(client)) {
    const prefix: string = client.options?.keyPrefix ?? "";
    return {
      prefix,
      shared: {
        call: (args) => client.call(String(args[0]), ...args.slice(1)),
        close: async () => {},
      },
      dedicated: async () => null,
    };
  }
  if (isIoredis(client)) {
    const prefix: string = client.options?.keyPrefix ?? "";
    return {
      prefix,
      shared: {
        call: (args) => client.call(String(args[0]), ...args.slice(1)),
        close: async () => {},
      },
      dedicated: async () => {
        const c = client.duplicate({ commandTimeout: undefined, lazyConnect: false, keyPrefix: undefined, enableOfflineQueue: true });
        return {
          call: (args: (string | number)[]) => c.call(String(args[0]), ...args.slice(1)),
          close: async () => {
            c.disconnect();
          },
        };
      },
    };
  }
  if (isNodeRedisCluster(client)) {
    return {
      prefix: "",
      shared: {
        call: (args) => client.sendCommand(firstKey, false, args.map(String)),
        close: async () => {},
      },
      dedicated: async () => null,
    };
  }
  if (typeof client?.sendCommand === "function" && typeof client?.duplicate === "function") {
    return {
      prefix: "",
      shared: {
        call: (args) => client.sendCommand(args.map(String)),
        close: async () => {},
      },
      dedicated: async () => {
        const c = client.duplicate();
        c.on("error", () => {});
        await c.connect();
        return {
          call: (args: (string | number)[]) => c.sendCommand(args.map(String)),
          close: async () => {
            await c.disconnect().catch(() => {});
          },
        };
      },
    };
  }
  throw new TypeError("redis-native-lock: an ioredis Redis or Cluster, or a node-redis client or cluster, is needed");
}

type Kind =
  | { verb: "LOCK.ACQUIRE" | "LOCK.RACQUIRE" | "LOCK.READ"; keys: string[] }
  | { verb: "LOCK.SEMAPHORE"; keys: string[]; limit: number }
  | { verb: "LOCK.MACQUIRE"; keys: string[] };

function deadlockOrSelf(e: unknown): unknown {
  const msg = String((e as Error)?.message ?? e);
  return msg.startsWith("DEADLOCK") ? new DeadlockError(msg) : e;
}

export class Lock {
  readonly owner: string;
  /** The fencing token (a multi-key lock: the highest of `tokens`). */
  token: number | null = null;
  /** The tokens per key, in key order. */
  tokens: number[] = [];
  private ttl: number;
  private wait: number | null;
  private bind: boolean;
  private onLost?: (why: string) => void;
  private adapter: Adapter;
  private keys: string[];
  private conn: Conn | null = null;
  private holds = 0;
  private timer: NodeJS.Timeout | null = null;
  private validUntil = 0;
  private lostWhy: string | null = null;
  private controller = new AbortController();

  private constructor(client: unknown, private kind: Kind, opts: LockOptions = {}) {
    this.adapter = adapt(client, kind.keys[0]);
    this.keys = kind.keys.map((k) => this.adapter.prefix + k);
    this.ttl = opts.ttl ?? 30_000;
    this.wait = opts.wait === undefined ? 10_000 : opts.wait;
    this.bind = opts.bind ?? true;
    this.owner = opts.owner ?? randomOwner();
    this.onLost = opts.onLost;
  }

  static exclusive(client: unknown, key: string, opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.ACQUIRE", keys: [key] }, opts);
  }
  static reentrant(client: unknown, key: string, opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.RACQUIRE", keys: [key] }, opts);
  }
  static read(client: unknown, key: string, opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.READ", keys: [key] }, opts);
  }
  static write(client: unknown, key: string, opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.RACQUIRE", keys: [key] }, opts);
  }
  static semaphore(client: unknown, key: string, limit: number, opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.SEMAPHORE", keys: [key], limit }, opts);
  }
  static multi(client: unknown, keys: string[], opts?: LockOptions): Lock {
    return new Lock(client, { verb: "LOCK.MACQUIRE", keys }, opts);
  }

  /** Whether the lock is bound to its own connection (BIND). */
  get bound(): boolean {
    return this.conn !== null;
  }

  /** True once the lease is known lost, or may have run out. */
  get lost(): boolean {
    return this.holds > 0 && (this.lostWhy !== null || Date.now() >= this.validUntil);
  }

  /** Aborted when the lease is found lost. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Throws LeaseLostError if the lease is gone: call it before a protected write. */
  check(): void {
    if (this.lost) throw new LeaseLostError(this.message());
  }

  private message(): string {
    return `lease on ${JSON.stringify(this.kind.keys)} (token ${this.token}) lost: ${this.lostWhy ?? "its ttl ran out without a successful renewal"}`;
  }

  private args(wait: number | null, bind: boolean): (string | number)[] {
    const k = this.kind;
    let a: (string | number)[];
    if (k.verb === "LOCK.MACQUIRE") a = [k.verb, this.keys.length, ...this.keys, this.owner, this.ttl];
    else if (k.verb === "LOCK.SEMAPHORE") a = [k.verb, this.keys[0], k.limit, this.owner, this.ttl];
    else a = [k.verb, this.keys[0], this.owner, this.ttl];
    if (wait !== null && wait !== 0) a.push("WAIT", wait === Infinity ? 0 : Math.max(1, Math.round(wait)));
    if (bind) a.push("BIND");
    return a;
  }

  private get via(): Conn {
    return this.conn ?? this.adapter.shared;
  }

  /**
   * Asks for the lock, waiting in the server up to `wait` ms. True when
   * granted (`token`), false when the wait ran out; DeadlockError when
   * waiting would close a cycle of waits.
   */
  async acquire(wait: number | null = this.wait): Promise<boolean> {
    const first = this.holds === 0;
    if (first && this.bind && this.conn === null) {
      this.conn = await this.adapter.dedicated();
    }
    const sent = Date.now();
    let reply: Reply;
    try {
      reply = await this.via.call(this.args(wait, this.conn !== null));
    } catch (e) {
      if (first && this.conn !== null && /syntax error/i.test(String((e as Error)?.message))) {
        await this.closeConn();
        this.bind = false;
        return this.acquire(wait);
      }
      if (first) await this.closeConn();
      throw deadlockOrSelf(e);
    }
    if (reply === null) {
      if (first) await this.closeConn();
      return false;
    }
    this.tokens = Array.isArray(reply) ? reply.map(Number) : [Number(reply)];
    this.token = Math.max(...this.tokens);
    const counted = this.kind.verb === "LOCK.RACQUIRE" || this.kind.verb === "LOCK.READ";
    this.holds = counted ? this.holds + 1 : 1;
    this.lostWhy = null;
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.validUntil = sent + this.ttl;
    if (this.timer === null) {
      this.timer = setInterval(() => void this.renew(), Math.max(1, Math.floor(this.ttl / 3)));
      this.timer.unref?.();
    }
    return true;
  }

  private async renew(): Promise<void> {
    if (this.holds === 0 || this.lostWhy !== null) return;
    const sent = Date.now();
    try {
      let ok: boolean;
      if (this.conn !== null) {
        const n = Number(await this.conn.call(["LOCK.KEEPALIVE", this.ttl]));
        ok = n >= this.keys.length;
      } else {
        ok = true;
        for (const k of this.keys) {
          if (Number(await this.adapter.shared.call(["LOCK.RENEW", k, this.owner, this.ttl])) !== 1) ok = false;
        }
      }
      if (ok) this.validUntil = sent + this.ttl;
      else
        this.lose(
          this.conn !== null
            ? "LOCK.KEEPALIVE renewed fewer locks than held: released, expired or deleted"
            : "LOCK.RENEW answered 0: the lease expired or the key was deleted",
        );
    } catch (e) {
      if (this.conn !== null) this.lose(`the connection the lock was bound to failed (${(e as Error)?.message})`);
      else if (Date.now() >= this.validUntil) this.lose(`renewals failed until the lease ran out (${(e as Error)?.message})`);
    }
  }

  private lose(why: string): void {
    if (this.lostWhy !== null) return;
    this.lostWhy = why;
    this.stopTimer();
    this.controller.abort(new LeaseLostError(this.message()));
    try {
      this.onLost?.(why);
    } catch {
      // a callback must not break the keepalive
    }
  }

  private stopTimer(): void {
    if (this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  private async closeConn(): Promise<void> {
    const c = this.conn;
    this.conn = null;
    if (c !== null) await c.close();
  }

  /** Sets the lease to `ttl` ms from now (default: the lock's); throws LeaseLostError if no longer held. */
  async extend(ttl: number = this.ttl): Promise<void> {
    if (this.holds === 0) throw new LockError("extend() of a lock not held");
    const sent = Date.now();
    for (const k of this.keys) {
      if (Number(await this.via.call(["LOCK.RENEW", k, this.owner, ttl])) !== 1) {
        this.lose("LOCK.RENEW answered 0: the lease expired or the key was deleted");
        throw new LeaseLostError(this.message());
      }
    }
    this.ttl = ttl;
    this.validUntil = sent + ttl;
  }

  /** Gives back one hold (all of a non-reentrant lock); throws LeaseLostError if it was no longer ours. */
  async release(): Promise<void> {
    if (this.holds === 0) throw new LockError("release() of a lock not held");
    let replies: Reply[];
    try {
      replies = [];
      for (const k of this.keys) replies.push(await this.via.call(["LOCK.RELEASE", k, this.owner]));
    } catch (e) {
      this.holds = 0;
      this.stopTimer();
      await this.closeConn();
      throw e;
    }
    const gone = replies.some((r) => r === null);
    const counted = this.kind.verb === "LOCK.RACQUIRE" || this.kind.verb === "LOCK.READ";
    this.holds = gone || !counted || replies.some((r) => Number(r) === 1) ? 0 : this.holds - 1;
    if (this.holds === 0) {
      this.stopTimer();
      await this.closeConn();
    }
    if (gone) {
      this.lose("LOCK.RELEASE answered nil: the lock was no longer ours");
      throw new LeaseLostError(this.message());
    }
  }

  /** Holds the lock for `work`: LockNotAcquiredError if not granted in time, LeaseLostError if the lease was lost. */
  async with<T>(work: (lock: Lock) => Promise<T>): Promise<T> {
    if (!(await this.acquire())) throw new LockNotAcquiredError(`${JSON.stringify(this.kind.keys)} not acquired within ${this.wait} ms`);
    let out: T;
    try {
      out = await work(this);
    } catch (e) {
      await this.release().catch(() => {});
      throw e;
    }
    await this.release();
    return out;
  }

  /** `await using lock = ...` (TypeScript 5.2+): released at the end of the scope. */
  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")](): Promise<void> {
    if (this.holds > 0) await this.release().catch(() => {});
  }

  /** Whether anyone holds the (first) key. */
  async locked(): Promise<boolean> {
    return (await this.adapter.shared.call(["LOCK.INFO", this.keys[0]])) !== null;
  }

  /** Whether this owner holds the (first) key, as the server says. */
  async owned(): Promise<boolean> {
    const info = await this.adapter.shared.call(["LOCK.INFO", this.keys[0]]);
    if (!Array.isArray(info)) return false;
    for (let i = 0; i + 1 < info.length; i += 2) {
      if (String(info[i]) === "holders") {
        const hs = info[i + 1];
        return Array.isArray(hs) && hs.some((h) => Array.isArray(h) && String(h[0]) === this.owner);
      }
    }
    return false;
  }
}

/** RedLock over independent servers (clients of independent masters). */
export class RedLock {
  readonly quorum: number;
  constructor(
    private servers: unknown[],
    private opts: { retries?: number; retryDelay?: number; driftFactor?: number } = {},
  ) {
    this.quorum = Math.floor(servers.length / 2) + 1;
  }

  private async each(args: (string | number)[]): Promise<Reply[]> {
    return Promise.all(
      this.servers.map(async (s) => {
        try {
          return await adapt(s, String(args[1])).shared.call(args);
        } catch {
          return null;
        }
      }),
    );
  }

  /** `{ owner, tokens, validUntil }` or null when no quorum granted it. */
  async acquire(key: string, ttl: number): Promise<{ key: string; owner: string; tokens: Map<number, number>; validUntil: number } | null> {
    const owner = randomOwner();
    const retries = this.opts.retries ?? 3;
    for (let attempt = 0; attempt < retries; attempt++) {
      if (attempt) await new Promise((r) => setTimeout(r, Math.random() * (this.opts.retryDelay ?? 200)));
      const started = Date.now();
      const replies = await this.each(["LOCK.ACQUIRE", key, owner, ttl]);
      const tokens = new Map<number, number>();
      replies.forEach((r, i) => {
        if (typeof r === "number") tokens.set(i, r);
      });
      const validity = ttl - (Date.now() - started) - (ttl * (this.opts.driftFactor ?? 0.01) + 2);
      if (tokens.size >= this.quorum && validity > 0) return { key, owner, tokens, validUntil: started + validity };
      await this.each(["LOCK.RELEASE", key, owner]);
    }
    return null;
  }

  /** Releases on every server; how many released a hold. */
  async release(lease: { key: string; owner: string }): Promise<number> {
    return (await this.each(["LOCK.RELEASE", lease.key, lease.owner])).filter((r) => r !== null).length;
  }
}
