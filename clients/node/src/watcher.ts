// One watcher per client: the connection the server tells when a bound lock's key changes.

/** A subscriber connection: its CLIENT ID, and how to close it. */
export interface Subscriber {
  id: number;
  close(): void;
}

/** Opens a RESP2 connection subscribed to `__redis__:invalidate`, within `timeout` ms; `onKeys` gets each invalidation (null: every key, a FLUSH), `onClose` is called when it closes by itself. */
export type OpenSubscriber = (timeout: number, onKeys: (keys: Buffer[] | null) => void, onClose: () => void) => Promise<Subscriber>;

export const INVALIDATE = "__redis__:invalidate";

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
export class Watcher {
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
export interface Watched {
  watches(keys: Buffer[]): boolean;
  verify(): void;
  untrack(): void;
}

const watchers = new WeakMap<object, Watcher>();

export function watcherOf(client: object, open: OpenSubscriber): Watcher {
  let w = watchers.get(client);
  if (w === undefined) {
    w = new Watcher(open);
    watchers.set(client, w);
  }
  return w;
}

/** The invalidation's keys as Buffers (null: every key). */
export function invalidated(message: unknown): Buffer[] | null {
  if (!Array.isArray(message)) return null;
  return message.map((k) => (Buffer.isBuffer(k) ? k : Buffer.from(String(k))));
}
