// Argument checks and the small helpers on keys and owners shared by Lock and RedLock.

/** A key or an owner: any bytes. */
export type Bytes = string | Buffer;

export function randomOwner(): string {
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  return require("crypto").randomUUID();
}

export function checkBytes(v: unknown, what: string): Bytes {
  if (typeof v === "string" || Buffer.isBuffer(v)) {
    if (v.length === 0) throw new TypeError(`redis-native-lock: ${what} must not be empty`);
    return v;
  }
  throw new TypeError(`redis-native-lock: ${what} must be a string or a Buffer, not ${v === null ? "null" : typeof v}`);
}

export function checkInt(v: unknown, what: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max)
    throw new TypeError(`redis-native-lock: ${what} must be an integer from ${min} to ${max}, not ${String(v)}`);
  return v;
}

export function checkWait(v: unknown, what: string): number {
  if (v === Infinity) return v;
  return checkInt(v, `${what} (ms, or Infinity)`, 0, Number.MAX_SAFE_INTEGER);
}

export function show(keys: Bytes[]): string {
  return JSON.stringify(keys.map((k) => (Buffer.isBuffer(k) ? `<${k.toString("hex")}>` : k)));
}
