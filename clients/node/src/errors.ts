// The errors the package throws: all LockErrors (bad input is a TypeError).

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


/** An error's text (a server's error reply's, as the client words it). */
export function errorText(e: unknown): string {
  return String((e as Error)?.message ?? e);
}

/** A DEADLOCK reply as DeadlockError; anything else as it is. */
export function deadlockOrSelf(e: unknown): unknown {
  const msg = errorText(e);
  return msg.startsWith("DEADLOCK") ? new DeadlockError(msg) : e;
}
