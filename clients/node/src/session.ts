// Session (LOCK.SESSION): one lease for many locks, kept alive by one keeper per server.

import { Adapter, adapt, Node, RedisClient } from "./clients";
import { Bytes, checkInt } from "./checks";
import { errorText, LockError } from "./errors";
import type { Lock } from "./lock";

// `await using` needs Symbol.asyncDispose at run time (Node 18.18+, 20.4+ have it).
const symbols = Symbol as unknown as { asyncDispose?: symbol };
if (symbols.asyncDispose === undefined) symbols.asyncDispose = Symbol.for("Symbol.asyncDispose");

export interface SessionOptions {
  /** The session's lease, ms (default 30 000): renewed every third of it by `LOCK.SESSION KEEPALIVE`. */
  ttl?: number;
  /** Timeout of each command, ms. Default: the client's command timeout, else its connect timeout. A keepalive's is never past the session's deadline. */
  timeout?: number;
  /** Called once per lock on the session when the session ends under it (beside the lock's own `onLost`). */
  onLost?: (lock: Lock, why: string) => void;
}

/** What a Session knows of a lock granted in it. */
export interface SessionLock {
  readonly lock: Lock;
  /** The session ended under it: lost. */
  sessionEnded(why: string): void;
  /** `close()` ended it: released. */
  sessionClosed(): void;
}

/** A session on one server: its id (opened lazily), its deadline, its locks. */
export class NodeSession {
  id: number | null = null;
  /** Last acknowledged keepalive's (or OPEN's) send time + ttl. */
  deadline = 0;
  /** When the keeper sends the next keepalive. */
  due = Infinity;
  inFlight = false;
  readonly locks = new Set<SessionLock>();
  private opening: Promise<number> | null = null;
  private endTimer: NodeJS.Timeout | null = null;

  /** The keeper of its server while it is open (looked up at each open: the one there is, or a new one). */
  private keeper: Keeper | null = null;

  constructor(
    private session: Session,
    readonly node: Node,
  ) {}

  /** The session's id on this server, opening it (LOCK.SESSION OPEN) the first time and after it ended. */
  open(): Promise<number> {
    if (this.id !== null) return Promise.resolve(this.id);
    if (this.opening === null) {
      const sent = Date.now();
      const opening = this.node.conn.call(["LOCK.SESSION", "OPEN", this.session.ttl], this.session.timeout).then(
        (reply) => {
          if (this.opening === opening) this.opening = null;
          if (this.session.closed) {
            void this.node.conn.call(["LOCK.SESSION", "CLOSE", Number(reply)], this.session.timeout).catch(() => {});
            throw new LockError("the session was closed while it opened");
          }
          this.id = Number(reply);
          this.acknowledged(sent);
          this.keeper = keeperOf(this.session.client, this.node.name);
          this.keeper.add(this);
          return this.id;
        },
        (e) => {
          if (this.opening === opening) this.opening = null;
          throw e;
        },
      );
      this.opening = opening;
    }
    return this.opening;
  }

  /** A keepalive (or OPEN) sent at `sent` was acknowledged: the deadline moves, the local timer with it. */
  private acknowledged(sent: number): void {
    this.deadline = Math.max(this.deadline, sent + this.session.ttl);
    this.due = sent + Math.max(1, Math.floor(this.session.ttl / 3));
    if (this.endTimer !== null) clearTimeout(this.endTimer);
    this.endTimer = setTimeout(() => this.expired(), Math.max(0, this.deadline - Date.now()));
    this.endTimer.unref?.();
  }

  private expired(): void {
    this.endTimer = null;
    if (this.id === null) return;
    if (Date.now() < this.deadline) {
      this.acknowledged(this.deadline - this.session.ttl); // moved meanwhile
      return;
    }
    const id = this.id;
    // The server may still have it (our keepalives arrived, their replies did not): ended there too, best effort.
    void this.node.conn.call(["LOCK.SESSION", "CLOSE", id], this.session.timeout).catch(() => {});
    this.ended(id, `session ${id}'s deadline passed with no acknowledged keepalive (ttl ${this.session.ttl} ms)`);
  }

  /** What the keeper calls when `due`: `LOCK.SESSION KEEPALIVE id ttl`; a failure is retried until the deadline passes. */
  async keepalive(): Promise<void> {
    const id = this.id;
    if (id === null || this.inFlight) return;
    this.inFlight = true;
    const sent = Date.now();
    try {
      // An attempt lasts at most a third of the ttl (one stuck behind a dead socket is sent again), never past the deadline.
      const budget = Math.max(1, Math.min(this.session.timeout, this.deadline - sent, Math.max(100, Math.floor(this.session.ttl / 3))));
      const reply = await this.node.conn.call(["LOCK.SESSION", "KEEPALIVE", id, this.session.ttl], budget);
      if (this.id !== id) return;
      if (Number(reply) === 1) this.acknowledged(sent);
      else this.ended(id, `LOCK.SESSION KEEPALIVE answered 0: session ${id} ended on the server (closed, or its deadline passed)`);
    } catch (e) {
      if (this.id !== id) return;
      // A connection error, a timeout: tried again soon (the client reconnects) while the deadline lasts.
      this.due = Date.now() + Math.min(100, Math.max(1, Math.floor(this.session.ttl / 10)));
      this.session.lastError = errorText(e);
    } finally {
      this.inFlight = false;
      this.keeper?.schedule();
    }
  }

  /** Session `id` ended (a keepalive answered 0, a grant answered NOSESSION, its deadline passed): every lock on it lost; the next lock opens a new one. */
  ended(id: number, why: string): void {
    if (this.id !== id) return;
    this.stop();
    const locks = [...this.locks];
    this.locks.clear();
    for (const l of locks) {
      l.sessionEnded(why);
      try {
        this.session.onLost?.(l.lock, why);
      } catch {
        // a callback must not break the keeper
      }
    }
  }

  private stop(): void {
    this.id = null;
    this.due = Infinity;
    this.deadline = 0;
    if (this.endTimer !== null) clearTimeout(this.endTimer);
    this.endTimer = null;
    this.keeper?.remove(this);
    this.keeper = null;
  }

  /** LOCK.SESSION CLOSE: its locks end on the server at once, reported released. The number of holders it ended. */
  async close(): Promise<number> {
    let id = this.id;
    if (id === null && this.opening !== null) id = await this.opening.catch(() => null);
    if (id === null) return 0;
    if (this.id === id) this.stop();
    const locks = [...this.locks];
    this.locks.clear();
    for (const l of locks) l.sessionClosed();
    return Number(await this.node.conn.call(["LOCK.SESSION", "CLOSE", id], this.session.timeout));
  }
}

/**
 * The one keeper of a server (a client and one of its nodes): a timer at the
 * earliest keepalive due among every session open on it, sending each due
 * session's `LOCK.SESSION KEEPALIVE` through the client's ordinary
 * connection (pipelined together).
 */
export class Keeper {
  private entries = new Set<NodeSession>();
  private timer: NodeJS.Timeout | null = null;
  private at = Infinity;

  constructor(private forget: () => void) {}

  add(e: NodeSession): void {
    this.entries.add(e);
    this.schedule();
  }

  remove(e: NodeSession): void {
    this.entries.delete(e);
    if (this.entries.size === 0) {
      this.clear();
      this.forget();
    } else this.schedule();
  }

  private clear(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.at = Infinity;
  }

  schedule(): void {
    let next = Infinity;
    for (const e of this.entries) if (!e.inFlight && e.due < next) next = e.due;
    if (next === this.at && this.timer !== null) return;
    this.clear();
    if (next === Infinity) return;
    this.at = next;
    this.timer = setTimeout(() => this.tick(), Math.max(0, next - Date.now()));
    this.timer.unref?.();
  }

  private tick(): void {
    this.timer = null;
    this.at = Infinity;
    const now = Date.now();
    for (const e of this.entries) if (!e.inFlight && e.due <= now) void e.keepalive();
    this.schedule();
  }
}

/** The keepers: per client object, per node name. */
const keepers = new WeakMap<object, Map<string, Keeper>>();

function keeperOf(client: object, node: string): Keeper {
  let m = keepers.get(client);
  if (m === undefined) keepers.set(client, (m = new Map()));
  let k = m.get(node);
  if (k === undefined) {
    const mine = m;
    const created: Keeper = new Keeper(() => {
      if (mine.get(node) === created) mine.delete(node);
    });
    k = created;
    m.set(node, k);
  }
  return k;
}

/**
 * One lease for many locks (`LOCK.SESSION`): locks made with `{ session }`
 * are granted with `SESSION id` (not bound), renewed by nothing of their own:
 * one keeper per server sends `LOCK.SESSION KEEPALIVE` every third of the
 * ttl for every session on it, on the client's ordinary connection,
 * retrying through the client's reconnects until the deadline (the last
 * acknowledged keepalive's send time + ttl). Opened lazily, per node on a
 * cluster. When it ends (a keepalive answered 0, a grant answered
 * `NOSESSION`, or its deadline passed unanswered) every lock on it is lost
 * at once (`lost`, `signal`, `onLost`), and the next lock opens a new one.
 * `close()` (or the end of an `await using` scope) ends its locks on the
 * server, reported released.
 */
export class Session {
  readonly ttl: number;
  /** @internal */
  readonly timeout: number;
  /** @internal */
  readonly onLost?: (lock: Lock, why: string) => void;
  /** The last keepalive failure's text (retried while the deadline lasts), for diagnostics. */
  lastError: string | null = null;
  private adapter: Adapter;
  private nodes = new Map<string, NodeSession>();
  private closing = false;

  constructor(
    /** The client the session's locks are made with (the same object). */
    readonly client: RedisClient,
    opts: SessionOptions = {},
  ) {
    if (opts === null || typeof opts !== "object") throw new TypeError("redis-native-lock: options must be an object");
    for (const k of Object.keys(opts)) if (!["ttl", "timeout", "onLost"].includes(k)) throw new TypeError(`redis-native-lock: unknown option ${JSON.stringify(k)}`);
    this.ttl = checkInt(opts.ttl ?? 30_000, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    const timeout = opts.timeout === undefined ? undefined : checkInt(opts.timeout, "timeout (ms)", 1, Number.MAX_SAFE_INTEGER);
    if (opts.onLost !== undefined && typeof opts.onLost !== "function") throw new TypeError("redis-native-lock: onLost must be a function");
    this.onLost = opts.onLost;
    this.adapter = adapt(client, "session", timeout);
    this.timeout = this.adapter.timeout;
  }

  /** True once `close()` was called (a lock on it is then refused). */
  get closed(): boolean {
    return this.closing;
  }

  /** The live session ids this object holds, by server ("" for a single server, "host:port" of a cluster node). */
  get ids(): Map<string, number> {
    const m = new Map<string, number>();
    for (const [name, ns] of this.nodes) if (ns.id !== null) m.set(name, ns.id);
    return m;
  }

  /** @internal The session on the server of `key` (a key as sent, prefixed). */
  async on(key: Bytes): Promise<NodeSession> {
    if (this.closing) throw new LockError("a lock on a closed Session: make a new Session");
    const node = await this.adapter.node(key);
    let ns = this.nodes.get(node.name);
    if (ns === undefined) {
      ns = new NodeSession(this, node);
      this.nodes.set(node.name, ns);
    }
    return ns;
  }

  /**
   * Ends the session on every server it was opened on (`LOCK.SESSION CLOSE`):
   * its locks end there at once (a waiter is granted) and are reported
   * released (`held` false, no `onLost`; their `release()` does nothing).
   * Resolves to the number of holders ended. The Session is done: a lock on
   * it afterwards is a LockError.
   */
  async close(): Promise<number> {
    this.closing = true;
    const replies = await Promise.allSettled([...this.nodes.values()].map((ns) => ns.close()));
    const failed = replies.find((r) => r.status === "rejected") as PromiseRejectedResult | undefined;
    if (failed !== undefined) throw failed.reason;
    return replies.reduce((n, r) => n + (r.status === "fulfilled" ? r.value : 0), 0);
  }

  /** `await using session = new Session(client)`: closed at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
