// The clients the package works with (ioredis 5 and 6, node-redis 4 and 6),
// behind one Adapter: what a lock needs from a client, whichever it is. Each
// client differs in three places only (how a command is sent, how a
// connection of its own is made, how it subscribes); the rest (timeouts,
// closing, the watcher's connection) is written once.

import { LockTimeoutError } from "./errors";
import { Bytes } from "./checks";
import { INVALIDATE, invalidated, Watcher, watcherOf } from "./watcher";

/**
 * An ioredis `Redis` or `Cluster` (ioredis 5 or 6), as the factories take it.
 * Only its shape is named here, so that neither client library is needed to
 * compile against the package.
 */
export interface IoredisClient {
  call(command: string, ...args: any[]): unknown;
  callBuffer(command: string, ...args: any[]): unknown;
}

/** A node-redis client or cluster (`createClient`, `createCluster`; node-redis 4 or 6), as the factories take it. */
export interface NodeRedisClient {
  sendCommand(...args: any[]): unknown;
}

/** What `Lock`'s factories and `RedLock` take: an ioredis or a node-redis client or cluster. Anything else is a compile error (and a TypeError at run time). */
export type RedisClient = IoredisClient | NodeRedisClient;

export type Arg = string | number | Buffer;
export type Reply = null | number | string | Buffer | Reply[];

/** What the lock needs from a client or a connection. */
export interface Conn {
  call(args: Arg[], timeout: number, buffers?: boolean): Promise<Reply>;
  close(): Promise<void>;
}

export interface Adapter {
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
  /** The server that holds `key` (a key as sent, prefixed): its name ("" for a single server; a cluster's "host:port" of the key's master) and commands sent to it through the client's ordinary connections. */
  node(key: Bytes): Promise<Node>;
}

/** One server of a client: its name, and commands to it through the client (reconnecting as the client does). */
export interface Node {
  name: string;
  conn: Conn;
}

/** The cluster hash slot of `key` (CRC16 of the key, or of its `{hash tag}`, mod 16384). */
export function keySlot(key: Bytes): number {
  let b = Buffer.isBuffer(key) ? key : Buffer.from(key);
  const open = b.indexOf(0x7b);
  if (open >= 0) {
    const close = b.indexOf(0x7d, open + 1);
    if (close > open + 1) b = b.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of b) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}

/**
 * Rejects with LockTimeoutError after `ms` (Infinity: never). A reply that
 * came in time is taken, however late the process reads it: when the
 * timer fires, the timeout waits for the event loop's next look at the
 * sockets (a process stopped or starved past `ms` runs its expired timers
 * before it reads a reply that arrived meanwhile: a renewal that had
 * succeeded was taken for failed, and its lock for lost).
 */
export function timed<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  if (!Number.isFinite(ms)) return p;
  return new Promise<T>((resolve, reject) => {
    const late = () => reject(new LockTimeoutError(`${what}: no reply within ${Math.round(ms)} ms`));
    // setImmediate runs after this turn's poll for I/O, which reads what arrived.
    const t = setTimeout(() => setImmediate(late), Math.max(0, ms));
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

function positive(v: unknown, fallback: number): number {
  return typeof v === "number" && v > 0 ? v : fallback;
}

/** A connection a client library made for the package, not yet connected: `connect` it, `send` a command on it, `subscribe`, `close` it (not told to `onClose`). */
interface Opened {
  connect(): Promise<unknown>;
  send(args: Arg[], buffers?: boolean): Promise<Reply>;
  subscribe(channel: string, onMessage: (message: unknown) => void): Promise<unknown>;
  close(): Promise<void>;
}

/**
 * One client library: how it sends a command (`send`, on the client or on a
 * connection it opened), and how it opens a connection of the package's own
 * (`open`: a duplicate of `client` without reconnects or a command timeout
 * of the client's, RESP2 for a watcher, `onClose` told when it closes by
 * itself). The Adapter around it (timeouts, closing, the watcher) is `direct`'s.
 */
interface Library {
  send(c: any, args: Arg[], buffers?: boolean): Promise<Reply>;
  open(client: any, connectTimeout: number, watcher: boolean, onClose: () => void): Opened;
}

const ioredis: Library = {
  send: (c, args, buffers) => (buffers ? c.callBuffer(String(args[0]), ...args.slice(1)) : c.call(String(args[0]), ...args.slice(1))),
  open(client, connectTimeout, watcher, onClose) {
    const c = client.duplicate({
      commandTimeout: undefined,
      connectTimeout,
      lazyConnect: true,
      keyPrefix: undefined,
      enableOfflineQueue: true,
      retryStrategy: () => null,
      reconnectOnError: () => false,
      maxRetriesPerRequest: 0,
      // ioredis 6 speaks RESP3 by default, and a RESP3 watcher gets invalidations as pushes ioredis drops.
      ...(watcher ? { autoResubscribe: false, protocol: 2 } : {}),
    });
    let closing = false;
    c.on("error", () => {});
    c.once("close", () => {
      if (!closing) onClose();
    });
    return {
      connect: () => c.connect(),
      send: (args, buffers) => ioredis.send(c, args, buffers),
      subscribe: async (channel, onMessage) => {
        c.on("messageBuffer", (ch: Buffer, message: unknown) => {
          if (String(ch) === channel) onMessage(message);
        });
        await c.subscribe(channel);
      },
      close: async () => {
        closing = true;
        c.disconnect();
      },
    };
  },
};

function nrArgs(args: Arg[]): (string | Buffer)[] {
  return args.map((a) => (Buffer.isBuffer(a) ? a : String(a)));
}

/** Bulk strings as Buffers: node-redis 4 reads `returnBuffers`, 5 and 6 a type mapping (36: RESP's bulk string). */
const NR_BUFFERS = { returnBuffers: true, typeMapping: { 36: Buffer } };

const nodeRedis: Library = {
  send: (c, args, buffers) => (buffers ? c.sendCommand(nrArgs(args), NR_BUFFERS) : c.sendCommand(nrArgs(args))),
  open(client, connectTimeout, watcher, onClose) {
    // A watcher speaks RESP2 (node-redis 5 and 6 speak RESP3 by default): invalidations as plain pub/sub messages.
    // node-redis 6 refuses RESP2 beside its RESP3-only options: those are off for the watcher.
    const resp2 = { RESP: 2, maintNotifications: "disabled", clientSideCache: undefined, emitInvalidate: undefined };
    const c = client.duplicate({ ...(watcher ? resp2 : {}), socket: { ...(client.options?.socket ?? {}), connectTimeout, reconnectStrategy: false } });
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
    return {
      connect: () => c.connect(),
      send: (args, buffers) => nodeRedis.send(c, args, buffers),
      subscribe: (channel, onMessage) => c.subscribe(channel, onMessage, true),
      close: async () => {
        closing = true;
        try {
          await timed(c.disconnect(), 1000, "disconnect"); // node-redis 5 throws at once when already closed
        } catch {
          // closed already, or a stalled server: the socket is dropped
        }
      },
    };
  },
};

/** A client of one server: commands through it, connections of its own, one watcher. */
function direct(client: any, lib: Library, t: number, connectTimeout: number, prefix: string, prefixKeys: (args: Arg[]) => Arg[]): Adapter {
  const opened = async (ms: number, watcher: boolean, onClose: () => void, what: string): Promise<Opened> => {
    const o = lib.open(client, ms, watcher, onClose);
    try {
      await timed(o.connect(), ms, what);
    } catch (e) {
      await o.close();
      throw e;
    }
    return o;
  };
  const shared: Conn = { call: (args, ms, b) => timed(lib.send(client, args, b), ms, String(args[0])), close: async () => {} };
  return {
    prefix,
    prefixKeys,
    timeout: t,
    shared,
    node: async () => ({ name: "", conn: shared }),
    dedicated: async (onClose) => {
      const o = await opened(connectTimeout, false, onClose, "connecting");
      return { call: (args, ms, b) => timed(o.send(args, b), ms, String(args[0])), close: () => o.close() };
    },
    watcher: watcherOf(client, async (ms, onKeys, onClose) => {
      const o = await opened(Math.min(connectTimeout, ms), true, onClose, "connecting the watcher");
      try {
        const id = Number(await timed(o.send(["CLIENT", "ID"]), ms, "CLIENT ID"));
        await timed(
          o.subscribe(INVALIDATE, (message) => onKeys(invalidated(message))),
          ms,
          "SUBSCRIBE",
        );
        return { id, close: () => void o.close() };
      } catch (e) {
        void o.close();
        throw e;
      }
    }),
  };
}

/** A cluster client: commands through it (it routes them), no connection of the package's own, no watcher. */
function cluster(call: Conn["call"], t: number, prefix: string, prefixKeys: (args: Arg[]) => Arg[], node: Adapter["node"]): Adapter {
  return { prefix, prefixKeys, timeout: t, cluster: true, shared: { call, close: async () => {} }, dedicated: async () => null, watcher: null, node };
}

/** An ioredis Cluster's master for `key`'s slot (the slots are loaded by a command routed with the key first, when not yet known): commands to it go through the cluster's connection to that node, looked up at each call (the cluster replaces it when it reconnects). */
async function ioredisNode(client: any, key: Bytes, t: number): Promise<Node> {
  const slot = keySlot(key);
  const master = () => client.slots?.[slot]?.[0] as string | undefined;
  if (master() === undefined) await timed(ioredis.send(client, ["EXISTS", key]), t, "EXISTS");
  const name = master() ?? `slot ${slot}`;
  const call: Conn["call"] = (args, ms, b) => {
    const n = (client.nodes("master") as any[]).find((c) => `${c.options?.host}:${c.options?.port}` === name);
    if (n === undefined) return Promise.reject(new Error(`no connection to the cluster node ${name}`));
    return timed(ioredis.send(n, args, b), ms, String(args[0]));
  };
  return { name, conn: { call, close: async () => {} } };
}

/** A node-redis cluster's master for `key`'s slot: commands to it routed with `key`. */
async function nodeRedisNode(client: any, key: Bytes): Promise<Node> {
  const slot = keySlot(key);
  const m = client.slots?.[slot]?.master;
  const name = m === undefined ? `slot ${slot}` : String(m.address ?? `${m.host}:${m.port}`);
  const call: Conn["call"] = (args, ms, b) => timed(client.sendCommand(key, false, nrArgs(args), b ? NR_BUFFERS : undefined), ms, String(args[0]));
  return { name, conn: { call, close: async () => {} } };
}

/** `args` (a command and its arguments) with the command's keys prefixed as ioredis prefixes them in a direct call (its own key table; a command it does not know: none). */
function ioPrefixed(args: Arg[], prefix: string | Buffer): Arg[] {
  if (prefix === "" || args.length < 2) return args;
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const { Command } = require("ioredis");
  const c = new Command(String(args[0]), args.slice(1), { keyPrefix: prefix });
  return [args[0], ...(c.args as Arg[])];
}

const unprefixed = (args: Arg[]) => args;

/** The Adapter for `client`; a TypeError for anything that is not one of the clients. `firstKey` routes a node-redis cluster's commands. */
export function adapt(client: any, firstKey: Bytes, timeout?: number): Adapter {
  const isIoredis = typeof client?.call === "function" && typeof client?.callBuffer === "function";
  if (isIoredis && typeof client?.nodes === "function") {
    const o = client.options?.redisOptions ?? {};
    const t = timeout ?? positive(o.commandTimeout, positive(o.connectTimeout, 10_000));
    const prefix = client.options?.keyPrefix ?? o.keyPrefix ?? "";
    return cluster(
      (args, ms, b) => timed(ioredis.send(client, args, b), ms, String(args[0])),
      t,
      prefix,
      (args) => ioPrefixed(args, prefix),
      (key) => ioredisNode(client, key, t),
    );
  }
  if (isIoredis && typeof client?.duplicate === "function" && client?.options !== undefined) {
    const o = client.options;
    const connectTimeout = timeout ?? positive(o.connectTimeout, 10_000);
    const t = timeout ?? positive(o.commandTimeout, connectTimeout);
    const prefix = o.keyPrefix ?? "";
    return direct(client, ioredis, t, connectTimeout, prefix, (args) => ioPrefixed(args, prefix));
  }
  const nrTimeout = (o: any) => timeout ?? positive(o?.socket?.connectTimeout, 5_000);
  if (typeof client?.sendCommand === "function" && typeof client?.getMasters === "function") {
    const t = nrTimeout(client.options?.defaults);
    const call: Conn["call"] = (args, ms, b) => timed(client.sendCommand(firstKey, false, nrArgs(args), b ? NR_BUFFERS : undefined), ms, String(args[0]));
    return cluster(call, t, "", unprefixed, (key) => nodeRedisNode(client, key));
  }
  if (typeof client?.sendCommand === "function" && typeof client?.duplicate === "function") {
    const t = nrTimeout(client.options);
    return direct(client, nodeRedis, t, t, "", unprefixed);
  }
  throw new TypeError("redis-native-lock: an ioredis Redis or Cluster, or a node-redis client or cluster, is needed");
}
