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
 * Times are milliseconds. Keys and owners are strings or Buffers.
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

// `await using` needs Symbol.asyncDispose at run time (Node 18.18+, 20.4+ have it).
const symbols = Symbol as unknown as { asyncDispose?: symbol };
if (symbols.asyncDispose === undefined) symbols.asyncDispose = Symbol.for("Symbol.asyncDispose");

export class LockError extends Error {
  constructor(message?: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** Waiting would have closed a cycle of lock waits: nothing changed. */
export class DeadlockError extends LockError {}

/** The lease ended before the holder let go. */
export class LeaseLostError extends LockError {}

/** Not granted within the wait (`with`, `hold`). */
export class LockNotAcquiredError extends LockError {}

/** A command got no reply within its timeout (a stalled or unreachable server). */
export class LockTimeoutError extends LockError {}

/**
 * Fewer replicas than the `replicas` option asked for acknowledged a grant
 * within `replicasTimeout` (WAIT): the grant was released. A failover could
 * have handed the lock to someone else.
 */
export class NotDurableError extends LockError {
  constructor(
    message: string,
    /** How many replicas acknowledged (WAIT's reply). */
    readonly acknowledged: number,
    /** How many were asked for. */
    readonly replicas: number,
  ) {
    super(message);
  }
}

/** A key or an owner: any bytes. */
export type Bytes = string | Buffer;

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
}

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

type Arg = string | number | Buffer;
type Reply = null | number | string | Buffer | Reply[];

/** What the lock needs from a client or a connection. */
interface Conn {
  call(args: Arg[], timeout: number, buffers?: boolean): Promise<Reply>;
  close(): Promise<void>;
}

interface Adapter {
  /** Commands through the client itself (routed by the client in a cluster). */
  shared: Conn;
  /** A connection of its own without reconnects, or null where the client cannot make one (clusters). `onClose` is called when it closes by itself. */
  dedicated(onClose: () => void): Promise<Conn | null>;
  /** The client's watcher (shared by every lock on this client), or null where there is none (clusters). */
  watcher: Watcher | null;
  prefix: string;
  /** A command's arguments with its keys prefixed as the client prefixes a direct call's (ioredis `keyPrefix`); the same arguments where the client has no prefix. */
  prefixKeys(args: Arg[]): Arg[];
  /** The client's own timeout (command, else connect), ms. */
  timeout: number;
  /** A cluster client (WAIT cannot follow a grant on its connection). */
  cluster?: boolean;
}

/** A subscriber connection: its CLIENT ID, and how to close it. */
interface Subscriber {
  id: number;
  close(): void;
}

/** Opens a RESP2 connection subscribed to `__redis__:invalidate`, within `timeout` ms; `onKeys` gets each invalidation (null: every key, a FLUSH), `onClose` is called when it closes by itself. */
type OpenSubscriber = (timeout: number, onKeys: (keys: Buffer[] | null) => void, onClose: () => void) => Promise<Subscriber>;

const INVALIDATE = "__redis__:invalidate";

/**
 * One per client (a server and its options), shared by every lock bound on
 * it: a connection subscribed to `__redis__:invalidate` that each bound
 * connection redirects its client tracking to (`CLIENT TRACKING ON REDIRECT
 * <id> NOLOOP`). Each bound lock reads its keys with LOCK.INFO, so the
 * server tells the watcher when one of them changes (DEL, SET over it,
 * expiry, FLUSH*, anything from another connection), and the lock checks at
 * once. Event-driven: nothing polls, and its reads block nothing else (no
 * lock command goes through it). Opened for the first bound lock, closed when
 * the last one lets go.
 */
class Watcher {
  private locks = new Set<Watched>();
  private sub: Promise<Subscriber | null> | null = null;
  private current: Subscriber | null = null;

  constructor(private open: OpenSubscriber) {}

  /** The watcher's client id, opening it if needed (within `timeout` ms); null when the server cannot have one (no SUBSCRIBE or CLIENT permission, no such command). */
  async id(lock: Watched, timeout: number): Promise<number | null> {
    this.locks.add(lock);
    if (this.sub === null) {
      const opening: Promise<Subscriber | null> = this.open(
        timeout,
        (keys) => this.told(keys),
        () => this.closed(opening),
      ).then(
        (s) => {
          if (this.sub !== opening || this.locks.size === 0) {
            s.close(); // no lock needs it any more
            if (this.sub === opening) this.sub = null;
            return null;
          }
          this.current = s;
          return s;
        },
        () => {
          if (this.sub === opening) this.sub = null;
          return null;
        },
      );
      this.sub = opening;
    }
    const s = await this.sub;
    return s === null ? null : s.id;
  }

  /** `lock` no longer needs the watcher; the last one closes it. */
  remove(lock: Watched): void {
    this.locks.delete(lock);
    if (this.locks.size === 0 && this.current !== null) {
      const s = this.current;
      this.current = null;
      this.sub = null;
      s.close();
    }
  }

  private told(keys: Buffer[] | null): void {
    for (const l of [...this.locks]) if (keys === null || l.watches(keys)) l.verify();
  }

  private closed(which: Promise<Subscriber | null>): void {
    if (this.sub !== which || this.current === null) return; // not ours, or never opened (id() says null)
    this.sub = null;
    this.current = null;
    // The server no longer tells us: every bound lock checks now, and tracks again through a new watcher.
    for (const l of [...this.locks]) {
      l.untrack();
      l.verify();
    }
  }
}

/** What the watcher needs from a lock. */
interface Watched {
  watches(keys: Buffer[]): boolean;
  verify(): void;
  untrack(): void;
}

const watchers = new WeakMap<object, Watcher>();

function watcherOf(client: object, open: OpenSubscriber): Watcher {
  let w = watchers.get(client);
  if (w === undefined) {
    w = new Watcher(open);
    watchers.set(client, w);
  }
  return w;
}

/** The invalidation's keys as Buffers (null: every key). */
function invalidated(message: unknown): Buffer[] | null {
  if (!Array.isArray(message)) return null;
  return message.map((k) => (Buffer.isBuffer(k) ? k : Buffer.from(String(k))));
}

function randomOwner(): string {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  return require("crypto").randomUUID();
}

/** Rejects with LockTimeoutError after `ms` (Infinity: never). */
function timed<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new LockTimeoutError(`${what}: no reply within ${Math.round(ms)} ms`)), Math.max(0, ms));
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
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

function positive(v: unknown, fallback: number): number {
  return typeof v === "number" && v > 0 ? v : fallback;
}

function ioCall(c: any, args: Arg[], buffers?: boolean): Promise<Reply> {
  return buffers ? c.callBuffer(String(args[0]), ...args.slice(1)) : c.call(String(args[0]), ...args.slice(1));
}

/** `args` (a command and its arguments) with the command's keys prefixed as ioredis prefixes them in a direct call (its own key table; a command it does not know: none). */
function ioPrefixed(args: Arg[], prefix: string | Buffer): Arg[] {
  if (prefix === "" || args.length < 2) return args;
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { Command } = require("ioredis");
  const c = new Command(String(args[0]), args.slice(1), { keyPrefix: prefix });
  return [args[0], ...(c.args as Arg[])];
}

function nrArgs(args: Arg[]): (string | Buffer)[] {
  return args.map((a) => (Buffer.isBuffer(a) ? a : String(a)));
}

function adapt(client: any, firstKey: Bytes, timeout?: number): Adapter {
  if (isIoredisCluster(client)) {
    const o = client.options?.redisOptions ?? {};
    const t = timeout ?? positive(o.commandTimeout, positive(o.connectTimeout, 10_000));
    const prefix = client.options?.keyPrefix ?? o.keyPrefix ?? "";
    return {
      prefix,
      prefixKeys: (args) => ioPrefixed(args, prefix),
      timeout: t,
      cluster: true,
      shared: { call: (args, ms, b) => timed(ioCall(client, args, b), ms, String(args[0])), close: async () => {} },
      dedicated: async () => null,
      watcher: null,
    };
  }
  if (isIoredis(client)) {
    const o = client.options ?? {};
    const connectTimeout = timeout ?? positive(o.connectTimeout, 10_000);
    const t = timeout ?? positive(o.commandTimeout, connectTimeout);
    return {
      prefix: o.keyPrefix ?? "",
      prefixKeys: (args) => ioPrefixed(args, o.keyPrefix ?? ""),
      timeout: t,
      shared: { call: (args, ms, b) => timed(ioCall(client, args, b), ms, String(args[0])), close: async () => {} },
      dedicated: async (onClose) => {
        const c = client.duplicate({
          commandTimeout: undefined,
          connectTimeout,
          lazyConnect: true,
          keyPrefix: undefined,
          enableOfflineQueue: true,
          retryStrategy: () => null,
          reconnectOnError: () => false,
          maxRetriesPerRequest: 0,
        });
        let closing = false;
        c.on("error", () => {});
        c.once("close", () => {
          if (!closing) onClose();
        });
        const close = async () => {
          closing = true;
          c.disconnect();
        };
        try {
          await timed(c.connect(), connectTimeout, "connecting");
        } catch (e) {
          await close();
          throw e;
        }
        return {
          call: (args: Arg[], ms: number, b?: boolean) => timed(ioCall(c, args, b), ms, String(args[0])),
          close,
        };
      },
      watcher: watcherOf(client, async (ms, onKeys, onClose) => {
        const c = client.duplicate({
          commandTimeout: undefined,
          connectTimeout: Math.min(connectTimeout, ms),
          lazyConnect: true,
          keyPrefix: undefined,
          enableOfflineQueue: true,
          retryStrategy: () => null,
          reconnectOnError: () => false,
          maxRetriesPerRequest: 0,
          autoResubscribe: false,
        });
        let closing = false;
        c.on("error", () => {});
        c.once("close", () => {
          if (!closing) onClose();
        });
        const close = () => {
          closing = true;
          c.disconnect();
        };
        try {
          await timed(c.connect(), ms, "connecting the watcher");
          const id = Number(await timed(c.call("CLIENT", "ID"), ms, "CLIENT ID"));
          c.on("messageBuffer", (channel: Buffer, message: unknown) => {
            if (String(channel) === INVALIDATE) onKeys(invalidated(message));
          });
          await timed(c.subscribe(INVALIDATE), ms, "SUBSCRIBE");
          return { id, close };
        } catch (e) {
          close();
          throw e;
        }
      }),
    };
  }
  const nrTimeout = (o: any) => timeout ?? positive(o?.socket?.connectTimeout, 5_000);
  if (isNodeRedisCluster(client)) {
    const t = nrTimeout(client.options?.defaults);
    return {
      prefix: "",
      prefixKeys: (args) => args,
      timeout: t,
      cluster: true,
      shared: {
        call: (args, ms) => timed(client.sendCommand(firstKey, false, nrArgs(args)), ms, String(args[0])),
        close: async () => {},
      },
      dedicated: async () => null,
      watcher: null,
    };
  }
  if (typeof client?.sendCommand === "function" && typeof client?.duplicate === "function") {
    const t = nrTimeout(client.options);
    const send = (c: any, args: Arg[], b?: boolean): Promise<Reply> =>
      b && typeof c.commandOptions === "function" ? c.sendCommand(nrArgs(args), c.commandOptions({ returnBuffers: true })) : c.sendCommand(nrArgs(args));
    return {
      prefix: "",
      prefixKeys: (args) => args,
      timeout: t,
      shared: { call: (args, ms, b) => timed(send(client, args, b), ms, String(args[0])), close: async () => {} },
      dedicated: async (onClose) => {
        const c = client.duplicate({ socket: { ...(client.options?.socket ?? {}), connectTimeout: t, reconnectStrategy: false } });
        let closing = false;
        let told = false;
        const tell = () => {
          if (!closing && !told) {
            told = true;
            onClose();
          }
        };
        c.on("error", tell);
        c.on("end", tell);
        const close = async () => {
          closing = true;
          try {
            await timed(c.disconnect(), 1000, "disconnect");
          } catch {
            // a stalled server: drop the socket
          }
        };
        try {
          await timed(c.connect(), t, "connecting");
        } catch (e) {
          await close();
          throw e;
        }
        return { call: (args: Arg[], ms: number, b?: boolean) => timed(send(c, args, b), ms, String(args[0])), close };
      },
      watcher: watcherOf(client, async (ms, onKeys, onClose) => {
        // RESP2 (node-redis 5 may speak RESP3): invalidations as plain pub/sub messages.
        const resp = client.options?.RESP === undefined ? {} : { RESP: 2 };
        const c = client.duplicate({ ...resp, socket: { ...(client.options?.socket ?? {}), connectTimeout: Math.min(t, ms), reconnectStrategy: false } });
        let closing = false;
        let told = false;
        const tell = () => {
          if (!closing && !told) {
            told = true;
            onClose();
          }
        };
        c.on("error", tell);
        c.on("end", tell);
        const close = () => {
          closing = true;
          timed(c.disconnect(), 1000, "disconnect").catch(() => {});
        };
        try {
          await timed(c.connect(), ms, "connecting the watcher");
          const id = Number(await timed(c.sendCommand(["CLIENT", "ID"]), ms, "CLIENT ID"));
          await timed(c.subscribe(INVALIDATE, (message: unknown) => onKeys(invalidated(message)), true), ms, "SUBSCRIBE");
          return { id, close };
        } catch (e) {
          close();
          throw e;
        }
      }),
    };
  }
  throw new TypeError("redis-native-lock: an ioredis Redis or Cluster, or a node-redis client or cluster, is needed");
}

type Verb = "LOCK.ACQUIRE" | "LOCK.RACQUIRE" | "LOCK.READ" | "LOCK.SEMAPHORE" | "LOCK.MACQUIRE";

function errorText(e: unknown): string {
  return String((e as Error)?.message ?? e);
}

function deadlockOrSelf(e: unknown): unknown {
  const msg = errorText(e);
  return msg.startsWith("DEADLOCK") ? new DeadlockError(msg) : e;
}

function checkBytes(v: unknown, what: string): Bytes {
  if (typeof v === "string" || Buffer.isBuffer(v)) {
    if (v.length === 0) throw new TypeError(`redis-native-lock: ${what} must not be empty`);
    return v;
  }
  throw new TypeError(`redis-native-lock: ${what} must be a string or a Buffer, not ${v === null ? "null" : typeof v}`);
}

function checkInt(v: unknown, what: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max)
    throw new TypeError(`redis-native-lock: ${what} must be an integer from ${min} to ${max}, not ${String(v)}`);
  return v;
}

function checkWait(v: unknown, what: string): number {
  if (v === Infinity) return v;
  return checkInt(v, `${what} (ms, or Infinity)`, 0, Number.MAX_SAFE_INTEGER);
}

const OPTION_NAMES = new Set(["ttl", "wait", "owner", "bind", "timeout", "onLost", "replicas", "replicasTimeout", "allowNotDurable", "onNotDurable"]);

function prefixed(prefix: string, key: Bytes): Bytes {
  if (prefix === "") return key;
  return Buffer.isBuffer(key) ? Buffer.concat([Buffer.from(prefix), key]) : prefix + key;
}

function sameBytes(a: Reply, b: Bytes): boolean {
  if (a === null || Array.isArray(a)) return false;
  const x = Buffer.isBuffer(a) ? a : Buffer.from(String(a));
  return x.equals(Buffer.isBuffer(b) ? b : Buffer.from(b));
}

/** Whether a LOCK.INFO reply (RESP2 flat array, or a RESP3 map) names `owner` among the holders. */
function holdsOwner(info: unknown, owner: Bytes): boolean {
  let hs: unknown = undefined;
  if (Array.isArray(info)) {
    for (let i = 0; i + 1 < info.length; i += 2) if (String(info[i]) === "holders") hs = info[i + 1];
  } else if (info instanceof Map) {
    for (const [k, v] of info) if (String(k) === "holders") hs = v;
  } else if (info !== null && typeof info === "object") hs = (info as Record<string, unknown>).holders;
  return Array.isArray(hs) && hs.some((h) => Array.isArray(h) && sameBytes(h[0], owner));
}

function show(keys: Bytes[]): string {
  return JSON.stringify(keys.map((k) => (Buffer.isBuffer(k) ? `<${k.toString("hex")}>` : k)));
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

  private constructor(
    client: unknown,
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
  }

  static exclusive(client: unknown, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.ACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  static reentrant(client: unknown, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.RACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  static read(client: unknown, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.READ", [checkBytes(key, "key")], 0, opts);
  }
  static write(client: unknown, key: Bytes, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.RACQUIRE", [checkBytes(key, "key")], 0, opts);
  }
  /** The two sides of one read-write lock under one owner: holding one and asking for the other is the server's error at once. */
  static readWrite(client: unknown, key: Bytes, opts: LockOptions = {}): { read: Lock; write: Lock } {
    const owner = opts.owner ?? randomOwner();
    return { read: Lock.read(client, key, { ...opts, owner }), write: Lock.write(client, key, { ...opts, owner }) };
  }
  static semaphore(client: unknown, key: Bytes, limit: number, opts?: LockOptions): Lock {
    return new Lock(client, "LOCK.SEMAPHORE", [checkBytes(key, "key")], checkInt(limit, "limit", 1, 1_000_000), opts);
  }
  static multi(client: unknown, keys: readonly Bytes[], opts?: LockOptions): Lock {
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
    return this.lostWhy !== null || (this.holds > 0 && Date.now() >= this.validUntil);
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
    return a;
  }

  private get via(): Conn {
    return this.conn ?? this.adapter.shared;
  }

  private get counted(): boolean {
    return this.verb === "LOCK.RACQUIRE" || this.verb === "LOCK.READ";
  }

  /**
   * Asks for the lock, waiting in the server up to `wait` ms (default 0:
   * do not wait; Infinity: without limit). True when granted (`token`),
   * false when refused; DeadlockError when waiting would close a cycle of
   * waits; LockTimeoutError when the server did not answer within the wait
   * plus the timeout. One object is one holder: a second acquire() while
   * one is in flight, or while an exclusive, semaphore or multi-key lock is
   * held, is a LockError (a reentrant, read or write lock re-enters: one
   * more hold).
   */
  async acquire(wait: number = 0): Promise<boolean> {
    wait = checkWait(wait, "wait");
    if (this.acquiring) throw new LockError(`acquire() of ${show(this.names)} while another acquire() on the same Lock object is in flight: give each concurrent task its own Lock`);
    if (this.holds > 0 && !this.counted)
      throw new LockError(`acquire() of ${show(this.names)}: this Lock object already holds it (release() it first, or give each task its own Lock)`);
    this.acquiring = true;
    try {
      return await this.acquireOnce(wait);
    } finally {
      this.acquiring = false;
      if (this.conn === null) this.adapter.watcher?.remove(this.watched); // not granted, or not bound
    }
  }

  private async acquireOnce(wait: number): Promise<boolean> {
    const first = this.holds === 0;
    if (first) {
      this.lostWhy = null;
      if (this.bind && this.conn === null) {
        // The watcher opens (or is there already) while the bound connection connects.
        this.adapter.watcher?.id(this.watched, this.adapter.timeout).catch(() => {});
        let conn: Conn | null = null;
        conn = await this.adapter.dedicated(() => {
          if (conn !== null && this.conn === conn && this.holds > 0) this.lose("the connection the lock was bound to closed: the server freed the lock");
        });
        this.conn = conn;
      }
    }
    const sent = Date.now();
    let reply: Reply;
    try {
      reply = await this.via.call(this.args(wait, this.conn !== null), wait + this.adapter.timeout);
    } catch (e) {
      if (first && this.conn !== null && /syntax error/i.test(errorText(e))) {
        await this.closeConn();
        this.bind = false;
        return this.acquireOnce(wait);
      }
      if (first) {
        if (this.conn !== null) await this.closeConn(); // closing frees a grant that crossed the timeout (BIND)
        else if (e instanceof LockTimeoutError) void this.releaseQuietly();
      }
      throw deadlockOrSelf(e);
    }
    if (reply === null) {
      if (first) await this.closeConn();
      return false;
    }
    this.tokens = Array.isArray(reply) ? reply.map(Number) : [Number(reply)];
    this.token = Math.max(...this.tokens);
    this.holds = this.counted ? this.holds + 1 : 1;
    if (this.controller.signal.aborted) this.controller = new AbortController();
    this.validUntil = sent + this.ttl;
    if (this.timer === null) {
      this.timer = setInterval(() => void this.renew(), Math.max(1, Math.floor(this.ttl / 3)));
      this.timer.unref?.();
    }
    if (this.replicas > 0) {
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
        // Not durable (or WAIT failed): give the grant back (the one hold it added).
        await this.release().catch(() => {});
        this.durableNow = null;
        throw failure ?? new NotDurableError(`${show(this.names)} (token ${this.token}): granted, but ${acked} of ${this.replicas} replicas acknowledged within ${this.replicasTimeout} ms; released`, acked, this.replicas);
      }
    }
    await this.track();
    return true;
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
    if (!infos.every((i) => holdsOwner(i, this.owner))) this.lose("the key was deleted, overwritten or freed (told by the server at once)");
  }

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
        ok = Number(n) >= this.keys.length && infos.every((i) => holdsOwner(i, this.owner));
      } else {
        const replies = await Promise.all(this.keys.map((k) => this.adapter.shared.call(["LOCK.RENEW", k, this.owner, this.ttl], budget)));
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
            : "LOCK.RENEW answered 0: the lease expired or the key was deleted",
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
  }

  private lose(why: string): void {
    if (this.lostWhy !== null) return;
    this.lostWhy = why;
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
    if (this.holds === 0) throw new LockError("extend() of a lock not held");
    this.check();
    const sent = Date.now();
    const budget = Math.min(this.adapter.timeout, Math.max(1, this.validUntil - sent));
    let replies: Reply[];
    try {
      replies = await Promise.all(this.keys.map((k) => this.via.call(["LOCK.RENEW", k, this.owner, ttl], budget)));
    } catch (e) {
      if (/^WRONGTYPE/.test(errorText(e))) {
        this.lose(`the key is no longer a lock (${errorText(e)})`);
        throw new LeaseLostError(this.message());
      }
      throw e;
    }
    if (replies.some((r) => Number(r) !== 1)) {
      this.lose("LOCK.RENEW answered 0: the lease expired or the key was deleted");
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

  /** Gives back one hold (all of a non-reentrant lock); throws LeaseLostError if it was no longer ours. */
  async release(): Promise<void> {
    if (this.holds === 0) {
      if (this.lostWhy !== null) throw new LeaseLostError(this.message());
      throw new LockError("release() of a lock not held");
    }
    const wasLost = this.lostWhy !== null;
    let replies: Reply[] = [];
    let failure: unknown = null;
    try {
      for (const k of this.keys) replies.push(await this.via.call(["LOCK.RELEASE", k, this.owner], this.adapter.timeout));
    } catch (e) {
      failure = e;
    }
    const wrongType = failure !== null && /^WRONGTYPE/.test(errorText(failure));
    const gone = wrongType || replies.some((r) => r === null);
    if (failure !== null || gone || !this.counted || replies.some((r) => Number(r) === 1)) this.holds = 0;
    else this.holds -= 1;
    if (this.holds === 0) {
      this.stopTimer();
      await this.closeConn();
    } else if (!wasLost && !gone && failure === null) await this.track();
    if (gone || wasLost) {
      this.lose(wrongType ? `the key is no longer a lock (${errorText(failure)})` : "LOCK.RELEASE answered nil: the lock was no longer ours");
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

  /** Whether this owner holds the (first) key, as the server says. */
  async owned(): Promise<boolean> {
    return holdsOwner(await this.adapter.shared.call(["LOCK.INFO", this.keys[0]], this.adapter.timeout, true), this.owner);
  }
}

/** A lock held by `hold()`: `await using` releases it at the end of the scope. */
export class Held {
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
  /** Releases now (the end of the scope then does nothing). */
  release(): Promise<void> {
    return this.lock.release();
  }
  /** Releases every hold this Held took; LeaseLostError if the lease was lost. */
  async [Symbol.asyncDispose](): Promise<void> {
    // release() throws LeaseLostError when the lease was lost.
    if ((this.lock as unknown as { holds: number }).holds > 0) await this.lock.release();
  }
}

/** RedLock over independent servers (clients of independent masters). */
export class RedLock {
  readonly quorum: number;
  private opts: RedLockOptions;
  constructor(
    private servers: unknown[],
    opts: RedLockOptions = {},
  ) {
    if (!Array.isArray(servers) || servers.length === 0) throw new TypeError("redis-native-lock: RedLock takes a non-empty array of clients");
    for (const k of Object.keys(opts)) if (!["retries", "retryDelay", "driftFactor", "timeout"].includes(k)) throw new TypeError(`redis-native-lock: unknown RedLock option ${JSON.stringify(k)}`);
    this.opts = opts;
    this.quorum = Math.floor(servers.length / 2) + 1;
  }

  private async each(args: Arg[], limit: number): Promise<(Reply | Error)[]> {
    return Promise.all(
      this.servers.map(async (s) => {
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
      const replies = await this.each(["LOCK.ACQUIRE", key, owner, ttl], ttl);
      const tokens = new Map<number, number>();
      replies.forEach((r, i) => {
        if (typeof r === "number") tokens.set(i, r);
      });
      const validity = ttl - (Date.now() - started) - (ttl * (this.opts.driftFactor ?? 0.01) + 2);
      if (tokens.size >= this.quorum && validity > 0) return { key, owner, tokens, validUntil: started + validity };
      await this.each(["LOCK.RELEASE", key, owner], ttl);
    }
    return null;
  }

  /** Renews on every server; true when a quorum renewed it within the ttl (`validUntil` updated). */
  async extend(lease: RedLockLease, ttl: number): Promise<boolean> {
    checkInt(ttl, "ttl (ms)", 1, Number.MAX_SAFE_INTEGER);
    const started = Date.now();
    const replies = await this.each(["LOCK.RENEW", lease.key, lease.owner, ttl], ttl);
    const renewed = replies.filter((r) => r === 1).length;
    const validity = ttl - (Date.now() - started) - (ttl * (this.opts.driftFactor ?? 0.01) + 2);
    if (renewed >= this.quorum && validity > 0) {
      lease.validUntil = started + validity;
      return true;
    }
    return false;
  }

  /** Releases on every server; how many released a hold. */
  async release(lease: RedLockLease): Promise<number> {
    return (await this.each(["LOCK.RELEASE", lease.key, lease.owner], Infinity)).filter((r) => r === 0 || r === 1).length;
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
