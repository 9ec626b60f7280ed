//! How the module follows lock keys through what other commands do to them:
//! binary key names in every path the timer and the events take, locks that
//! appear under a new name or in a new database (RENAME, MOVE, SWAPDB,
//! RESTORE, a restart from the AOF, a promotion) and a key's Redis TTL that
//! PERSIST or RESTORE changed. Each of these once went wrong (issue 10).

use std::time::{Duration, Instant};

use crate::common::*;

fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn stat(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .unwrap_or_else(|_| panic!("lock_{field} is an integer"))
}

/// Sends a grant with WAIT on `c` without reading the reply.
fn send_wait(c: &mut Conn, key: &[u8], owner: &str, ttl: i64, wait_ms: i64) {
    c.send(&[
        b"LOCK.ACQUIRE".as_slice(),
        key,
        owner.as_bytes(),
        ttl.to_string().as_bytes(),
        b"WAIT",
        wait_ms.to_string().as_bytes(),
    ])
    .expect("send");
}

/// Reads the reply to a blocked request, which must come within `limit`.
fn reply_within(c: &mut Conn, limit: Duration, what: &str) -> (Reply, Duration) {
    let start = Instant::now();
    c.set_timeout(limit);
    let r = c
        .read_reply()
        .unwrap_or_else(|e| panic!("{what}: no reply within {limit:?} ({e})"));
    c.set_timeout(DEFAULT_TIMEOUT);
    (r, start.elapsed())
}

fn wait_for_waiters(c: &mut Conn, n: i64) {
    wait_until(Duration::from_secs(5), "the request to wait", || {
        stat(c, "waiters") >= n
    });
}

fn assert_no_panic(s: &Server) {
    let log = s.log_tail(400);
    assert!(
        !log.contains("panic caught"),
        "the module caught a panic:\n{log}"
    );
}

// ---------------------------------------------------------------------------
// Key names with a NUL byte
// ---------------------------------------------------------------------------

#[test]
fn a_key_name_with_a_nul_byte_is_woken_at_expiry_and_by_del() {
    let s = Server::start();
    let mut a = s.conn();
    let key: &[u8] = b"a\x00b";
    token(a.cmd(&[b"LOCK.ACQUIRE".as_slice(), key, b"o1", b"300"]));
    let mut b = s.conn();
    send_wait(&mut b, key, "o2", 5_000, 3_000);
    let (r, took) = reply_within(&mut b, Duration::from_secs(4), "the NUL-key waiter");
    assert!(matches!(r, Reply::Int(_)), "granted at expiry: {r:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "granted at the holder's deadline, not at the WAIT deadline ({took:?})"
    );
    // DEL wakes it too.
    let mut c = s.conn();
    send_wait(&mut c, key, "o3", 5_000, 0);
    wait_for_waiters(&mut a, 1);
    a.cmd(&[b"DEL".as_slice(), key]).int();
    let (r, _) = reply_within(&mut c, Duration::from_secs(3), "the waiter after DEL");
    assert!(matches!(r, Reply::Int(_)), "granted after DEL: {r:?}");
    assert_no_panic(&s);
}

/// A shared lock on a NUL key whose readers expire apart is visited by the
/// timer; that visit must never stall the visits of other keys.
#[test]
fn a_nul_key_never_stalls_the_timer_for_other_keys() {
    let s = Server::start();
    let mut a = s.conn();
    let shared: &[u8] = b"cfg\x00v2";
    token(a.cmd(&[b"LOCK.READ".as_slice(), shared, b"r1", b"100"]));
    token(a.cmd(&[b"LOCK.READ".as_slice(), shared, b"r2", b"60000"]));
    token(a.acquire("orders", "x", 400));
    let mut w = s.conn();
    send_wait(&mut w, b"orders", "w", 1_000, 3_000);
    let (r, took) = reply_within(&mut w, Duration::from_secs(4), "the waiter on orders");
    assert!(matches!(r, Reply::Int(_)), "granted: {r:?}");
    assert!(
        took < Duration::from_millis(2_500),
        "granted at the holder's deadline ({took:?})"
    );
    // The dead reader left the NUL key.
    wait_until(Duration::from_secs(3), "the dead reader to go", || {
        stat(&mut a, "holders_shared") == 1
    });
    assert_no_panic(&s);
}

// ---------------------------------------------------------------------------
// Locks that appear under a new name or in another database
// ---------------------------------------------------------------------------

/// Two readers expiring apart: r1 after 500 ms, r2 after a minute.
fn two_readers(c: &mut Conn, key: &str) {
    two_readers_for(c, key, 500);
}

fn two_readers_for(c: &mut Conn, key: &str, r1_ms: i64) {
    token(c.read(key, "r1", r1_ms));
    token(c.read(key, "r2", 60_000));
}

fn assert_dead_reader_dropped(c: &mut Conn, db: &str, key: &str, what: &str) {
    c.cmd(&["SELECT", db]).ok();
    wait_until(Duration::from_secs(4), what, || {
        stat(c, "holders_shared") == 1
    });
    let i = c
        .lock_info(key)
        .unwrap_or_else(|| panic!("{what}: lock gone"));
    assert_eq!(i.holders.len(), 1, "{what}");
    assert_eq!(i.holders[0].owner, b"r2", "{what}");
    let expired = stat(c, "expired_leases");
    assert!(
        expired >= 1,
        "{what}: counted ({expired})\n{}",
        c.info("lock")
    );
}

#[test]
fn dead_readers_leave_after_rename() {
    let s = Server::start();
    let mut c = s.conn();
    two_readers(&mut c, "k");
    c.cmd(&["RENAME", "k", "k2"]).ok();
    assert_dead_reader_dropped(&mut c, "0", "k2", "after RENAME");
}

#[test]
fn dead_readers_leave_after_move_and_swapdb() {
    let s = Server::start();
    let mut c = s.conn();
    two_readers(&mut c, "k");
    assert_eq!(c.cmd(&["MOVE", "k", "3"]).int(), 1);
    assert_dead_reader_dropped(&mut c, "3", "k", "after MOVE");
    c.cmd(&["SELECT", "0"]).ok();
    two_readers(&mut c, "s");
    c.cmd(&["SWAPDB", "0", "5"]).ok();
    wait_until(Duration::from_secs(4), "after SWAPDB", || {
        stat(&mut c, "holders_shared") == 2
    });
    c.cmd(&["SELECT", "5"]).ok();
    assert_eq!(c.lock_info("s").expect("lock in db 5").holders.len(), 1);
}

#[test]
fn dead_readers_leave_after_restore_under_a_new_name() {
    let s = Server::start();
    let mut c = s.conn();
    two_readers(&mut c, "k");
    let payload = c.cmd(&["DUMP", "k"]).bulk().to_vec();
    let pttl = c.pttl("k");
    c.cmd(&["DEL", "k"]).int();
    c.cmdv(&[
        b"RESTORE".to_vec(),
        b"k2".to_vec(),
        pttl.to_string().into_bytes(),
        payload,
    ])
    .ok();
    assert_dead_reader_dropped(&mut c, "0", "k2", "after RESTORE");
}

#[test]
fn dead_readers_leave_after_a_restart_from_the_aof() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("aof-use-rdb-preamble no")
        .config("appendfsync always")
        .start();
    let mut c = s.conn();
    two_readers(&mut c, "k");
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_dead_reader_dropped(&mut c, "0", "k", "after an AOF restart");
}

#[test]
fn dead_readers_leave_after_a_restart_from_the_rdb() {
    let mut s = Server::start();
    let mut c = s.conn();
    two_readers(&mut c, "k");
    c.cmd(&["SAVE"]).ok();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_dead_reader_dropped(&mut c, "0", "k", "after an RDB restart");
}

#[test]
fn dead_readers_leave_after_a_promotion() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let start = Instant::now();
    two_readers_for(&mut m, "k", 5_000);
    wait_for_sync(&master, &replica);
    // Still both on the replica: the master's own timer has not dropped r1.
    assert_eq!(stat(&mut replica.conn(), "holders_shared"), 2);
    master.kill9();
    assert!(
        start.elapsed() < Duration::from_millis(4_900),
        "set-up too slow"
    );
    // r1's lease ends while nobody is master.
    sleep_ms(5_200_u64.saturating_sub(start.elapsed().as_millis() as u64));
    replica.promote();
    let mut r = replica.conn();
    assert_dead_reader_dropped(&mut r, "0", "k", "after a promotion");
}

/// Issue 38: what came due on a replica is visited after its promotion a
/// tick's share at a time (no pass over all of it in the promotion): 5,000
/// keys of two readers whose first reader's lease ends while nobody is
/// master; promoted, every dead reader goes (each counted once), and
/// writers waiting on some of those keys are granted when the live reader
/// releases.
#[test]
fn many_dead_readers_leave_after_a_promotion_and_their_waiters_are_granted() {
    const KEYS: usize = 5000;
    const WRITERS: usize = 100;
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let start = Instant::now();
    for i in 0..KEYS {
        let key = format!("k{i}");
        m.send(&["LOCK.READ", &key, "r1", "6000"]).expect("send");
        m.send(&["LOCK.READ", &key, "r2", "60000"]).expect("send");
    }
    for _ in 0..2 * KEYS {
        token(m.read_reply().expect("a grant"));
    }
    let granted = start.elapsed();
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(stat(&mut r, "holders_shared"), 2 * KEYS as i64);
    master.kill9();
    assert!(
        start.elapsed() < Duration::from_millis(5_500),
        "set-up too slow"
    );
    // Every r1's lease ends while nobody is master, and the replica's
    // timer has come to them.
    let after = granted + Duration::from_millis(6_800);
    std::thread::sleep(after.saturating_sub(start.elapsed()));
    assert_eq!(
        stat(&mut r, "holders_shared"),
        2 * KEYS as i64,
        "a replica writes nothing"
    );
    let expired = stat(&mut r, "expired_leases");
    replica.promote();
    let mut writers: Vec<Conn> = (0..WRITERS)
        .map(|i| {
            let mut w = replica.conn();
            send_wait(
                &mut w,
                format!("k{i}").as_bytes(),
                &format!("w{i}"),
                10_000,
                20_000,
            );
            w
        })
        .collect();
    wait_until(Duration::from_secs(20), "every dead reader to go", || {
        stat(&mut r, "holders_shared") == KEYS as i64
    });
    assert_eq!(
        stat(&mut r, "expired_leases") - expired,
        KEYS as i64,
        "each counted once"
    );
    wait_until(Duration::from_secs(10), "the writers to wait", || {
        stat(&mut r, "waiters") == WRITERS as i64
    });
    for i in 0..WRITERS {
        assert_eq!(r.cmd(&["LOCK.RELEASE", &format!("k{i}"), "r2"]).int(), 1);
    }
    for (i, w) in writers.iter_mut().enumerate() {
        let (reply, _) = reply_within(w, Duration::from_secs(10), &format!("w{i}'s grant"));
        token(reply);
        let info = r.lock_info(format!("k{i}")).expect("held");
        assert_eq!(info.holders.len(), 1);
        assert_eq!(info.holders[0].owner, format!("w{i}").into_bytes());
    }
}

// ---------------------------------------------------------------------------
// The key's Redis TTL is the latest deadline in it
// ---------------------------------------------------------------------------

#[test]
fn persist_cannot_keep_a_lock_key_beyond_its_last_holder() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 800));
    assert_eq!(c.cmd(&["PERSIST", "k"]).int(), 1);
    wait_until(Duration::from_secs(3), "the TTL to come back", || {
        let p = c.pttl("k");
        p > 0 && p <= 800
    });
    wait_until(Duration::from_secs(4), "the key to go", || {
        c.cmd(&["EXISTS", "k"]).int() == 0
    });
    assert_eq!(stat(&mut c, "keys"), 0);
}

#[test]
fn pexpire_cannot_move_a_lock_keys_ttl_away_from_its_last_deadline() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 5_000));
    assert_eq!(c.cmd(&["PEXPIRE", "k", "100000"]).int(), 1);
    wait_until(Duration::from_secs(3), "the TTL to come back", || {
        c.pttl("k") <= 5_000
    });
}

/// The keyspace callback looks at a key's `EXPIRE` only if its name may be
/// a lock's (a count of the names locks have): every way a lock gets a
/// name counts it, so a `PEXPIRE` on the lock is still undone wherever it
/// went, and whatever other keys and locks did before.
#[test]
fn pexpire_is_undone_on_a_lock_under_every_name_it_gets() {
    let s = Server::start();
    let mut c = s.conn();
    let guarded = |c: &mut Conn, db: &str, key: &str, what: &str| {
        c.cmd(&["SELECT", db]).ok();
        assert_eq!(c.cmd(&["PEXPIRE", key, "100000"]).int(), 1, "{what}");
        wait_until(Duration::from_secs(3), what, || {
            let p = c.pttl(key);
            p > 0 && p <= 60_000
        });
        c.cmd(&["SELECT", "0"]).ok();
    };
    // Other keys come and go around the locks: plain keys renamed, a lock
    // released and another taken, a lock deleted.
    c.cmd(&["SET", "plain", "v"]).ok();
    c.cmd(&["RENAME", "plain", "plain2"]).ok();
    token(c.acquire("gone", "a", 60_000));
    assert_eq!(c.cmd(&["DEL", "gone"]).int(), 1);
    token(c.acquire("released", "a", 60_000));
    assert_eq!(c.release("released", "a"), Reply::Int(1));

    token(c.acquire("k", "a", 60_000));
    guarded(&mut c, "0", "k", "a new lock");
    c.cmd(&["RENAME", "k", "k2"]).ok();
    guarded(&mut c, "0", "k2", "after RENAME");
    // A plain key renamed onto a lock's name, and a lock taken there again.
    c.cmd(&["SET", "plain3", "v"]).ok();
    c.cmd(&["RENAME", "plain3", "k2"]).ok();
    assert_eq!(c.cmd(&["PEXPIRE", "k2", "100000"]).int(), 1);
    assert!(c.pttl("k2") > 60_000, "a plain key keeps its TTL");
    c.cmd(&["DEL", "k2"]).int();
    token(c.acquire("k2", "a", 60_000));
    guarded(&mut c, "0", "k2", "a lock again where a plain key was");
    assert_eq!(c.cmd(&["MOVE", "k2", "3"]).int(), 1);
    guarded(&mut c, "3", "k2", "after MOVE");
    c.cmd(&["SWAPDB", "3", "4"]).ok();
    guarded(&mut c, "4", "k2", "after SWAPDB");
    c.cmd(&["SELECT", "4"]).ok();
    let payload = c.cmd(&["DUMP", "k2"]).bulk().to_vec();
    c.cmd(&["SELECT", "0"]).ok();
    c.cmdv(&[b"RESTORE".to_vec(), b"k3".to_vec(), b"0".to_vec(), payload])
        .ok();
    guarded(&mut c, "0", "k3", "after RESTORE");
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    guarded(&mut c, "0", "k3", "after DEBUG RELOAD");
    guarded(&mut c, "4", "k2", "the other after DEBUG RELOAD");
    c.cmd(&["FLUSHALL"]).ok();
    token(c.acquire("k4", "a", 60_000));
    guarded(&mut c, "0", "k4", "a lock after FLUSHALL");
    // A plain key's TTL is its own (a name no lock has).
    c.cmd(&["SET", "plain4", "v"]).ok();
    assert_eq!(c.cmd(&["PEXPIRE", "plain4", "100000"]).int(), 1);
    assert!(c.pttl("plain4") > 60_000, "a plain key keeps its TTL");
    assert_no_panic(&s);
}

/// Sends every command of `cmds`, a thousand at a time, and checks each
/// reply with `ok`.
fn pipelined(c: &mut Conn, cmds: &[Vec<Vec<u8>>], ok: impl Fn(&Reply) -> bool) {
    for chunk in cmds.chunks(1000) {
        for args in chunk {
            c.send(args).expect("send");
        }
        for args in chunk {
            let r = c.read_reply().expect("a reply");
            assert!(ok(&r), "{:?}: {r:?}", args.first().map(|a| show(a)));
        }
    }
}

/// A lock's TTL write is undone whatever its name's shape (what the name
/// filter hashes: empty, shorter than a half word, than a word, one to two
/// words, longer, binary with NULs, names that differ only in the middle),
/// among other keys of every shape, and with the same name held in
/// several databases, one of them deleted (its entry and the others'
/// agree on every bit: they stand for each other).
#[test]
fn ttl_writes_are_undone_on_locks_of_every_name_shape() {
    let s = Server::start();
    let mut c = s.conn();
    let mut names: Vec<Vec<u8>> = (0..=20).map(|n| vec![b'n'; n]).collect();
    names.extend((1..=20).map(|n| vec![0u8; n]));
    names.extend((1..=20).map(|n| (0..n as u8).map(|b| b.wrapping_mul(37)).collect()));
    names.push(b"a\0b".to_vec());
    names.push(b"\0\xff\0\xfe\0".to_vec());
    names.extend((0..40).map(|i| format!("tenant:acme:user:{i:08}:session:lock").into_bytes()));
    // Other keys beside them, of the same shapes, with their own TTLs.
    let others: Vec<Vec<u8>> = names
        .iter()
        .map(|n| [b"o".as_slice(), n].concat())
        .collect();
    let set: Vec<Vec<Vec<u8>>> = others
        .iter()
        .map(|k| vec![b"SET".to_vec(), k.clone(), b"v".to_vec()])
        .collect();
    pipelined(&mut c, &set, |r| r.is("OK"));
    let acquire: Vec<Vec<Vec<u8>>> = names
        .iter()
        .map(|k| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                k.clone(),
                b"o".to_vec(),
                b"60000".to_vec(),
            ]
        })
        .collect();
    pipelined(&mut c, &acquire, |r| r.as_int().is_some());
    for k in &names {
        assert_eq!(
            c.cmdv(&[b"PEXPIRE".to_vec(), k.clone(), b"100000".to_vec()])
                .int(),
            1
        );
        assert_eq!(c.cmdv(&[b"PERSIST".to_vec(), k.clone()]).int(), 1);
    }
    for k in &others {
        assert_eq!(
            c.cmdv(&[b"PEXPIRE".to_vec(), k.clone(), b"100000".to_vec()])
                .int(),
            1
        );
    }
    wait_until(Duration::from_secs(5), "every lock's TTL back", || {
        names.iter().all(|k| {
            let p = c.pttl(k);
            p > 0 && p <= 60_000
        })
    });
    assert!(
        others.iter().all(|k| c.pttl(k) > 60_000),
        "other keys keep their TTL"
    );
    // One name in three databases; deleted in one, the others still undo.
    for db in ["1", "2", "3"] {
        c.cmd(&["SELECT", db]).ok();
        token(c.acquire("dup", "o", 60_000));
    }
    c.cmd(&["SELECT", "2"]).ok();
    assert_eq!(c.cmd(&["DEL", "dup"]).int(), 1);
    for db in ["1", "3"] {
        c.cmd(&["SELECT", db]).ok();
        assert_eq!(c.cmd(&["PEXPIRE", "dup", "100000"]).int(), 1);
        wait_until(Duration::from_secs(3), "the TTL of dup back", || {
            let p = c.pttl("dup");
            p > 0 && p <= 60_000
        });
    }
    assert_no_panic(&s);
}

/// `FLUSHDB` of one database while locks exist in another: the flushed
/// locks' names leave the name filter (a rebuild from the locks left), so
/// TTL writes on keys that take those names afterwards open no key
/// (`lock_name_lookups`); the lock left in the other database is still
/// followed.
#[test]
fn a_flushdb_leaves_no_name_of_its_locks_behind() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["SELECT", "1"]).ok();
    token(c.acquire("kept", "o", 60_000));
    c.cmd(&["SELECT", "0"]).ok();
    let names: Vec<Vec<u8>> = (0..500)
        .map(|i| format!("flushed:{i}").into_bytes())
        .collect();
    let acquire: Vec<Vec<Vec<u8>>> = names
        .iter()
        .map(|k| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                k.clone(),
                b"o".to_vec(),
                b"60000".to_vec(),
            ]
        })
        .collect();
    pipelined(&mut c, &acquire, |r| r.as_int().is_some());
    // While they are locks, each TTL write opens its key.
    let before = stat(&mut c, "name_lookups");
    c.cmd(&["PEXPIRE", "flushed:0", "100000"]).int();
    assert!(stat(&mut c, "name_lookups") > before);
    c.cmd(&["FLUSHDB"]).ok();
    let expire: Vec<Vec<Vec<u8>>> = names
        .iter()
        .map(|k| {
            vec![
                b"SET".to_vec(),
                k.clone(),
                b"v".to_vec(),
                b"EX".to_vec(),
                b"100".to_vec(),
            ]
        })
        .collect();
    // The rebuild takes a few turns of the event loop.
    wait_until(
        Duration::from_secs(5),
        "the flushed names to leave the filter",
        || {
            let before = stat(&mut c, "name_lookups");
            pipelined(&mut c, &expire, |r| r.is("OK"));
            stat(&mut c, "name_lookups") == before
        },
    );
    // Rebuilt at the smallest size: in the static table, no heap.
    assert_eq!(stat(&mut c, "name_filter_memory"), 0);
    // The lock in database 1 is still followed.
    c.cmd(&["SELECT", "1"]).ok();
    assert_eq!(c.cmd(&["PEXPIRE", "kept", "100000"]).int(), 1);
    wait_until(Duration::from_secs(3), "the TTL of kept back", || {
        let p = c.pttl("kept");
        p > 0 && p <= 60_000
    });
    assert_no_panic(&s);
}

/// Past the static table's room the filter grows (a rebuild from the lock
/// keys, in slices), `lock_name_filter_memory` says by how much, every
/// lock's TTL write is still undone, and other names still open no key
/// but by chance (a few in a hundred at most).
#[test]
fn the_name_filter_grows_with_the_locks_and_still_tells_them_apart() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(stat(&mut c, "name_filter_memory"), 0);
    let locks = 120_000;
    let acquire: Vec<Vec<Vec<u8>>> = (0..locks)
        .map(|i| {
            vec![
                b"LOCK.ACQUIRE".to_vec(),
                format!("grown:{i}").into_bytes(),
                b"o".to_vec(),
                b"600000".to_vec(),
            ]
        })
        .collect();
    pipelined(&mut c, &acquire, |r| r.as_int().is_some());
    wait_until(Duration::from_secs(30), "the filter to grow", || {
        stat(&mut c, "name_filter_memory") > 0
    });
    for i in (0..locks).step_by(997) {
        let k = format!("grown:{i}");
        assert_eq!(c.cmd(&["PEXPIRE", &k, "1000000"]).int(), 1);
        wait_until(Duration::from_secs(3), "a lock's TTL back", || {
            let p = c.pttl(&k);
            p > 0 && p <= 600_000
        });
    }
    let before = stat(&mut c, "name_lookups");
    let others: Vec<Vec<Vec<u8>>> = (0..10_000)
        .map(|i| {
            vec![
                b"SET".to_vec(),
                format!("grown:{}", locks + i).into_bytes(),
                b"v".to_vec(),
                b"EX".to_vec(),
                b"100".to_vec(),
            ]
        })
        .collect();
    // Once the rebuild is done (a look-up a name until then at worst).
    let mut first = Some(before);
    wait_until(Duration::from_secs(30), "few other names opened", || {
        let before = first.take().unwrap_or_else(|| stat(&mut c, "name_lookups"));
        pipelined(&mut c, &others, |r| r.is("OK"));
        stat(&mut c, "name_lookups") - before < 500
    });
    // Loaded back (the filter emptied by the flush before the load, grown
    // again while it loads, rebuilt once the event loop turns).
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    wait_until(Duration::from_secs(30), "the filter to grow again", || {
        stat(&mut c, "name_filter_memory") > 0
    });
    for i in (0..locks).step_by(1999) {
        let k = format!("grown:{i}");
        assert_eq!(c.cmd(&["PEXPIRE", &k, "1000000"]).int(), 1);
        wait_until(Duration::from_secs(3), "a loaded lock's TTL back", || {
            let p = c.pttl(&k);
            p > 0 && p <= 600_000
        });
    }
    // (The rebuild may still be under way: until it is done, a name may
    // be looked up for nothing more often.)
    wait_until(
        Duration::from_secs(30),
        "few other names opened after a reload",
        || {
            let before = stat(&mut c, "name_lookups");
            pipelined(&mut c, &others, |r| r.is("OK"));
            stat(&mut c, "name_lookups") - before < 500
        },
    );
    assert_no_panic(&s);
}

#[test]
fn restore_with_ttl_zero_gets_the_latest_deadline_as_its_ttl() {
    let s = Server::start();
    let mut c = s.conn();
    // An exclusive lock: nothing else schedules a visit of it.
    token(c.acquire("k", "a", 900));
    let payload = c.cmd(&["DUMP", "k"]).bulk().to_vec();
    c.cmd(&["DEL", "k"]).int();
    c.cmdv(&[b"RESTORE".to_vec(), b"k".to_vec(), b"0".to_vec(), payload])
        .ok();
    wait_until(Duration::from_secs(3), "the TTL to be set", || {
        let p = c.pttl("k");
        p > 0 && p <= 900
    });
    wait_until(Duration::from_secs(4), "the key to go", || {
        c.cmd(&["DBSIZE"]).int() == 0
    });
    assert_eq!(stat(&mut c, "keys"), 0);
}

// ---------------------------------------------------------------------------
// Module arguments are quoted in the log, never interpreted
// ---------------------------------------------------------------------------

/// A bad `MODULE LOAD` argument is logged as text: a NUL byte once panicked
/// outside any guard, and a `%` was read as a printf directive.
#[test]
fn bad_module_arguments_with_nul_or_percent_fail_the_load_cleanly() {
    let s = Server::builder()
        .without_module()
        .config("enable-module-command yes")
        .start();
    let mut c = s.conn();
    let module = module_path().to_string_lossy().into_owned().into_bytes();
    for (name, value) in [
        (b"max\x00ttl".as_slice(), b"5".as_slice()),
        (b"%s%s%s%s%s%n".as_slice(), b"5".as_slice()),
        (b"max-ttl".as_slice(), b"%s%n".as_slice()),
    ] {
        let r = c.cmdv(&[
            b"MODULE".to_vec(),
            b"LOAD".to_vec(),
            module.clone(),
            name.to_vec(),
            value.to_vec(),
        ]);
        assert!(r.is_err(), "the load fails: {r:?}");
        c.ping();
    }
    let log = s.log_tail(50);
    assert!(log.contains("unknown module argument 'max\\0ttl'"), "{log}");
    assert!(
        log.contains("unknown module argument '%s%s%s%s%s%n'"),
        "{log}"
    );
    assert!(log.contains("'max-ttl' must be an integer"), "{log}");
    assert!(!log.contains("panic"), "{log}");
}

/// CPU time the process `pid` used so far, in clock ticks (user + system,
/// `/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // After the command's name in parentheses: state is the first field,
    // utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(')').expect("a stat line").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// A visit planned far away (a shared lock whose readers' leases run out
/// apart, the first of them 50 minutes away) leaves the event loop asleep
/// between requests. Redis 7.0 keeps a module timer's next firing as an
/// `int` of microseconds (fixed in Redis 7.2): a module timer more than
/// 35.8 minutes away, once another of the module's timers had fired before
/// it (the counters' looks, a second apart until ten seconds after the
/// last command), wrapped into the past, and the server spun, every turn
/// of its event loop firing the timer handler with nothing due (the busy
/// server of benchmarks.md, section 11, did, with a visit 58 minutes away).
/// The module arms its timer at most 30 minutes ahead.
#[test]
fn a_far_visit_leaves_the_server_asleep() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["LOCK.READ", "far", "r1", "3600000"]).int();
    c.cmd(&["LOCK.READ", "far", "r2", "3000000"]).int();
    // The counters' looks stop ten seconds after the last change.
    std::thread::sleep(Duration::from_secs(13));
    let pid = s.pid().expect("the server runs");
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    // Asleep: a few cron ticks (`hz 10`), well under a tick of CPU; a
    // spinning server uses what the machine gives it, a core's worth when
    // it is idle (200 ticks in 2 s).
    assert!(
        used < 20,
        "the idle server used {used} ticks of CPU in 2 s: its event loop spins"
    );
    // Both readers still hold.
    let holders = c.lock_info("far").map_or(0, |i| i.holders.len());
    assert_eq!(holders, 2);
}
