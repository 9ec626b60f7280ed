// Lock (every kind, one holder per object) and Held (what `await using` releases).

import { Adapter, adapt, Arg, Conn, RedisClient, Reply } from "./clients";
import { Bytes, checkBytes, checkInt, checkWait, randomOwner, show } from "./checks";
import { deadlockOrSelf, errorText, LeaseLostError, LockError, LockNotAcquiredError, LockTimeoutError, NotDurableError } from "./errors";
import { Watched } from "./watcher";
import { NodeSession, Session, SessionLock } from "./session";

// `await using` needs Symbol.asyncDispose at run time (Node 18.18+, 20.4+ have it).
const symbols = Symbol as unknown as { asyncDispose?: symbol };
if (symbols.asyncDispose === undefined) symbols.asyncDispose = Symbol.for("Symbol.asyncDispose");

export interface LockOptions {
  /** The lease, ms (default 30 000), renewed while held. */
  ttl?: number;
  /** How long `with()` and `hold()` wait in the server, ms (default 10 000); 0: do not wait; Infinity: without limit. `acquire()` takes its own argument (default: do not wait). */
  wait?: number;
  /** Non-empty; a fresh random id by default. */
  owner?: Bytes;
  /** BIND to a connection of its own (default true). */
  bind?: boolean;
  /** Timeout of each command and of connecting, ms. Default: the client's command timeout, else its connect timeout (ioredis 10 000, node-redis 5 000). A renewal's is never past the end of the lease. */
  timeout?: number;
  /** Called once when the lease is found lost. */
  onLost?: (why: string) => void;
  /**
   * Durable grants: after each grant and each renewal, `WAIT replicas replicasTimeout` on the
   * same connection. A grant fewer replicas acknowledged is released and NotDurableError
   * thrown (or, with `allowNotDurable`, kept with `durable` false); a renewal fewer acknowledged
   * sets `durable` false and calls `onNotDurable`. Default 0: no WAIT. Not on cluster clients.
   */
  replicas?: number;
  /** WAIT's timeout, ms (default 1 000); added to the timeout of that call. */
  replicasTimeout?: number;
  /** Keep a grant fewer replicas acknowledged (`durable` false) instead of releasing it and throwing NotDurableError. */
  allowNotDurable?: boolean;
  /** Called each time a renewal (or extend()) is acknowledged by fewer than `replicas` replicas; the lease is kept. */
  onNotDurable?: (why: string) => void;
  /**
   * Hold it in this Session (made from the same client): granted with `SESSION id`, not bound, no
   * renewal of its own (the session's keepalive is its one renewal; `extend()` is a LockError); lost
   * when the session ends; survives the client's reconnects.
   */
  session?: Session;
}


type Verb = "LOCK.ACQUIRE" | "LOCK.RACQUIRE" | "LOCK.READ" | "LOCK.SEMAPHORE" | "LOCK.MACQUIRE";

const OPTION_NAMES = new Set(["ttl", "wait", "owner", "bind", "timeout", "onLost", "replicas", "replicasTimeout", "allowNotDurable", "onNotDurable", "session"]);

function prefixed(prefix: string, key: Bytes): Bytes {
  if (prefix === "") return key;
  return Buffer.isBuffer(key) ? Buffer.concat([Buffer.from(prefix), key]) : prefix + key;
}

function sameBytes(a: Reply, b: Bytes): boolean {
  if (a === null || Array.isArray(a)) return false;
  const x = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
  return x.equals(Buffer.isBuffer(b) ? b : Buffer.from(b));
}

/** Whether a LOCK.INFO reply (RESP2 flat array, or a RESP3 map) names `owner` among the holders, under `token` when one is given (a holder is `[owner, holds, ttl, token]`). */
function holdsOwner(info: unknown, owner: Bytes, token?: number): boolean {
  let hs: unknown = undefined;
  if (Array.isArray(info)) {
    for (let i = 0; i + 1 < info.length; i += 2) if (String(info[i]) === "holders") hs = info[i + 1];
  } else if (info instanceof Map) {
    for (const [k, v] of info) if (String(k) === "holders") hs = v;
  } else if (info !== null && typeof info === "object") hs = (info as Record<string, unknown>).holders;
  return Array.isArray(hs) && hs.some((h) => Array.isArray(h) && sameBytes(h[0], owner) && (token === undefined || Number(h[3]) === token));
}

export class Lock {
  readonly owner: Bytes;
  /** The fencing token (a multi-key lock: the highest of `tokens`). */
  token: number | null = null;
  /** The tokens per key, in key order. */
  tokens: number[] = [];
  private ttl: number;
  private wait: number;
  private bind: boolean;
  private onLost?: (why: string) => void;
  private adapter: Adapter;
  private keys: Bytes[];
  private conn: Conn | null = null;
  private holds = 0;
  private acquiring = false;
  private renewing = false;
  private timer: NodeJS.Timeout | null = null;
  private validUntil = 0;
  private lostWhy: string | null = null;
  private controller = new AbortController();
  /** The watcher id the bound connection redirects its tracking to (null: none yet). */
  private trackedBy: number | null = null;
  private replicas: number;
  private replicasTimeout: number;
  private allowNotDurable: boolean;
  private onNotDurable?: (why: string) => void;
  private durableNow: boolean | null = null;
  private session: Session | null;
  /** The server's session this object holds in (while it holds), and its id at the grant. */
  private inSession: NodeSession | null = null;
  private sessionId = 0;
  /** The Session's close() ended the hold: release() has nothing left to do. */
  private closedBySession = false;

  private constructor(
    client: RedisClient,
    private verb: Verb,
    private names: Bytes[],
    private limit: number,
    opts: LockOptions = {},
  ) {
    if (opts === null || typeof opts !== "object") throw new TypeError("redis-native-lock: options must be an object");
    for (const k of Object.keys(opts)) if (!OPTION_NAMES.has(k)) throw new TypeError(`redis-native-lock: unknown option ${JSON.stringify(k)}`);
    this.ttl = checkInt(opts.ttl ?? 30_000, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    this.wait = checkWait(opts.wait ?? 10_000, "wait");
    if (opts.bind !== undefined && typeof opts.bind !== "boolean") throw new TypeError("redis-native-lock: bind must be a boolean");
    this.bind = opts.bind ?? true;
    this.owner = opts.owner === undefined ? randomOwner() : checkBytes(opts.owner, "owner");
    if (opts.onLost !== undefined && typeof opts.onLost !== "function") throw new TypeError("redis-native-lock: onLost must be a function");
    this.onLost = opts.onLost;
    const timeout = opts.timeout === undefined ? undefined : checkInt(opts.timeout, "timeout (ms)", 1, Number.MAX_SAFE_INTEGER);
    this.adapter = adapt(client, names[0], timeout);
    this.keys = names.map((k) => prefixed(this.adapter.prefix, k));
    this.replicas = checkInt(opts.replicas ?? 0, "replicas", 0, 1_000_000);
    this.replicasTimeout = checkInt(opts.replicasTimeout ?? 1_000, "replicasTimeout (ms)", 1, Number.MAX_SAFE_INTEGER);
    if (opts.allowNotDurable !== undefined && typeof opts.allowNotDurable !== "boolean") throw new TypeError("redis-native-lock: allowNotDurable must be a boolean");
    this.allowNotDurable = opts.allowNotDurable ?? false;
    if (opts.onNotDurable !== undefined && typeof opts.onNotDurable !== "function") throw new TypeError("redis-native-lock: onNotDurable must be a function");
    this.onNotDurable = opts.onNotDurable;
    if (this.replicas > 0 && this.adapter.cluster)
      throw new TypeError("redis-native-lock: replicas is not supported on a cluster client (WAIT must follow the grant on the same connection)");
    if (opts.session !== undefined && !(opts.session instanceof Session)) throw new TypeError("redis-native-lock: session must be a Session");
    this.session = opts.session ?? null;
    if (this.session !== null) {
      if (this.session.client !== client) throw new TypeError("redis-native-lock: a lock in a Session is made with the Session's client (the same object)");
      if (opts.bind === true) throw new TypeError("redis-native-lock: a lock in a Session is not bound (bind: true and session exclude each other)");
      this.bind = false;
    }
  }

  static exclusive(client: RedisClient, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.ACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  static reentrant(client: RedisClient, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.RACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  static read(client: RedisClient, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.READ", [checkBytes(key, "key")], 0, opts);
  }
  static write(client: RedisClient, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.RACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  /** The two sides of one read-write lock under one owner: holding one and asking for the other is the server's error at once. */
  static readWrite(client: RedisClient, key: Bytes, opts: LockOptions = {}): { read: Lock; write: Lock } {
    const owner = opts.owner ?? randomOwner();
    return { read: Lock.read(client, key, { ...opts, owner }), write: Lock.write(client, key, { ...opts, owner }) };
  }
  static semaphore(client: RedisClient, key: Bytes, limit: number, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.SEMAPHORE", [checkBytes(key, "key")], checkInt(limit, "limit", 1, 1_000_000), opts);
  }
  static multi(client: RedisClient, keys: readonly Bytes[], opts?: LockOptions): Lock {
    if (!Array.isArray(keys)) throw new TypeError(`redis-native-lock: Lock.multi takes an array of keys, not ${typeof keys === "string" ? "a string" : typeof keys}`);
    checkInt(keys.length, "the number of keys", 1, 1000);
    return new Lock(client, "LOCK.MACQUIRE", keys.map((k, i) => checkBytes(k, `key ${i}`)), 0, opts);
  }

  /** Whether the lock is bound to its own connection (BIND). */
  get bound(): boolean {
    return this.conn !== null;
  }

  /** Whether this object holds the lock now (as far as it knows). */
  get held(): boolean {
    return this.holds > 0 && !this.lost;
  }

  /** True once the lease is known lost, or may have run out; stays true until the next grant. */
  get lost(): boolean {
    const until = this.inSession !== null ? this.inSession.deadline : this.validUntil;
    return this.lostWhy !== null || (this.holds > 0 && Date.now() >= until);
  }

  /**
   * With the `replicas` option: true when the last grant and the last renewal were each
   * acknowledged by that many replicas (WAIT), false when one was not (a grant kept by
   * `allowNotDurable`, or a renewal). null without the option, or before a grant.
   */
  get durable(): boolean | null {
    return this.durableNow;
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
    return `lease on ${show(this.names)} (token ${this.token}) lost: ${this.lostWhy ?? "its ttl ran out without a successful renewal"}`;
  }

  private args(wait: number, bind: boolean): Arg[] {
    let a: Arg[];
    if (this.verb === "LOCK.MACQUIRE") a = [this.verb, this.keys.length, ...this.keys, this.owner, this.ttl];
    else if (this.verb === "LOCK.SEMAPHORE") a = [this.verb, this.keys[0], this.limit, this.owner, this.ttl];
    else a = [this.verb, this.keys[0], this.owner, this.ttl];
    if (wait !== 0) a.push("WAIT", wait === Infinity ? 0 : wait);
    if (bind) a.push("BIND");
    if (this.session !== null) a.push("SESSION", this.sessionId);
    return a;
  }

  private get via(): Conn {
    return this.conn ?? this.adapter.shared;
  }

  private get counted(): boolean {
    return this.verb === "LOCK.RACQUIRE" || this.verb === "LOCK.READ";
  }

  /** The kind's name, for messages. */
  private get kind(): string {
    return { "LOCK.ACQUIRE": "exclusive", "LOCK.RACQUIRE": "reentrant or write", "LOCK.READ": "read", "LOCK.SEMAPHORE": "semaphore", "LOCK.MACQUIRE": "multi-key" }[this.verb];
  }

  /**
   * Asks for the lock, waiting in the server up to `wait` ms (default 0:
   * do not wait; Infinity: without limit). True when granted (`token`),
   * false when refused; DeadlockError when waiting would close a cycle of
   * waits; LockTimeoutError when the server did not answer within the wait
   * plus the timeout. One object is one holder, whatever its kind: a second
   * acquire() while one is in flight or while the object holds the lock is a
   * LockError, so concurrent tasks sharing the object never get in together
   * (give each task its own Lock). A reentrant, read or write lock's next
   * hold is `reacquire()`, by the code that holds it.
   */
  async acquire(wait: number = 0): Promise<boolean> {
    wait = checkWait(wait, "wait");
    if (this.acquiring) throw new LockError(`acquire() of ${show(this.names)} while another acquire() on the same Lock object is in flight: give each concurrent task its own Lock`);
    if (this.holds > 0)
      throw new LockError(
        `acquire() of ${show(this.names)}: this Lock object already holds it (one object is one holder: release() it first, or give each task its own Lock${this.counted ? "; the holder adds a hold with reacquire()" : ""})`,
      );
    this.acquiring = true;
    try {
      return await this.acquireOnce(wait);
    } finally {
      this.acquiring = false;
      if (this.conn === null) this.adapter.watcher?.remove(this.watched); // not granted, or not bound
    }
  }

  private async acquireOnce(wait: number): Promise<boolean> {
    this.lostWhy = null;
    if (this.session !== null) return this.acquireInSession(this.session, wait, true);
    if (this.bind && this.conn === null) {
      // The watcher opens (or is there already) while the bound connection connects.
      this.adapter.watcher?.id(this.watched, this.adapter.timeout).catch(() => {});
      let conn: Conn | null = null;
      conn = await this.adapter.dedicated(() => {
        if (conn !== null && this.conn === conn && this.holds > 0) this.lose("the connection the lock was bound to closed: the server freed the lock");
      });
      this.conn = conn;
    }
    const sent = Date.now();
    let reply: Reply;
    try {
      reply = await this.via.call(this.args(wait, this.conn !== null), wait + this.adapter.timeout);
    } catch (e) {
      if (this.conn !== null && /syntax error/i.test(errorText(e))) {
        await this.closeConn();
        this.bind = false;
        return this.acquireOnce(wait);
      }
      if (this.conn !== null) await this.closeConn(); // closing frees a grant that crossed the timeout (BIND)
      else if (e instanceof LockTimeoutError) void this.releaseQuietly();
      throw deadlockOrSelf(e);
    }
    if (reply === null) {
      await this.closeConn();
      return false;
    }
    this.tokens = Array.isArray(reply) ? reply.map(Number) : [Number(reply)];
    this.token = Math.max(...this.tokens);
    this.holds = 1;
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.validUntil = sent + this.ttl;
    if (this.timer === null && this.session === null) {
      this.timer = setInterval(() => void this.renew(), Math.max(1, Math.floor(this.ttl / 3)));
      this.timer.unref?.();
    }
    await this.grantedDurably();
    await this.track();
    return true;
  }

  /**
   * A grant in the Session: `SESSION id` (the session opened on the key's
   * server if needed), not bound, no renewal timer. A wait goes on a
   * connection of its own (closed after the reply, nothing bound to it) so
   * that it holds up none of the client's commands (the keepalives go through
   * them); a cluster client has none: its wait is on the node's connection.
   * NOSESSION (the session ended meanwhile): it is ended here too (its locks
   * lost) and the request made once more in a new session.
   */
  private async acquireInSession(session: Session, wait: number, retry: boolean): Promise<boolean> {
    const start = Date.now();
    const ns = await session.on(this.keys[0]);
    const id = await ns.open();
    this.sessionId = id;
    this.closedBySession = false;
    const conn = wait !== 0 ? await this.adapter.dedicated(() => {}) : null;
    let reply: Reply;
    try {
      reply = await (conn ?? this.adapter.shared).call(this.args(wait, false), wait + this.adapter.timeout);
    } catch (e) {
      if (/^NOSESSION/.test(errorText(e))) {
        ns.ended(id, `a grant naming session ${id} was answered ${errorText(e)}`);
        const left = Number.isFinite(wait) && wait > 0 ? wait - (Date.now() - start) : wait;
        if (retry && !session.closed && (left === 0 || left > 0)) return this.acquireInSession(session, Math.max(0, left), false);
      }
      if (e instanceof LockTimeoutError) void this.releaseQuietly();
      throw deadlockOrSelf(e);
    } finally {
      if (conn !== null) void conn.close();
    }
    if (reply === null) return false;
    this.tokens = Array.isArray(reply) ? reply.map(Number) : [Number(reply)];
    this.token = Math.max(...this.tokens);
    this.holds = 1;
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.inSession = ns;
    if (ns.id !== id) {
      this.lose(`session ${id} ended while its grant was on the way (the grant ended with it)`);
      return true;
    }
    ns.locks.add(this.member);
    await this.grantedDurably();
    return true;
  }

  /** What the Session calls. */
  private readonly member: SessionLock = {
    lock: this,
    sessionEnded: (why) => {
      this.inSession = null;
      if (this.holds > 0) this.lose(why);
    },
    sessionClosed: () => {
      this.inSession = null;
      if (this.holds > 0 && this.lostWhy === null) {
        this.holds = 0;
        this.closedBySession = true;
      }
    },
  };

  /** Out of its session's locks (released, lost). */
  private leaveSession(): void {
    this.inSession?.locks.delete(this.member);
    this.inSession = null;
  }

  /**
   * One more hold of a reentrant, read or write lock this object holds (the
   * server answers a holder's repeat at once, with the same token, and resets
   * its deadline; with `replicas`, WAIT follows as after a grant). For the code
   * that holds it (a nested step of the same task): the holds are counted,
   * each given back by one release(). LockError for the other kinds or when
   * not held; LeaseLostError when the lease is gone (a grant the request got
   * instead, under a new token, is given back at once).
   */
  async reacquire(): Promise<void> {
    if (!this.counted) throw new LockError(`reacquire() of ${show(this.names)}: a ${this.kind} lock has one hold`);
    if (this.holds === 0) {
      if (this.lostWhy !== null) throw new LeaseLostError(this.message());
      throw new LockError("reacquire() of a lock not held");
    }
    this.check();
    const sent = Date.now();
    let reply: Reply;
    try {
      reply = await this.via.call(this.args(0, this.conn !== null), this.adapter.timeout);
    } catch (e) {
      if (/^WRONGTYPE/.test(errorText(e))) {
        this.lose(`the key is no longer a lock (${errorText(e)})`);
        throw new LeaseLostError(this.message());
      }
      if (/^NOSESSION/.test(errorText(e)) && this.inSession !== null) {
        this.inSession.ended(this.sessionId, `a re-entry naming session ${this.sessionId} was answered ${errorText(e)}`);
        throw new LeaseLostError(this.message());
      }
      throw deadlockOrSelf(e);
    }
    if (this.holds === 0) {
      // released meanwhile by another call: the hold this request added is given back
      if (reply !== null) void this.adapter.shared.call(["LOCK.RELEASE", this.keys[0], this.owner, "TOKEN", Number(reply)], this.adapter.timeout).catch(() => {});
      throw new LockError("reacquire() of a lock released meanwhile");
    }
    if (reply === null || Number(reply) !== this.token) {
      if (reply !== null) void this.via.call(["LOCK.RELEASE", this.keys[0], this.owner, "TOKEN", Number(reply)], this.adapter.timeout).catch(() => {});
      this.lose(reply === null ? "a re-entry was refused: someone else holds the key" : `a re-entry found the grant gone: the server granted a new one (token ${Number(reply)}), given back`);
      throw new LeaseLostError(this.message());
    }
    this.holds += 1;
    this.validUntil = sent + this.ttl;
    await this.grantedDurably();
    await this.track();
  }

  /**
   * With `replicas`: `WAIT` after a grant or a re-entry, on its connection. Not
   * acknowledged by that many (or WAIT failed): the hold it added is given back
   * (a re-entry's only: the earlier holds stay) and NotDurableError thrown, or,
   * with `allowNotDurable`, kept with `durable` false.
   */
  private async grantedDurably(): Promise<void> {
    if (this.replicas === 0) return;
    let acked = -1;
    let failure: unknown = null;
    try {
      acked = await this.acknowledged(this.via);
    } catch (e) {
      failure = e;
    }
    if (acked >= this.replicas) this.durableNow = true;
    else if (failure === null && this.allowNotDurable) this.durableNow = false;
    else {
      await this.release().catch(() => {});
      if (this.holds === 0) this.durableNow = null;
      throw failure ?? new NotDurableError(`${show(this.names)} (token ${this.token}): granted, but ${acked} of ${this.replicas} replicas acknowledged within ${this.replicasTimeout} ms; released`, acked, this.replicas);
    }
  }

  /** `WAIT replicas replicasTimeout` on `conn` (the one the grant or renewal went on): how many replicas acknowledged. */
  private async acknowledged(conn: Conn): Promise<number> {
    return Number(await conn.call(["WAIT", this.replicas, this.replicasTimeout], this.adapter.timeout + this.replicasTimeout));
  }

  /** After a renewal: WAIT, and `durable` / `onNotDurable` say how it went. */
  private async renewedDurably(conn: Conn): Promise<void> {
    if (this.replicas === 0) return;
    let why: string | null = null;
    try {
      const acked = await this.acknowledged(conn);
      if (acked < this.replicas) why = `a renewal was acknowledged by ${acked} of ${this.replicas} replicas within ${this.replicasTimeout} ms`;
    } catch (e) {
      why = `WAIT after a renewal failed (${errorText(e)})`;
    }
    if (this.holds === 0) return;
    this.durableNow = why === null;
    if (why !== null) {
      try {
        this.onNotDurable?.(why);
      } catch {
        // a callback must not break the keepalive
      }
    }
  }

  /** What the watcher calls: it heard that a held key changed (or it closed). */
  private readonly watched: Watched = {
    watches: (keys) =>
      this.keys.some((k) => {
        const b = Buffer.isBuffer(k) ? k : Buffer.from(k);
        return keys.some((x) => x.equals(b));
      }),
    verify: () => void this.track(),
    untrack: () => {
      this.trackedBy = null;
    },
  };

  /**
   * Has the server tell the watcher when a key of a bound lock changes:
   * client tracking on the bound connection (once), redirected to the
   * watcher, and a read of each key (what tracking remembers; NOLOOP drops a
   * key after a write of our own, so this follows every one). The read also
   * says whether the lock is still ours. Without a watcher (an old server,
   * no permission) the renewals still notice.
   */
  private async track(): Promise<void> {
    const conn = this.conn;
    const w = this.adapter.watcher;
    if (conn === null || w === null || this.holds === 0 || this.lostWhy !== null) return;
    const id = await w.id(this.watched, this.adapter.timeout);
    if (this.conn !== conn || this.holds === 0 || this.lostWhy !== null) return;
    if (id === null) {
      w.remove(this.watched);
      return;
    }
    const budget = Math.min(this.adapter.timeout, Math.max(1, this.validUntil - Date.now()));
    const on =
      this.trackedBy === id
        ? null
        : conn.call(["CLIENT", "TRACKING", "ON", "REDIRECT", id, "NOLOOP"], budget).then(
            () => {
              if (this.conn === conn) this.trackedBy = id;
            },
            () => {}, // refused (ACL): the renewals still notice; a dead connection shows in the reads below
          );
    let infos: Reply[];
    try {
      [, infos] = await Promise.all([on, Promise.all(this.keys.map((k) => conn.call(["LOCK.INFO", k], budget, true)))]);
    } catch (e) {
      if (this.conn !== conn || this.holds === 0) return;
      if (/^WRONGTYPE/.test(errorText(e))) this.lose(`the key was overwritten: no longer a lock (told by the server at once: ${errorText(e)})`);
      else {
        this.lose(`the connection the lock was bound to failed (${errorText(e)})`);
        void this.closeConn();
      }
      return;
    }
    if (this.conn !== conn || this.holds === 0) return;
    if (!this.holdsAll(infos)) this.lose("the key was deleted, overwritten or freed (told by the server at once)");
  }

  /** Whether LOCK.INFO's replies, one per key, show this holder's grants (the owner under this object's token per key: a later grant to the same owner name is not ours). */
  private holdsAll(infos: Reply[]): boolean {
    return infos.every((info, i) => holdsOwner(info, this.owner, this.tokens[i]));
  }

  /** After an unbound grant request that timed out: frees a grant that crossed the timeout (by owner: its token never came back). */
  private releaseQuietly(): void {
    for (const k of this.keys) this.adapter.shared.call(["LOCK.RELEASE", k, this.owner], this.adapter.timeout).catch(() => {});
  }

  private async renew(): Promise<void> {
    if (this.holds === 0 || this.lostWhy !== null || this.renewing) return;
    const left = this.validUntil - Date.now();
    if (left <= 0) {
      this.lose("the lease ran out before a renewal succeeded");
      return;
    }
    this.renewing = true;
    const budget = Math.min(this.adapter.timeout, left);
    const sent = Date.now();
    try {
      let ok: boolean;
      const via = this.via;
      if (this.conn !== null) {
        // The reads keep the keys tracked (our own KEEPALIVE, a write, drops them) and see a key overwritten.
        const conn = this.conn;
        const [n, ...infos] = await Promise.all([
          conn.call(["LOCK.KEEPALIVE", this.ttl], budget),
          ...this.keys.map((k) => conn.call(["LOCK.INFO", k], budget, true)),
        ]);
        ok = Number(n) >= this.keys.length && this.holdsAll(infos);
      } else {
        const replies = await Promise.all(this.keys.map((k, i) => this.adapter.shared.call(["LOCK.RENEW", k, this.owner, this.ttl, "TOKEN", this.tokens[i]], budget)));
        ok = replies.every((r) => Number(r) === 1);
      }
      if (this.holds === 0) return;
      if (ok) {
        this.validUntil = sent + this.ttl;
        await this.renewedDurably(via);
      } else
        this.lose(
          this.conn !== null
            ? "LOCK.KEEPALIVE found it gone: released, expired, deleted or overwritten"
            : "LOCK.RENEW answered 0: the lease expired, the key was deleted, or it is held under another token",
        );
    } catch (e) {
      if (this.holds === 0) return;
      if (/^WRONGTYPE/.test(errorText(e))) this.lose(`the key is no longer a lock (${errorText(e)})`);
      else if (Date.now() >= this.validUntil) this.lose(`no renewal finished before the lease ended (${errorText(e)})`);
      else if (this.conn !== null) {
        // A bound connection that failed or stalled: closing it frees the lock on the server.
        this.lose(`the connection the lock was bound to failed (${errorText(e)})`);
        void this.closeConn();
      }
      // else: through the client, retried at the next tick while the lease lasts
    } finally {
      this.renewing = false;
    }
    // A renewal whose WAIT for replicas ran past the next tick (a replica
    // down: each WAIT runs its timeout) is followed by the next one at once,
    // a third of the ttl after it was sent, as the interval's would have
    // been: the ticks meanwhile found it running and did nothing, and the
    // next one could come after the lease's end.
    if (this.holds !== 0 && this.lostWhy === null && this.timer !== null && Date.now() - sent >= Math.floor(this.ttl / 3)) void this.renew();
  }

  private lose(why: string): void {
    if (this.lostWhy !== null) return;
    this.lostWhy = why;
    this.leaveSession();
    this.stopTimer();
    this.adapter.watcher?.remove(this.watched);
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
    this.trackedBy = null;
    this.adapter.watcher?.remove(this.watched);
    if (c !== null) await c.close();
  }

  /** Sets the lease to `ttl` ms from now (default: the lock's); throws LeaseLostError if no longer held. */
  async extend(ttl: number = this.ttl): Promise<void> {
    checkInt(ttl, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    if (this.session !== null) throw new LockError("extend() of a lock in a Session: the session's keepalive is its one renewal (LOCK.RENEW would change nothing)");
    if (this.holds === 0) throw new LockError("extend() of a lock not held");
    this.check();
    const sent = Date.now();
    const budget = Math.min(this.adapter.timeout, Math.max(1, this.validUntil - sent));
    let replies: Reply[];
    try {
      replies = await Promise.all(this.keys.map((k, i) => this.via.call(["LOCK.RENEW", k, this.owner, ttl, "TOKEN", this.tokens[i]], budget)));
    } catch (e) {
      if (/^WRONGTYPE/.test(errorText(e))) {
        this.lose(`the key is no longer a lock (${errorText(e)})`);
        throw new LeaseLostError(this.message());
      }
      throw e;
    }
    if (replies.some((r) => Number(r) !== 1)) {
      this.lose("LOCK.RENEW answered 0: the lease expired, the key was deleted, or it is held under another token");
      throw new LeaseLostError(this.message());
    }
    this.ttl = ttl;
    this.validUntil = sent + ttl;
    await this.renewedDurably(this.via);
    await this.track();
  }

  /**
   * Runs one Redis command if and only if this holder still holds the lock,
   * check and command one atomic step in the server: `LOCK.GUARD key owner
   * TOKEN <this.token> CALL command ...args`, on the lock's connection
   * (pipelined with whatever else is in flight on it). Resolves to the
   * command's reply as the client decodes it; the command's own error reply
   * rejects as the client's error does. When the server answers NOTHELD (the
   * lock released, expired, deleted, taken by another owner, or held again
   * under another token) nothing ran: the lease is marked lost and
   * LeaseLostError thrown, as it is at once, without sending, when the lease
   * is already known lost. ioredis's `keyPrefix` is applied to the command's
   * keys as in a direct call. The command's keys must be in the lock key's
   * slot on a cluster (CROSSSLOT otherwise). One key per guard: a multi-key
   * lock's guard() is a LockError.
   */
  async guard<T = unknown>(command: string, ...args: Arg[]): Promise<T> {
    if (typeof command !== "string" || command === "") throw new TypeError("redis-native-lock: guard() takes a command name (a non-empty string) first");
    for (const a of args)
      if (typeof a !== "string" && typeof a !== "number" && !Buffer.isBuffer(a))
        throw new TypeError(`redis-native-lock: guard() arguments are strings, numbers or Buffers, not ${a === null ? "null" : typeof a}`);
    if (this.verb === "LOCK.MACQUIRE") throw new LockError(`guard() of a multi-key lock ${show(this.names)}: LOCK.GUARD checks one key (guard with a lock on that key)`);
    if (this.holds === 0) {
      if (this.lostWhy !== null) throw new LeaseLostError(this.message());
      throw new LockError("guard() of a lock not held");
    }
    this.check();
    try {
      return (await this.via.call(["LOCK.GUARD", this.keys[0], this.owner, "TOKEN", this.token as number, "CALL", ...this.adapter.prefixKeys([command, ...args])], this.adapter.timeout)) as T;
    } catch (e) {
      if (/^NOTHELD/.test(errorText(e))) {
        this.lose(`LOCK.GUARD answered NOTHELD: not held under token ${this.token} any more (nothing ran)`);
        throw new LeaseLostError(this.message());
      }
      throw e;
    }
  }

  /**
   * Gives back one hold (all of a non-reentrant lock): `LOCK.RELEASE key owner
   * TOKEN <token>` per key, so it ends this object's grant and never a later
   * one to the same owner name. LeaseLostError if it was no longer ours (the
   * server answered nil and changed nothing), or was known lost.
   */
  async release(): Promise<void> {
    if (this.holds === 0) {
      if (this.closedBySession) return; // ended by its Session's close(): released already
      if (this.lostWhy !== null) throw new LeaseLostError(this.message());
      throw new LockError("release() of a lock not held");
    }
    const wasLost = this.lostWhy !== null;
    let replies: Reply[] = [];
    let failure: unknown = null;
    try {
      for (const [i, k] of this.keys.entries()) replies.push(await this.via.call(["LOCK.RELEASE", k, this.owner, "TOKEN", this.tokens[i]], this.adapter.timeout));
    } catch (e) {
      failure = e;
    }
    const wrongType = failure !== null && /^WRONGTYPE/.test(errorText(failure));
    const gone = wrongType || replies.some((r) => r === null);
    if (failure !== null || gone || !this.counted || replies.some((r) => Number(r) === 1)) this.holds = 0;
    else this.holds -= 1;
    if (this.holds === 0) {
      this.stopTimer();
      this.leaveSession();
      await this.closeConn();
    } else if (!wasLost && !gone && failure === null) await this.track();
    if (gone || wasLost) {
      this.lose(wrongType ? `the key is no longer a lock (${errorText(failure)})` : `LOCK.RELEASE answered nil: the grant under token ${this.token} was no longer there (nothing released)`);
      throw new LeaseLostError(this.message());
    }
    if (failure !== null) throw failure;
  }

  /** Holds the lock for `work`, waiting up to the `wait` option: LockNotAcquiredError if not granted in time, LeaseLostError if the lease was lost. */
  async with<T>(work: (lock: Lock) => Promise<T>): Promise<T> {
    if (!(await this.acquire(this.wait))) throw new LockNotAcquiredError(`${show(this.names)} not acquired within ${this.wait} ms`);
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

  /**
   * Acquires, waiting up to `wait` ms (default: the `wait` option), and
   * returns a Held for `await using held = await lock.hold()` (TypeScript
   * 5.2+): released at the end of the scope, LeaseLostError there if the
   * lease was lost. LockNotAcquiredError if not granted in time.
   */
  async hold(wait: number = this.wait): Promise<Held> {
    if (!(await this.acquire(wait))) throw new LockNotAcquiredError(`${show(this.names)} not acquired within ${wait} ms`);
    return new Held(this);
  }

  /** Whether anyone holds the (first) key. */
  async locked(): Promise<boolean> {
    return (await this.adapter.shared.call(["LOCK.INFO", this.keys[0]], this.adapter.timeout)) !== null;
  }

  /** Whether this holder holds the (first) key, as the server says: the owner under this object's token while the object holds it (a later grant to the same owner name is not its), else the owner under any token. */
  async owned(): Promise<boolean> {
    const info = await this.adapter.shared.call(["LOCK.INFO", this.keys[0]], this.adapter.timeout, true);
    return holdsOwner(info, this.owner, this.holds > 0 ? this.tokens[0] : undefined);
  }
}

/** A lock held by `hold()`: `await using` releases it at the end of the scope. */
export class Held {
  /** The holds this Held took and has not given back (hold()'s, and one per reacquire()). */
  private mine = 1;
  constructor(readonly lock: Lock) {}
  get token(): number {
    return this.lock.token as number;
  }
  get tokens(): number[] {
    return this.lock.tokens;
  }
  get lost(): boolean {
    return this.lock.lost;
  }
  get durable(): boolean | null {
    return this.lock.durable;
  }
  get signal(): AbortSignal {
    return this.lock.signal;
  }
  check(): void {
    this.lock.check();
  }
  extend(ttl?: number): Promise<void> {
    return this.lock.extend(ttl);
  }
  /** `lock.guard()`: the command, only while held (LeaseLostError otherwise). */
  guard<T = unknown>(command: string, ...args: (string | number | Buffer)[]): Promise<T> {
    return this.lock.guard<T>(command, ...args);
  }
  /** `lock.reacquire()`: one more hold of a reentrant, read or write lock, given back by a release() or at the end of the scope. */
  async reacquire(): Promise<void> {
    await this.lock.reacquire();
    this.mine += 1;
  }
  /** Gives back one hold (with reacquire()'s, the last one at the end of the scope otherwise). */
  async release(): Promise<void> {
    if (this.mine > 0) this.mine -= 1;
    await this.lock.release();
  }
  /** Gives back every hold this Held took; LeaseLostError if the lease was lost. */
  async [Symbol.asyncDispose](): Promise<void> {
    // release() throws LeaseLostError when the lease was lost (and drops every hold).
    while (this.mine > 0 && (this.lock as unknown as { holds: number }).holds > 0) await this.release();
    this.mine = 0;
  }
}

