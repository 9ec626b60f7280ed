'use strict';
// Tests of redis-lock.js against a real server with the module.
//
//   node test.js PORT      (server on 127.0.0.1:PORT)
//
// Run by tests/clients.rs (`make test`), with ioredis on NODE_PATH.
// Prints one line per test, then "N passed, M failed"; exits 1 on a failure.

const assert = require('node:assert/strict');
const Redis = require('ioredis');
const { withLock, LeaseLost, LockNotAcquired } = require('./redis-lock');

const PORT = Number(process.argv[2]);
const tests = [];
const test = (name, fn) => tests.push({ name, fn });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const clients = [];

function client(extra = {}) {
  const c = new Redis({ host: '127.0.0.1', port: PORT, lazyConnect: false, ...extra });
  clients.push(c);
  return c;
}

// LOCK.INFO as {owner: [holds, token]}, or null when free.
async function info(r, key) {
  const reply = await r.call('LOCK.INFO', key);
  if (reply === null) return null;
  const out = {};
  for (const [owner, holds, , token] of reply[3]) out[owner] = [holds, BigInt(token)];
  return out;
}

// Renewals sent so far: LOCK.KEEPALIVE (bound locks) and LOCK.RENEW.
async function renewCalls(r) {
  const stats = await r.info('commandstats');
  let n = 0;
  for (const c of ['renew', 'keepalive']) {
    const m = new RegExp(`cmdstat_lock\\.${c}:calls=(\\d+)`).exec(stats);
    if (m) n += Number(m[1]);
  }
  return n;
}

async function boundHolders(r) {
  return Number(/lock_bound_holders:(\d+)/.exec(await r.info('lock'))[1]);
}

async function waitFor(what, pred, timeoutMs = 5000) {
  const end = Date.now() + timeoutMs;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error(`timed out waiting for: ${what}`);
    await sleep(10);
  }
}

// The protected resource: refuses a write older than one it has seen.
class FencedStore {
  constructor() {
    this.lastToken = 0n;
    this.value = null;
  }
  write(value, token) {
    if (token < this.lastToken) return false;
    this.lastToken = token;
    this.value = value;
    return true;
  }
}

test('holds the lock with a token and releases it', async () => {
  const r = client();
  const other = client();
  const out = await withLock(r, 'js:basic', { ttlMs: 10000 }, async (lease) => {
    assert.equal(typeof lease.token, 'bigint');
    assert.ok(lease.token > 0n);
    assert.deepEqual(await info(other, 'js:basic'), { [lease.owner]: [1, lease.token] });
    assert.equal(await other.call('LOCK.ACQUIRE', 'js:basic', 'intruder', 1000), null);
    assert.equal(lease.lost, false);
    lease.check();
    return 'done';
  });
  assert.equal(out, 'done');
  assert.equal(await info(other, 'js:basic'), null);
});

test('waits in the server until the holder releases, renewals not held up', async () => {
  const r = client();
  const holder = client();
  const first = BigInt(await holder.call('LOCK.ACQUIRE', 'js:wait', 'holder', 30000));
  // Someone holds another lock through the same client `r` meanwhile: its
  // watchdog must keep renewing while our acquire waits.
  const held = withLock(r, 'js:other', { ttlMs: 600 }, () => sleep(1200));
  setTimeout(() => holder.call('LOCK.RELEASE', 'js:wait', 'holder'), 900);
  await withLock(r, 'js:wait', { ttlMs: 10000, waitMs: 10000 }, async (lease) => {
    assert.ok(lease.token > first);
  });
  await held; // would throw LeaseLost if its renewals had waited behind ours
  assert.equal(await info(r, 'js:wait'), null);
});

test('a wait running out throws LockNotAcquired', async () => {
  const r = client();
  await r.call('LOCK.ACQUIRE', 'js:busy', 'holder', 30000);
  let ran = false;
  await assert.rejects(
    withLock(r, 'js:busy', { ttlMs: 1000, waitMs: 100 }, async () => {
      ran = true;
    }),
    (e) => e instanceof LockNotAcquired && /js:busy/.test(e.message),
  );
  assert.equal(ran, false);
  assert.deepEqual(Object.keys(await info(r, 'js:busy')), ['holder']);
  assert.equal((await r.call('LOCK.INFO', 'js:busy'))[5], 0); // no waiter left
  assert.equal(await r.call('LOCK.RELEASE', 'js:busy', 'holder'), 1);
});

test('the keepalive (or, without BIND, the watchdog) keeps the lease while the work runs', async () => {
  for (const bind of [true, false]) {
    const r = client();
    const other = client();
    const before = await renewCalls(other);
    await withLock(r, 'js:long', { ttlMs: 900, bind }, async (lease) => {
      assert.equal(lease.bound, bind);
      assert.equal(await boundHolders(other), bind ? 1 : 0);
      for (let i = 0; i < 4; i++) {
        await sleep(300); // 1.2 s of work: longer than the ttl
        assert.deepEqual(await info(other, 'js:long'), { [lease.owner]: [1, lease.token] });
        lease.check();
      }
    });
    assert.ok((await renewCalls(other)) - before >= 2);
    assert.equal(await info(other, 'js:long'), null);
    assert.equal(await boundHolders(other), 0);
  }
});

test('a bound lock is freed the moment its holder connection dies', async () => {
  const r = client({ connectionName: 'js-holder' });
  const admin = client();
  const waiter = client();
  let got;
  await assert.rejects(
    withLock(r, 'js:dies', { ttlMs: 6000 }, async (lease) => {
      const ids = (await admin.call('CLIENT', 'LIST'))
        .split('\n')
        .filter((l) => / name=js-holder /.test(l))
        .map((l) => /id=(\d+)/.exec(l)[1]);
      assert.ok(ids.length >= 1);
      const granted = waiter.call('LOCK.ACQUIRE', 'js:dies', 'next', 10000, 'WAIT', 5000);
      await waitFor('the waiter to queue', async () =>
        /lock_waiters:1/.test(await admin.info('lock')),
      );
      const start = Date.now();
      for (const id of ids) await admin.call('CLIENT', 'KILL', 'ID', id); // the process "dies"
      got = await granted;
      assert.ok(got !== null);
      assert.ok(Date.now() - start < 1000, 'granted at the close, not at the 6 s lease');
      await waitFor('the keepalive notices', () => lease.signal.aborted, 5000);
    }),
    (e) => e instanceof LeaseLost && /js:dies/.test(e.message),
  );
  assert.deepEqual(await info(admin, 'js:dies'), { next: [1, BigInt(got)] });
});

test('the watchdog stops at release and never renews after unlock', async () => {
  // The Redisson race: a renewal outliving unlock extends the next lock of
  // the same owner id. Here the owner is stable on purpose.
  const r = client();
  const other = client();
  await withLock(r, 'js:race', { ttlMs: 150, owner: 'worker-1' }, () => sleep(200));
  const afterRelease = await renewCalls(other);
  assert.notEqual(await other.call('LOCK.ACQUIRE', 'js:race', 'worker-1', 200), null);
  await sleep(500); // ten watchdog intervals
  assert.equal(await renewCalls(other), afterRelease, 'a renewal was sent after the release');
  assert.equal(await info(other, 'js:race'), null, 'the second lease was extended');
});

test('a lost lease aborts the signal, throws LeaseLost, leaves the successor alone', async () => {
  const r = client();
  const admin = client();
  let theirs;
  await assert.rejects(
    withLock(r, 'js:lost', { ttlMs: 300 }, async (lease) => {
      await admin.del('js:lost'); // forced unlock by an operator
      theirs = BigInt(await admin.call('LOCK.ACQUIRE', 'js:lost', 'successor', 10000));
      await waitFor('the watchdog notices', () => lease.signal.aborted);
      assert.ok(lease.signal.reason instanceof LeaseLost);
      assert.throws(() => lease.check(), /LOCK\.KEEPALIVE renewed nothing/);
    }),
    (e) => e instanceof LeaseLost && /js:lost/.test(e.message),
  );
  assert.deepEqual(await info(admin, 'js:lost'), { successor: [1, theirs] });
});

test('the fencing token rejects the stale holder\'s write', async () => {
  const admin = client();
  const store = new FencedStore();
  await assert.rejects(
    withLock(client(), 'js:fence', { ttlMs: 10000 }, async (a) => {
      assert.ok(store.write('from a', a.token));
      await admin.del('js:fence'); // a stalls; its lease is taken away
      await withLock(client(), 'js:fence', { ttlMs: 10000 }, async (b) => {
        assert.ok(b.token > a.token);
        assert.ok(store.write('from b', b.token));
      });
      assert.equal(store.write('late from a', a.token), false);
    }),
    LeaseLost,
  );
  assert.equal(store.value, 'from b');
});

test('an error in the work releases and propagates', async () => {
  const r = client();
  await assert.rejects(
    withLock(r, 'js:boom', {}, async () => {
      throw new RangeError('boom');
    }),
    RangeError,
  );
  assert.equal(await info(r, 'js:boom'), null);
});

async function main() {
  let passed = 0;
  let failed = 0;
  for (const t of tests) {
    try {
      await t.fn();
      passed++;
      console.log(`ok   ${t.name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${t.name}`);
      console.log(e && e.stack ? e.stack : e);
    }
  }
  for (const c of clients) c.disconnect();
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

main();
