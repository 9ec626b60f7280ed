//! Forged, restored and repeated state (issue 32; contract v3, "Limits and
//! forged state"): no lock state ever fails a load or drops a key that is
//! not a lock; RESTORE refuses what a load would not take; token jumps do
//! not compound where nothing new arrived; the counters and the timer's
//! index stay true around restored and removed locks.

use crate::common::*;
use std::time::{Duration, Instant};

/// Ten years of ms: the horizon past the clock no token can be beyond
/// (`lock_core::tokens::HORIZON_MS`).
const HORIZON_MS: i64 = 10 * 365 * 24 * 3600 * 1000;
const DAY_MS: i64 = 24 * 3600 * 1000;

#[track_caller]
fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn dump(c: &mut Conn, key: &str) -> Vec<u8> {
    c.cmd(&["DUMP", key]).bulk().to_vec()
}

fn stat(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .expect("an integer field")
}

fn le(n: i64) -> [u8; 8] {
    (n as u64).to_le_bytes()
}

/// The RDB's spelling of a 64-bit unsigned number (`rdbSaveLen`).
fn rdb_u64(n: i64) -> Vec<u8> {
    rdb_len(n as u64)
}

fn dbsize(c: &mut Conn) -> i64 {
    c.cmd(&["DBSIZE"]).int()
}

/// Issue 32.1: a token at the horizon, restored and deleted, then saves and
/// start-ups in a row: the second start-up refused its own file (every key
/// lost). Two DEBUG RELOADs did the same.
#[test]
fn a_restored_token_at_the_horizon_never_fails_a_load() {
    let mut s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "rdbcompression", "no"]).ok();
    c.cmd(&["SET", "plain", "kept"]).ok();
    let t = token(c.acquire("x", "a", 100_000));
    let payload = dump(&mut c, "x");
    // A second below the horizon as this process reads the clock: the
    // server's clock is the same one.
    let edge = (now_ms() + HORIZON_MS - 1_000) * 1000;
    let forged = with_bytes_replaced(&payload, &le(t), &le(edge));
    c.cmd(&[b"RESTORE".as_slice(), b"f", b"0", &forged]).ok();
    assert_eq!(c.lock_info("f").expect("restored").holder("a").token, edge);
    // What RESTORE accepted, a load accepts.
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(c.lock_info("f").expect("reloaded").holder("a").token, edge);
    assert_eq!(c.cmd(&["DEL", "f"]).int(), 1);
    let keys = dbsize(&mut c);
    for round in 0..3 {
        s.shutdown_save();
        if let Err(e) = s.try_restart() {
            panic!("start-up {round} after the restored token: {e}");
        }
        c = s.conn();
        assert_eq!(dbsize(&mut c), keys, "start-up {round}");
        assert_eq!(c.cmd(&["GET", "plain"]).bulk(), b"kept");
    }
    for round in 0..3 {
        let r = c.cmd(&["DEBUG", "RELOAD"]);
        assert!(r.is("OK"), "DEBUG RELOAD {round}: {r:?}");
        assert_eq!(dbsize(&mut c), keys, "DEBUG RELOAD {round}");
    }
    // Grants go on, above the restored token, within the token space.
    let next = token(c.acquire("y", "a", 100_000));
    assert!(next > edge && next < i64::MAX / 2, "{next}");
    let again = dump(&mut c, "y");
    c.cmd(&[b"RESTORE".as_slice(), b"y2", b"0", &again]).ok();
    // Nothing had to be fixed on the way.
    assert_eq!(stat(&mut c, "loaded_state_fixed"), 0);
}

/// Issue 32.1: a file whose saved counter, one key's token, another's two
/// holders with one token and a third's lease no server can have made
/// loads: the counter clamped,
/// the lease clamped to `lock.max-ttl`, the impossible lock dropped, every
/// other key kept; each fix logged and counted.
#[test]
fn a_forged_file_loads_with_its_impossible_lock_state_clamped_or_dropped() {
    let mut s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "rdbcompression", "no"]).ok();
    c.cmd(&["SET", "plain", "kept"]).ok();
    let good = token(c.acquire("good", "a", 100_000));
    let late = token(c.acquire("late", "a", 150_000));
    let late_deadline = c.cmd(&["PEXPIRETIME", "late"]).int();
    // Two readers, to be given one token: a structure no server makes.
    let r1 = token(c.read("dup", "r1", 100_000));
    let r2 = token(c.read("dup", "r2", 100_000));
    // The last grant: its token is also the saved counter.
    let bad = token(c.acquire("bad", "a", 200_000));
    assert_eq!(stat(&mut c, "last_token"), bad);
    c.cmd(&["SAVE"]).ok();
    s.shutdown_nosave();
    let path = s.dir.join("dump.rdb");
    let file = std::fs::read(&path).expect("dump.rdb");
    // The counter (an RDB number) and the lock's token (little-endian in
    // its block) are spelled differently: each replaced on its own.
    let counter = i64::MAX - 5;
    let file = with_bytes_replaced(&file, &rdb_u64(bad), &rdb_u64(counter));
    let file = with_bytes_replaced(&file, &le(bad), &le(i64::MAX - 7));
    let file = with_bytes_replaced(&file, &le(r2), &le(r1));
    // The lease (and the key's own expiry, spelled alike) a century long.
    let century = now_ms() + 100 * 365 * DAY_MS;
    let file = with_bytes_replaced(&file, &le(late_deadline), &le(century));
    std::fs::write(&path, file).expect("write dump.rdb");
    if let Err(e) = s.try_restart() {
        panic!("the server refused a file with forged lock state: {e}");
    }
    let mut c = s.conn();
    assert_eq!(c.cmd(&["GET", "plain"]).bulk(), b"kept");
    assert_eq!(c.lock_info("good").expect("good").holder("a").token, good);
    let l = c.lock_info("late").expect("late, its lease clamped");
    assert_eq!(l.holder("a").token, late);
    let ttl = l.holder("a").ttl;
    assert!(ttl > 0 && ttl <= 30 * DAY_MS, "ttl {ttl}");
    for dropped in ["bad", "dup"] {
        assert!(c.lock_info(dropped).is_none(), "{dropped} is dropped");
        wait_until(
            Duration::from_secs(5),
            "the dropped lock's key gone",
            || c.cmd(&["EXISTS", dropped]).int() == 0,
        );
    }
    assert_eq!(stat(&mut c, "loaded_state_fixed"), 4);
    let log = s.log_tail(200);
    assert!(log.contains("saved token counter"), "{log}");
    assert!(log.contains("dropped a loaded lock"), "{log}");
    // The counter was clamped to the horizon, not taken as it was.
    let next = token(c.acquire("n", "b", 100_000));
    assert!(next > bad && next <= (now_ms() + HORIZON_MS + 1_000) * 1000);
    // The same file again, while running: DEBUG RELOAD of the saved state.
    assert!(c.cmd(&["DEBUG", "RELOAD"]).is("OK"));
    assert_eq!(c.cmd(&["GET", "plain"]).bulk(), b"kept");
}

/// Issue 32.1: with the largest margin, reloads of the server's own save
/// and promotions with nothing received moved the counter a day each
/// (3,651 reloads, and the load refused the file); promotions after a
/// full sync did too. Now the counter stays within one margin of what was
/// issued or received.
#[test]
fn reloads_and_role_flips_leave_the_counter_within_one_margin() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "lock.clock-skew-ms", &DAY_MS.to_string()])
        .ok();
    let margin = DAY_MS * 1000;
    let started = Instant::now();
    let t0 = token(c.acquire("k", "a", 100_000));
    c.release("k", "a");
    for _ in 0..20 {
        assert!(c.cmd(&["DEBUG", "RELOAD"]).is("OK"));
    }
    let t1 = token(c.acquire("k", "a", 100_000));
    c.release("k", "a");
    assert!(t1 > t0 && t1 - t0 < margin, "after reloads: {t0} -> {t1}");
    // Promotions with nothing received: a master that never answers.
    let nobody = free_port().to_string();
    for _ in 0..20 {
        c.cmd(&["REPLICAOF", "127.0.0.1", &nobody]).ok();
        c.cmd(&["REPLICAOF", "NO", "ONE"]).ok();
    }
    let t2 = token(c.acquire("k", "a", 100_000));
    c.release("k", "a");
    assert!(
        t2 > t1 && t2 - t1 < margin,
        "after promotions: {t1} -> {t2}"
    );
    // Promotions after full syncs: one margin past what came, not one
    // more for each flip.
    let m = Server::start();
    let tm = token(m.conn().acquire("m", "a", 100_000));
    for _ in 0..5 {
        s.replicaof(&m);
        s.promote();
    }
    let mut c = s.conn();
    let t3 = token(c.acquire("k", "a", 100_000));
    let clock = started.elapsed().as_millis() as i64 * 1000;
    let base = t2.max(tm);
    assert!(t3 > base, "{t3} <= {base}");
    assert!(
        t3 < base + margin + clock + 1_000_000,
        "after full syncs and promotions: {base} -> {t3} ({} margins)",
        (t3 - base) / margin
    );
}

/// Issue 32.4: a RESTORE of a lease no server grants (u64::MAX, or past
/// `lock.max-ttl`) was accepted: a lock that never ends.
#[test]
fn restore_refuses_a_lease_past_the_max_ttl() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "rdbcompression", "no"]).ok();
    token(c.acquire("x", "a", 100_000));
    let deadline = c.cmd(&["PEXPIRETIME", "x"]).int();
    let payload = dump(&mut c, "x");
    for bad in [u64::MAX, i64::MAX as u64, (now_ms() + 31 * DAY_MS) as u64] {
        let forged = with_bytes_replaced(&payload, &le(deadline), &bad.to_le_bytes());
        let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &forged]);
        assert!(r.is_err(), "deadline {bad}: {r:?}");
        assert_eq!(c.cmd(&["EXISTS", "t"]).int(), 0);
    }
    // Within the bound: taken as it is.
    let fine = now_ms() + 29 * DAY_MS;
    let forged = with_bytes_replaced(&payload, &le(deadline), &le(fine));
    c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &forged]).ok();
    let ttl = c.lock_info("t").expect("restored").holder("a").ttl;
    assert!(ttl > 28 * DAY_MS && ttl <= 29 * DAY_MS, "{ttl}");
}

/// Issue 32.4: a restored lease that had already ended added 2^32 - 5000
/// ms to `lock_hold_ms_sum`.
#[test]
fn a_restored_lease_that_had_ended_adds_no_wrapped_hold_time() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("short", "a", 200));
    let payload = dump(&mut c, "short");
    sleep_ms(300);
    c.cmd(&["DEL", "short"]);
    let before = stat(&mut c, "hold_ms_sum");
    c.cmd(&[b"RESTORE".as_slice(), b"short2", b"0", &payload])
        .ok();
    wait_until(Duration::from_secs(5), "the ended lease dropped", || {
        c.cmd(&["EXISTS", "short2"]).int() == 0
    });
    let added = stat(&mut c, "hold_ms_sum") - before;
    assert!((0..10_000).contains(&added), "hold_ms_sum grew by {added}");
}

/// Issue 32.4: `lock_timer_keys` kept entries (and their memory) of keys
/// DEL or FLUSHALL had removed, until their old due time.
#[test]
fn removed_locks_leave_the_timer_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    for how in ["DEL", "UNLINK", "FLUSHALL", "FLUSHDB", "SET"] {
        // Readers expiring apart: the key is visited at the first deadline.
        token(c.read("k", "r1", 100_000));
        token(c.read("k", "r2", 200_000));
        assert_eq!(stat(&mut c, "timer_keys"), 1, "{how}");
        match how {
            "DEL" | "UNLINK" => assert_eq!(c.cmd(&[how, "k"]).int(), 1),
            "SET" => {
                c.cmd(&["SET", "k", "v"]).ok();
                c.cmd(&["DEL", "k"]).int();
            }
            _ => {
                c.cmd(&[how]).ok();
            }
        }
        assert_eq!(stat(&mut c, "timer_keys"), 0, "after {how}");
    }
    // RENAME keeps the visit, at the new name.
    token(c.read("k", "r1", 100_000));
    token(c.read("k", "r2", 200_000));
    c.cmd(&["RENAME", "k", "k2"]).ok();
    wait_until(Duration::from_secs(2), "one timer key", || {
        stat(&mut c, "timer_keys") == 1
    });
}

/// Issue 32.4: a `CONFIG RESETSTAT` within the first cron period after
/// start-up was not seen: the counters kept counting from before it.
#[test]
fn resetstat_right_after_start_up_resets_the_counters() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 10_000));
    c.cmd(&["CONFIG", "RESETSTAT"]).ok();
    assert_eq!(stat(&mut c, "grants"), 0);
}

/// docs/commands.md: an expiry in the past deletes a lock as `DEL` does (a
/// waiter is granted at once); one in the future never shortens a lease.
#[test]
fn an_expiry_in_the_past_deletes_the_lock_one_in_the_future_does_not_shorten_it() {
    let s = Server::start();
    let mut c = s.conn();
    for past in [
        vec!["PEXPIREAT", "k", "1"],
        vec!["EXPIRE", "k", "0"],
        vec!["PEXPIRE", "k", "-1"],
    ] {
        let t = token(c.acquire("k", "a", 100_000));
        let mut w = s.conn();
        w.send(&["LOCK.ACQUIRE", "k", "w", "100000", "WAIT", "5000"])
            .expect("send");
        wait_until(Duration::from_secs(5), "the waiter queued", || {
            stat(&mut c, "waiters") == 1
        });
        assert_eq!(c.cmd(&past).int(), 1, "{past:?}");
        let granted = token(w.read_reply().expect("the waiter's reply"));
        assert!(granted > t, "{past:?}");
        assert_eq!(c.release("k", "w").int(), 1);
    }
    token(c.acquire("k", "a", 100_000));
    assert_eq!(c.cmd(&["PEXPIRE", "k", "100"]).int(), 1);
    sleep_ms(300);
    assert_eq!(c.lock_info("k").expect("still held").holder("a").holds, 1);
}

/// The AOF is a load too: a `LOCK.SYNC` line with a lease past
/// `lock.max-ttl` is clamped, one with an impossible token dropped, each
/// counted; the rest of the file loads.
#[test]
fn an_aof_with_impossible_lock_state_loads_the_rest() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        .start();
    let mut c = s.conn();
    let t = token(c.acquire("k", "a", 100_000));
    c.cmd(&["SET", "plain", "kept"]).ok();
    s.shutdown_save();
    let aof = std::fs::read_dir(s.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("the incremental AOF");
    let mut text = std::fs::read(&aof).expect("read the AOF");
    let sync = |key: &str, token: i64, deadline: i64| {
        let state = format!("exclusive:1:{token}:{deadline}");
        format!(
            "*4\r\n$9\r\nLOCK.SYNC\r\n${}\r\n{key}\r\n${}\r\n{state}\r\n$1\r\no\r\n",
            key.len(),
            state.len()
        )
    };
    let century = now_ms() + 100 * 365 * DAY_MS;
    text.extend_from_slice(sync("long", t + 1, century).as_bytes());
    text.extend_from_slice(sync("bad", i64::MAX - 1, now_ms() + 100_000).as_bytes());
    std::fs::write(&aof, text).expect("write the AOF");
    s.restart();
    let mut c = s.conn();
    assert_eq!(c.cmd(&["GET", "plain"]).bulk(), b"kept");
    assert_eq!(c.lock_info("k").expect("k").holder("a").token, t);
    let ttl = c.lock_info("long").expect("long, clamped").holder("o").ttl;
    assert!(ttl > 0 && ttl <= 30 * DAY_MS, "ttl {ttl}");
    assert!(c.lock_info("bad").is_none());
    assert_eq!(stat(&mut c, "loaded_state_fixed"), 2);
}

/// Issue 32.2: a `RESTORE` of a lock with more holders than
/// `lock.max-holders` is refused (from its count, before its holders are
/// walked); a load keeps it as it is (dropping readers would let a writer
/// in while they believe they hold it), logged and counted, and grants on
/// it are refused until it is back under the limit.
#[test]
fn holders_past_the_limit_are_refused_by_restore_and_kept_by_a_load() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "10"]).ok();
    for i in 0..10 {
        token(c.read("r", &format!("r{i}"), 100_000));
    }
    let payload = dump(&mut c, "r");
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "5"]).ok();
    let r = c.cmd(&[b"RESTORE".as_slice(), b"r2", b"0", &payload]);
    assert!(r.is_err(), "RESTORE past the limit: {r:?}");
    assert_eq!(c.cmd(&["EXISTS", "r2"]).int(), 0);
    assert!(c.cmd(&["DEBUG", "RELOAD"]).is("OK"));
    assert_eq!(c.lock_info("r").expect("kept").holders.len(), 10);
    assert_eq!(stat(&mut c, "loaded_state_fixed"), 1);
    assert!(c.read("r", "one-more", 100_000).is_err());
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "10"]).ok();
    c.cmd(&[b"RESTORE".as_slice(), b"r2", b"0", &payload]).ok();
}
