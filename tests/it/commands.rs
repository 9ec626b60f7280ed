//! The commands against a live redis-server: every line of the contract's
//! "State of one key", "Commands", "Fencing tokens" (within one server run) and
//! "Bad input" sections. Blocking (`WAIT` on a held key) is tested elsewhere.

use crate::common::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A grant's token: a positive integer.
#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

/// Asserts `value` is in `[want - slack, want]` (a remaining time measured
/// after the fact can only be lower than the ttl it started from).
#[track_caller]
fn assert_ttl_near(value: i64, want: i64, slack: i64, what: &str) {
    assert!(
        value <= want && value >= want - slack,
        "{what}: {value} not within [{}, {want}]",
        want - slack
    );
}

#[track_caller]
fn info(c: &mut Conn, key: &str) -> LockInfo {
    c.lock_info(key)
        .unwrap_or_else(|| panic!("LOCK.INFO {key} is nil, expected a held lock"))
}

#[test]
fn acquire_grants_a_token_and_refuses_others() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(c.acquire("k", "a", 10_000));
    assert!(c.acquire("k", "b", 10_000).is_nil());
    assert!(c.racquire("k", "b", 10_000).is_nil());
    assert!(c.read("k", "b", 10_000).is_nil());
    let i = info(&mut c, "k");
    assert_eq!(i.mode, "exclusive");
    assert_eq!(i.holders.len(), 1);
    let h = i.holder("a");
    assert_eq!((h.holds, h.token), (1, t));
    assert_ttl_near(h.ttl, 10_000, 2_000, "ttl-ms-left");
    assert_eq!(i.waiters, 0);
    assert_eq!(c.type_of("k"), TYPE_NAME);
    c.ping();
}

#[test]
fn acquire_again_by_the_holder_is_an_idempotent_retry() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(c.acquire("k", "a", 1_000));
    sleep_ms(30);
    let before = c.pttl("k");
    assert!(before <= 1_000 && before > 0, "PTTL {before}");
    // Same token, deadline reset (longer: PTTL grows), holds unchanged.
    assert_eq!(token(c.acquire("k", "a", 20_000)), t);
    let p = c.pttl("k");
    assert_ttl_near(p, 20_000, 2_000, "PTTL after a longer retry");
    let h = info(&mut c, "k").holder("a").clone();
    assert_eq!((h.holds, h.token), (1, t));
    assert_ttl_near(h.ttl, 20_000, 2_000, "ttl-ms-left after a longer retry");
    // The deadline is reset, also to a shorter one.
    assert_eq!(token(c.acquire("k", "a", 5_000)), t);
    assert_ttl_near(c.pttl("k"), 5_000, 2_000, "PTTL after a shorter retry");
    let h = info(&mut c, "k").holder("a").clone();
    assert_eq!((h.holds, h.token), (1, t));
    assert_ttl_near(h.ttl, 5_000, 2_000, "ttl-ms-left after a shorter retry");
    // One RELEASE frees it: the retries added no hold.
    assert_eq!(c.release("k", "a").int(), 1);
    assert!(c.lock_info("k").is_none());
}

#[test]
fn release_replies() {
    let s = Server::start();
    let mut c = s.conn();
    // Never held: a free key.
    assert!(c.release("free", "a").is_nil());
    assert_eq!(c.cmd(&["EXISTS", "free"]).int(), 0);
    // Someone else's.
    let t = token(c.acquire("k", "a", 10_000));
    assert!(c.release("k", "b").is_nil());
    assert_eq!(info(&mut c, "k").holder("a").token, t);
    // The holder's.
    assert_eq!(c.release("k", "a").int(), 1);
    assert!(c.lock_info("k").is_none());
    assert_eq!(c.cmd(&["EXISTS", "k"]).int(), 0, "a free lock is no key");
    assert!(c.release("k", "a").is_nil(), "released twice");
    // Expired.
    token(c.acquire("e", "a", 50));
    sleep_ms(150);
    assert!(
        c.release("e", "a").is_nil(),
        "an expired holder holds nothing"
    );
    c.ping();
}

#[test]
fn renew_replies_and_resets_only_the_deadline() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(c.racquire("k", "a", 1_000));
    token(c.racquire("k", "a", 1_000));
    assert_eq!(c.renew("k", "a", 30_000).int(), 1);
    let h = info(&mut c, "k").holder("a").clone();
    assert_eq!((h.holds, h.token), (2, t), "RENEW keeps holds and token");
    assert_ttl_near(h.ttl, 30_000, 2_000, "ttl-ms-left after RENEW");
    assert_ttl_near(c.pttl("k"), 30_000, 2_000, "PTTL after RENEW");
    // Shorter too: the deadline is now + ttl.
    assert_eq!(c.renew("k", "a", 4_000).int(), 1);
    assert_ttl_near(
        info(&mut c, "k").holder("a").ttl,
        4_000,
        2_000,
        "shorter RENEW",
    );
    assert_ttl_near(c.pttl("k"), 4_000, 2_000, "PTTL after a shorter RENEW");
    // Not the holder.
    assert_eq!(c.renew("k", "b", 30_000).int(), 0);
    assert_eq!(info(&mut c, "k").holders.len(), 1);
    // A free key: 0, and no key is created.
    assert_eq!(c.renew("free", "a", 30_000).int(), 0);
    assert_eq!(c.cmd(&["EXISTS", "free"]).int(), 0);
    // Expired.
    token(c.acquire("e", "a", 50));
    sleep_ms(150);
    assert_eq!(
        c.renew("e", "a", 30_000).int(),
        0,
        "RENEW of an expired holder"
    );
    assert!(c.lock_info("e").is_none());
}

#[test]
fn expiry_is_honoured_at_once_even_before_redis_deletes_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).ok();
    // PERSIST keeps the key in Redis past the deadline: only the module's own
    // deadline can free it.
    let t1 = token(c.acquire("k", "a", 300));
    assert_eq!(c.cmd(&["PERSIST", "k"]).int(), 1);
    let t2 = token(c.acquire("k2", "a", 300));
    sleep_ms(450);
    let exists = c.cmd(&["EXISTS", "k"]).int();
    eprintln!("EXISTS k after the deadline (PERSISTed, active expire off): {exists}");
    assert!(c.lock_info("k").is_none(), "LOCK.INFO after the deadline");
    let t3 = token(c.acquire("k", "b", 10_000));
    assert!(t3 > t1 && t3 > t2);
    assert_eq!(info(&mut c, "k").holder("b").token, t3);
    assert!(c.release("k", "a").is_nil());
    // Without PERSIST and without active expiry.
    assert!(c.lock_info("k2").is_none());
    assert_eq!(c.renew("k2", "a", 10_000).int(), 0);
    let t4 = token(c.acquire("k2", "b", 10_000));
    assert!(t4 > t3);
    // RACQUIRE and READ holders expire the same way.
    token(c.racquire("r", "a", 300));
    token(c.racquire("r", "a", 300));
    token(c.read("s", "a", 300));
    assert_eq!(c.cmd(&["PERSIST", "r"]).int(), 1);
    assert_eq!(c.cmd(&["PERSIST", "s"]).int(), 1);
    sleep_ms(450);
    assert!(c.lock_info("r").is_none());
    assert!(c.lock_info("s").is_none());
    token(c.acquire("r", "b", 10_000));
    token(c.acquire("s", "b", 10_000));
    c.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "1"]).ok();
}

#[test]
fn the_keys_pttl_is_the_latest_deadline() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 10_000));
    assert_ttl_near(c.pttl("k"), 10_000, 1_000, "after ACQUIRE");
    token(c.read("s", "r1", 5_000));
    assert_ttl_near(c.pttl("s"), 5_000, 1_000, "one reader");
    token(c.read("s", "r2", 20_000));
    assert_ttl_near(c.pttl("s"), 20_000, 1_000, "a later reader");
    token(c.read("s", "r3", 1_000));
    assert_ttl_near(
        c.pttl("s"),
        20_000,
        1_000,
        "an earlier reader changes nothing",
    );
    assert_eq!(c.release("s", "r2").int(), 1);
    assert_ttl_near(c.pttl("s"), 5_000, 1_000, "the latest reader left");
    assert_eq!(c.renew("s", "r3", 40_000).int(), 1);
    assert_ttl_near(c.pttl("s"), 40_000, 1_000, "RENEW of a reader");
    // PTTL matches LOCK.INFO's largest ttl-ms-left.
    let i = info(&mut c, "s");
    let max = i.holders.iter().map(|h| h.ttl).max().unwrap_or(0);
    let p = c.pttl("s");
    assert!(
        (p - max).abs() <= 100,
        "PTTL {p} vs LOCK.INFO's latest {max}"
    );
}

#[test]
fn persist_and_pexpire_never_extend_a_lease() {
    let s = Server::start();
    let mut c = s.conn();
    let start = std::time::Instant::now();
    token(c.acquire("k", "a", 400));
    assert_eq!(c.cmd(&["PERSIST", "k"]).int(), 1);
    token(c.acquire("p", "a", 400));
    assert_eq!(c.cmd(&["PEXPIRE", "p", "100000"]).int(), 1);
    token(c.read("s", "r", 400));
    assert_eq!(c.cmd(&["PEXPIRE", "s", "100000"]).int(), 1);
    token(c.racquire("x", "a", 400));
    assert_eq!(c.cmd(&["EXPIRE", "x", "1000"]).int(), 1);
    // Still held before the deadline (unless the machine stalled).
    let refused = c.acquire("k", "b", 10_000).is_nil();
    assert!(refused || start.elapsed().as_millis() >= 400);
    sleep_ms(600);
    for key in ["k", "p", "s", "x"] {
        assert!(
            c.lock_info(key).is_none(),
            "{key}: LOCK.INFO after the deadline"
        );
        assert!(
            c.release(key, "a").is_nil(),
            "{key}: the old holder holds nothing"
        );
        token(c.acquire(key, "b", 10_000));
        assert_eq!(info(&mut c, key).holder("b").holds, 1);
    }
}

#[test]
fn del_unlink_and_flushdb_free_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = token(c.acquire("k", "a", 10_000));
    assert_eq!(c.cmd(&["DEL", "k"]).int(), 1);
    assert!(c.lock_info("k").is_none());
    assert!(c.release("k", "a").is_nil());
    let t2 = token(c.acquire("k", "b", 10_000));
    assert!(t2 > t1);
    assert_eq!(c.cmd(&["UNLINK", "k"]).int(), 1);
    assert!(c.lock_info("k").is_none());
    let t3 = token(c.read("k", "r", 10_000));
    assert!(t3 > t2);
    c.cmd(&["FLUSHDB"]).ok();
    assert!(c.lock_info("k").is_none());
    assert!(t3 < token(c.acquire("k", "a", 10_000)));
}

#[test]
fn tokens_strictly_increase() {
    let s = Server::start();
    let mut c = s.conn();
    let mut tokens = Vec::new();
    tokens.push(token(c.acquire("k", "a", 10_000)));
    assert_eq!(c.release("k", "a").int(), 1);
    // Re-acquire of a released key, by the same owner and by another.
    tokens.push(token(c.acquire("k", "a", 10_000)));
    assert_eq!(c.release("k", "a").int(), 1);
    tokens.push(token(c.racquire("k", "b", 10_000)));
    // Other keys, other modes.
    tokens.push(token(c.acquire("k2", "a", 10_000)));
    tokens.push(token(c.read("k3", "r1", 10_000)));
    tokens.push(token(c.read("k3", "r2", 10_000)));
    // Expiry.
    tokens.push(token(c.acquire("e", "a", 50)));
    sleep_ms(150);
    tokens.push(token(c.acquire("e", "b", 10_000)));
    // FLUSHALL.
    c.cmd(&["FLUSHALL"]).ok();
    tokens.push(token(c.acquire("k", "a", 10_000)));
    tokens.push(token(c.acquire("k2", "z", 10_000)));
    // Another database.
    c.cmd(&["SELECT", "3"]).ok();
    tokens.push(token(c.acquire("k", "a", 10_000)));
    // Another connection.
    let mut c2 = s.conn();
    tokens.push(token(c2.read("q", "r", 10_000)));
    for w in tokens.windows(2) {
        assert!(w[0] < w[1], "tokens not strictly increasing: {tokens:?}");
    }
}

#[test]
fn type_of_a_lock_key_is_the_module_type() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 10_000));
    token(c.read("s", "a", 10_000));
    assert_eq!(c.type_of("k"), TYPE_NAME);
    assert_eq!(c.type_of("s"), TYPE_NAME);
    assert_eq!(c.release("k", "a").int(), 1);
    assert_eq!(c.type_of("k"), "none", "a free lock is no key");
}

#[test]
fn the_same_name_in_two_databases_is_two_locks() {
    let s = Server::start();
    let mut c = s.conn();
    let t0 = token(c.acquire("k", "a", 10_000));
    c.cmd(&["SELECT", "1"]).ok();
    assert!(c.lock_info("k").is_none(), "db 1 is free");
    let t1 = token(c.acquire("k", "b", 10_000));
    assert_ne!(t0, t1);
    assert!(
        c.release("k", "a").is_nil(),
        "a holds db 0's lock, not db 1's"
    );
    assert_eq!(info(&mut c, "k").holder("b").token, t1);
    c.cmd(&["SELECT", "0"]).ok();
    let i = info(&mut c, "k");
    assert_eq!(i.holders.len(), 1);
    assert_eq!(i.holder("a").token, t0);
    assert_eq!(c.release("k", "a").int(), 1);
    c.cmd(&["SELECT", "1"]).ok();
    assert_eq!(info(&mut c, "k").holder("b").token, t1);
}

#[test]
fn racquire_counts_holds_and_acquire_adds_none() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(c.racquire("k", "a", 10_000));
    assert_eq!(token(c.racquire("k", "a", 10_000)), t);
    assert_eq!(token(c.racquire("k", "a", 10_000)), t);
    let h = info(&mut c, "k").holder("a").clone();
    assert_eq!((h.holds, h.token), (3, t));
    assert!(
        c.racquire("k", "b", 10_000).is_nil(),
        "exclusive against others"
    );
    // ACQUIRE by the same owner: same token, no hold added.
    assert_eq!(token(c.acquire("k", "a", 10_000)), t);
    assert_eq!(info(&mut c, "k").holder("a").holds, 3);
    assert_eq!(c.release("k", "a").int(), 0);
    assert_eq!(info(&mut c, "k").holder("a").holds, 2);
    assert_eq!(c.release("k", "a").int(), 0);
    assert_eq!(c.release("k", "a").int(), 1);
    assert!(c.release("k", "a").is_nil());
    assert!(c.lock_info("k").is_none());
    // RACQUIRE after ACQUIRE adds a hold.
    let t2 = token(c.acquire("k2", "a", 10_000));
    assert_eq!(token(c.racquire("k2", "a", 10_000)), t2);
    assert_eq!(info(&mut c, "k2").holder("a").holds, 2);
    // Re-entry resets the deadline.
    assert_eq!(token(c.racquire("k2", "a", 40_000)), t2);
    assert_ttl_near(
        info(&mut c, "k2").holder("a").ttl,
        40_000,
        2_000,
        "RACQUIRE re-entry",
    );
}

#[test]
fn readers_share_with_their_own_tokens() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = token(c.read("s", "r1", 10_000));
    let t2 = token(c.read("s", "r2", 20_000));
    let t3 = token(c.read("s", "r3", 30_000));
    assert!(t1 < t2 && t2 < t3, "each reader has its own token");
    let i = info(&mut c, "s");
    assert_eq!(i.mode, "shared");
    assert_eq!(i.holders.len(), 3);
    assert_eq!(i.holder("r1").token, t1);
    assert_eq!(i.holder("r2").token, t2);
    assert_eq!(i.holder("r3").token, t3);
    assert_ttl_near(i.holder("r1").ttl, 10_000, 2_000, "r1");
    assert_ttl_near(i.holder("r2").ttl, 20_000, 2_000, "r2");
    assert_ttl_near(i.holder("r3").ttl, 30_000, 2_000, "r3");
    // Reentrant per reader.
    assert_eq!(token(c.read("s", "r1", 10_000)), t1);
    assert_eq!(info(&mut c, "s").holder("r1").holds, 2);
    assert_eq!(info(&mut c, "s").holder("r2").holds, 1);
    // Writers are refused while readers hold.
    assert!(c.acquire("s", "w", 10_000).is_nil());
    assert!(c.racquire("s", "w", 10_000).is_nil());
    assert_eq!(c.release("s", "r1").int(), 0);
    assert_eq!(c.release("s", "r1").int(), 1);
    assert_eq!(c.release("s", "r2").int(), 1);
    assert!(c.acquire("s", "w", 10_000).is_nil(), "r3 still reads");
    assert_eq!(info(&mut c, "s").holders.len(), 1);
    assert_eq!(c.release("s", "r3").int(), 1);
    assert!(c.lock_info("s").is_none());
    // And the reverse: readers are refused while a writer holds.
    let tw = token(c.acquire("s", "w", 10_000));
    assert!(tw > t3);
    assert!(c.read("s", "r1", 10_000).is_nil());
    assert!(c.read("s", "r9", 10_000).is_nil());
    let i = info(&mut c, "s");
    assert_eq!(i.mode, "exclusive");
    assert_eq!(i.holders.len(), 1);
    token(c.racquire("x", "w", 10_000));
    assert!(c.read("x", "r", 10_000).is_nil());
}

#[test]
fn one_reader_expires_while_another_stays() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.read("s", "r1", 100));
    let t2 = token(c.read("s", "r2", 10_000));
    sleep_ms(250);
    let i = info(&mut c, "s");
    assert_eq!(i.mode, "shared");
    assert_eq!(i.holders.len(), 1, "only r2 is listed: {i:?}");
    assert_eq!(i.holder("r2").token, t2);
    assert!(c.release("s", "r1").is_nil());
    assert_eq!(c.renew("s", "r1", 10_000).int(), 0);
    assert!(c.acquire("s", "w", 10_000).is_nil(), "r2 still reads");
    // A new reader joins.
    token(c.read("s", "r3", 10_000));
    assert_eq!(info(&mut c, "s").holders.len(), 2);
}

#[test]
fn mode_changes_are_errors_and_change_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let held_shared = LockError::HeldShared.message();
    let held_exclusive = LockError::HeldExclusive.message();
    // read -> write.
    token(c.read("s", "r", 100_000));
    token(c.read("s", "r2", 100_000));
    sleep_ms(20);
    let before = info(&mut c, "s");
    assert_eq!(c.acquire("s", "r", 200_000).err(), held_shared);
    assert_eq!(c.racquire("s", "r", 200_000).err(), held_shared);
    assert_eq!(
        c.cmd(&["LOCK.ACQUIRE", "s", "r", "200000", "WAIT", "0"])
            .err(),
        held_shared,
        "it can never wait on itself"
    );
    let after = info(&mut c, "s");
    assert_eq!(after.stable(), before.stable());
    for (b, a) in before.holders.iter().zip(&after.holders) {
        assert!(
            a.ttl <= b.ttl,
            "deadline not reset: {before:?} -> {after:?}"
        );
    }
    // write -> read, for ACQUIRE and RACQUIRE holders.
    token(c.acquire("x", "w", 100_000));
    token(c.racquire("y", "w", 100_000));
    token(c.racquire("y", "w", 100_000));
    sleep_ms(20);
    let bx = info(&mut c, "x");
    let by = info(&mut c, "y");
    assert_eq!(c.read("x", "w", 200_000).err(), held_exclusive);
    assert_eq!(c.read("y", "w", 200_000).err(), held_exclusive);
    assert_eq!(
        c.cmd(&["LOCK.READ", "y", "w", "200000", "WAIT", "0"]).err(),
        held_exclusive
    );
    let ax = info(&mut c, "x");
    let ay = info(&mut c, "y");
    assert_eq!(ax.stable(), bx.stable());
    assert_eq!(ay.stable(), by.stable());
    assert!(ax.holder("w").ttl <= bx.holder("w").ttl);
    assert!(ay.holder("w").ttl <= by.holder("w").ttl);
    assert_eq!(ay.holder("w").holds, 2);
    c.ping();
}

#[test]
fn renewing_one_reader_does_not_extend_another() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.read("s", "r1", 400));
    let t2 = token(c.read("s", "r2", 400));
    assert_eq!(c.renew("s", "r2", 10_000).int(), 1);
    let i = info(&mut c, "s");
    // r1 is listed with its own short lease (or already gone on a stalled machine).
    assert!(
        i.holders.iter().all(|h| h.owner != b"r1" || h.ttl <= 400),
        "r1 extended: {i:?}"
    );
    assert_ttl_near(i.holder("r2").ttl, 10_000, 2_000, "r2 renewed");
    sleep_ms(600);
    let i = info(&mut c, "s");
    assert_eq!(i.holders.len(), 1, "r1 expired: {i:?}");
    assert_eq!(i.holder("r2").token, t2);
}

#[test]
fn lock_info_shape_in_resp2_and_resp3() {
    let s = Server::start();
    let mut c = s.conn();
    // Free: nil in both protocols.
    assert!(c.cmd(&["LOCK.INFO", "k"]).is_nil());
    let t = token(c.acquire("k", "owner-a", 10_000));
    let r = c.cmd(&["LOCK.INFO", "k"]);
    let Reply::Array(a) = &r else {
        panic!("RESP2 LOCK.INFO is a flat array: {r:?}")
    };
    assert_eq!(a.len(), 6, "{r:?}");
    assert_eq!(a[0].str(), "mode");
    assert_eq!(a[1].str(), "exclusive");
    assert_eq!(a[2].str(), "holders");
    let holders = a[3].array();
    assert_eq!(holders.len(), 1);
    let h = holders[0].array();
    assert_eq!(h.len(), 4, "[owner, holds, ttl-ms-left, token]: {r:?}");
    assert_eq!(h[0], Reply::Bulk(b"owner-a".to_vec()));
    assert_eq!(h[1], Reply::Int(1));
    assert!(
        matches!(h[2], Reply::Int(ms) if ms > 8_000 && ms <= 10_000),
        "{r:?}"
    );
    assert_eq!(h[3], Reply::Int(t));
    assert_eq!(a[4].str(), "waiters");
    assert_eq!(a[5], Reply::Int(0));

    let ts1 = token(c.read("s", "r1", 10_000));
    let ts2 = token(c.read("s", "r2", 10_000));
    token(c.read("s", "r2", 10_000));
    let i = info(&mut c, "s");
    assert_eq!(i.mode, "shared");
    assert_eq!(
        i.stable().1,
        vec![(b"r1".to_vec(), 1, ts1), (b"r2".to_vec(), 2, ts2)]
    );

    // RESP3: a map with the same content.
    let mut c3 = s.conn();
    c3.hello3();
    let r3 = c3.cmd(&["LOCK.INFO", "k"]);
    let Reply::Map(m) = &r3 else {
        panic!("RESP3 LOCK.INFO is a map: {r3:?}")
    };
    assert_eq!(m.len(), 3, "{r3:?}");
    assert_eq!(m[0].0.str(), "mode");
    assert_eq!(m[0].1.str(), "exclusive");
    assert_eq!(m[1].0.str(), "holders");
    let h3 = m[1].1.array()[0].array();
    assert_eq!(h3[0], Reply::Bulk(b"owner-a".to_vec()));
    assert_eq!(h3[1], Reply::Int(1));
    assert!(
        matches!(h3[2], Reply::Int(ms) if ms > 8_000 && ms <= 10_000),
        "{r3:?}"
    );
    assert_eq!(h3[3], Reply::Int(t));
    assert_eq!(m[2].0.str(), "waiters");
    assert_eq!(m[2].1, Reply::Int(0));
    let i3 = LockInfo::parse(&c3.cmd(&["LOCK.INFO", "s"])).expect("shared lock in RESP3");
    assert_eq!(i3.stable(), i.stable());
    assert!(c3.cmd(&["LOCK.INFO", "free"]).is_nil());
    // The commands' own replies in RESP3.
    assert!(c3.acquire("k", "other", 10_000).is_nil());
    assert_eq!(c3.release("s", "r2"), Reply::Int(0));
    assert_eq!(c3.renew("s", "r2", 10_000), Reply::Int(1));
    assert!(c3.release("s", "nobody").is_nil());

    // Nil when every holder has expired, even while the key still exists.
    token(c.read("e", "r1", 300));
    token(c.read("e", "r2", 300));
    assert_eq!(c.cmd(&["PERSIST", "e"]).int(), 1);
    sleep_ms(450);
    assert!(c.cmd(&["LOCK.INFO", "e"]).is_nil());
    assert!(c3.cmd(&["LOCK.INFO", "e"]).is_nil());
}

#[test]
fn owners_and_keys_are_binary_safe() {
    let s = Server::start();
    let mut c = s.conn();
    let owner: &[u8] = b"a\0b\xff\r\n c";
    let prefix: &[u8] = b"a\0b";
    let key: &[u8] = b"k\0\xfe";
    let t = token(c.cmd(&[b"LOCK.ACQUIRE".as_slice(), key, owner, b"10000"]));
    let i = c.lock_info(key).expect("held");
    assert_eq!(i.holders.len(), 1);
    assert_eq!(i.holders[0].owner, owner);
    assert_eq!(i.holders[0].token, t);
    assert!(c
        .cmd(&[b"LOCK.ACQUIRE".as_slice(), key, prefix, b"10000"])
        .is_nil());
    assert!(c.cmd(&[b"LOCK.RELEASE".as_slice(), key, prefix]).is_nil());
    assert_eq!(
        c.cmd(&[b"LOCK.RENEW".as_slice(), key, prefix, b"10000"])
            .int(),
        0
    );
    assert_eq!(
        c.cmd(&[b"LOCK.ACQUIRE".as_slice(), key, owner, b"10000"])
            .int(),
        t
    );
    assert_eq!(
        c.cmd(&[b"LOCK.RENEW".as_slice(), key, owner, b"20000"])
            .int(),
        1
    );
    assert_eq!(c.cmd(&[b"LOCK.RELEASE".as_slice(), key, owner]).int(), 1);
    // Readers whose names differ only in a high byte are two readers.
    let r1: &[u8] = b"\xff\x00";
    let r2: &[u8] = b"\xff\x01";
    token(c.cmd(&[b"LOCK.READ".as_slice(), key, r1, b"10000"]));
    token(c.cmd(&[b"LOCK.READ".as_slice(), key, r2, b"10000"]));
    let i = c.lock_info(key).expect("held");
    let owners: Vec<Vec<u8>> = i.holders.iter().map(|h| h.owner.clone()).collect();
    assert_eq!(owners, vec![r1.to_vec(), r2.to_vec()]);
    // A one-byte owner works.
    token(c.cmd(&[b"LOCK.RACQUIRE".as_slice(), b"one", b"\0", b"10000"]));
    assert_eq!(c.lock_info("one").expect("held").holders[0].owner, b"\0");
}

#[test]
fn wrongtype_for_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    let wrongtype = Reply::Error(LockError::WrongType.message());
    c.cmd(&["SET", "str", "v"]).ok();
    c.cmd(&["HSET", "hash", "f", "v"]).int();
    c.cmd(&["RPUSH", "list", "x"]).int();
    for key in ["str", "hash", "list"] {
        let ty = c.type_of(key);
        for args in [
            vec!["LOCK.ACQUIRE", key, "o", "1000"],
            vec!["LOCK.RACQUIRE", key, "o", "1000"],
            vec!["LOCK.READ", key, "o", "1000"],
            vec!["LOCK.ACQUIRE", key, "o", "1000", "WAIT", "0"],
            vec!["LOCK.RELEASE", key, "o"],
            vec!["LOCK.RENEW", key, "o", "1000"],
            vec!["LOCK.INFO", key],
        ] {
            assert_eq!(c.cmd(&args), wrongtype, "{args:?}");
            assert_eq!(c.type_of(key), ty, "{args:?} changed the key");
            assert_eq!(c.pttl(key), -1, "{args:?} set a TTL");
        }
    }
    assert_eq!(c.cmd(&["GET", "str"]), Reply::Bulk(b"v".to_vec()));
    c.ping();
}

/// Runs every bad request of [`bad_inputs`] and checks that it changed nothing.
fn run_bad_inputs(c: &mut Conn, key: &str, holder: &str) {
    let before = c.lock_info(key);
    let before_type = c.type_of(key);
    for (args, expect) in bad_inputs(key, holder, "str") {
        let r = c.cmdv(&args);
        expect.check(&args, &r);
        let after = c.lock_info(key);
        match (&before, &after) {
            (Some(b), Some(a)) => {
                assert_eq!(
                    a.stable(),
                    b.stable(),
                    "{:?} changed the lock",
                    show_args(&args)
                );
                for (x, y) in b.holders.iter().zip(&a.holders) {
                    assert!(
                        y.ttl <= x.ttl,
                        "{:?} reset a deadline: {b:?} -> {a:?}",
                        show_args(&args)
                    );
                }
            }
            (None, None) => {
                assert_eq!(c.cmd(&["EXISTS", key]).int(), 0, "{:?}", show_args(&args));
            }
            _ => panic!(
                "{:?} changed the lock: {before:?} -> {after:?}",
                show_args(&args)
            ),
        }
        assert_eq!(c.type_of(key), before_type, "{:?}", show_args(&args));
        assert_eq!(c.cmd(&["GET", "str"]), Reply::Bulk(b"v".to_vec()));
    }
}

fn show_args(args: &[Vec<u8>]) -> Vec<String> {
    args.iter().map(|a| show(a)).collect()
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["SET", "str", "v"]).ok();
    // Held exclusively (2 holds) by the same owner the bad requests name.
    token(c.racquire("k", "o", 100_000));
    token(c.racquire("k", "o", 100_000));
    // Held shared by that owner and another reader.
    token(c.read("sh", "o", 100_000));
    token(c.read("sh", "r2", 100_000));
    sleep_ms(20);
    run_bad_inputs(&mut c, "k", "o");
    run_bad_inputs(&mut c, "sh", "o");
    // A free key stays free (no key is created).
    run_bad_inputs(&mut c, "free", "o");
    // The same in RESP3.
    let mut c3 = s.conn();
    c3.hello3();
    run_bad_inputs(&mut c3, "k", "o");
    c.ping();
    c3.ping();
    assert_eq!(info(&mut c, "k").holder("o").holds, 2);
}

#[test]
fn edge_values_that_are_valid() {
    let s = Server::start();
    let mut c = s.conn();
    let max = MAX_TTL.to_string();
    // The maximum ttl is accepted by every command taking one.
    token(c.cmd(&["LOCK.ACQUIRE", "a", "o", &max]));
    token(c.cmd(&["LOCK.RACQUIRE", "b", "o", &max]));
    token(c.cmd(&["LOCK.READ", "c", "o", &max]));
    assert_eq!(c.cmd(&["LOCK.RENEW", "a", "o", &max]).int(), 1);
    let ttl = info(&mut c, "a").holder("o").ttl;
    assert!(ttl > MAX_TTL - 60_000 && ttl <= MAX_TTL, "{ttl}");
    // ttl 1 is valid (and expires almost at once).
    let r = c.cmd(&["LOCK.ACQUIRE", "one", "o", "1"]);
    token(r);
    // WAIT on a free key is granted at once, whatever its value and case.
    let max_wait = MAX_WAIT_MS.to_string();
    for (i, (opt, ms)) in [
        ("WAIT", "0"),
        ("WAIT", "100"),
        ("wait", "0"),
        ("WaIt", "100"),
        ("WAIT", "1"),
        ("WAIT", max_wait.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("w{i}");
        token(c.cmd(&["LOCK.ACQUIRE", &key, "o", "10000", opt, ms]));
        token(c.cmd(&["LOCK.RACQUIRE", &format!("{key}r"), "o", "10000", opt, ms]));
        token(c.cmd(&["LOCK.READ", &format!("{key}s"), "o", "10000", opt, ms]));
    }
    // A holder's repeat with WAIT is answered at once.
    let t = token(c.acquire("h", "o", 10_000));
    assert_eq!(
        c.cmd(&["LOCK.ACQUIRE", "h", "o", "10000", "WAIT", "0"])
            .int(),
        t
    );
    assert_eq!(
        c.cmd(&["LOCK.RACQUIRE", "h", "o", "10000", "WAIT", "0"])
            .int(),
        t
    );
    assert_eq!(info(&mut c, "h").holder("o").holds, 2);
    let tr = token(c.read("hs", "o", 10_000));
    assert_eq!(
        c.cmd(&["LOCK.READ", "hs", "o", "10000", "WAIT", "0"]).int(),
        tr
    );
    // Large, still 64-bit owner names and keys.
    let big = vec![b'x'; 64 * 1024];
    token(c.cmd(&[b"LOCK.ACQUIRE".as_slice(), &big, &big, b"10000"]));
    assert_eq!(c.lock_info(&big).expect("held").holders[0].owner, big);
    c.ping();
}

#[test]
fn ttl_parsing_follows_redis_integers() {
    // Random ttl strings: valid exactly when Redis would parse them as an
    // integer from 1 to the maximum.
    let s = Server::start();
    let c = std::cell::RefCell::new(s.conn());
    let n = std::cell::Cell::new(0u64);
    let expected_err = Reply::Error(bad_ttl());
    let mut runner = TestRunner::new(Config {
        cases: 200,
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = "(-|\\+| |0)?[0-9]{0,21}( |x)?";
    runner
        .run(&strategy, |ttl| {
            n.set(n.get() + 1);
            let key = format!("p{}", n.get());
            let valid = redis_parses(&ttl)
                .map(|v| (1..=MAX_TTL).contains(&v))
                .unwrap_or(false);
            let r = c
                .borrow_mut()
                .cmd(&["LOCK.ACQUIRE", key.as_str(), "o", ttl.as_str()]);
            if valid {
                if !matches!(r, Reply::Int(t) if t > 0) {
                    return Err(TestCaseError::fail(format!("ttl {ttl:?}: {r:?}")));
                }
            } else if r != expected_err {
                return Err(TestCaseError::fail(format!("ttl {ttl:?}: {r:?}")));
            }
            Ok(())
        })
        .unwrap();
    c.borrow_mut().ping();
}

/// `RedisModule_StringToLongLong`'s rule: optional `-`, no leading zeros, no
/// `+`, no spaces, no `-0`, fits in i64.
fn redis_parses(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    if s == "-0" {
        return None;
    }
    s.parse().ok()
}

#[test]
fn a_lock_outlives_its_holders_connection() {
    let s = Server::start();
    let t = {
        let mut c1 = s.conn();
        token(c1.acquire("k", "a", 10_000))
    };
    sleep_ms(50);
    let mut c2 = s.conn();
    assert!(c2.acquire("k", "b", 10_000).is_nil());
    assert_eq!(info(&mut c2, "k").holder("a").token, t);
    assert_eq!(
        c2.release("k", "a").int(),
        1,
        "any connection can release by owner"
    );
}

#[test]
fn rename_and_move_carry_the_lock() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(c.racquire("k", "a", 30_000));
    token(c.racquire("k", "a", 30_000));
    let before = info(&mut c, "k");
    c.cmd(&["RENAME", "k", "k2"]).ok();
    assert!(c.lock_info("k").is_none());
    let after = info(&mut c, "k2");
    assert_eq!(after.stable(), before.stable());
    assert!(c.acquire("k2", "b", 10_000).is_nil());
    assert_ttl_near(c.pttl("k2"), 30_000, 2_000, "PTTL after RENAME");
    // The old name is free.
    assert!(token(c.acquire("k", "b", 10_000)) > t);
    assert_eq!(c.cmd(&["MOVE", "k2", "5"]).int(), 1);
    assert!(c.lock_info("k2").is_none());
    c.cmd(&["SELECT", "5"]).ok();
    let moved = info(&mut c, "k2");
    assert_eq!(moved.stable(), before.stable());
    assert_eq!(c.release("k2", "a").int(), 0);
    assert_eq!(c.release("k2", "a").int(), 1);
    assert!(c.lock_info("k2").is_none());
}

#[test]
fn lock_info_waiters_is_zero_without_waiters() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("k", "a", 10_000));
    assert!(c.acquire("k", "b", 10_000).is_nil());
    assert_eq!(
        info(&mut c, "k").waiters,
        0,
        "a refusal without WAIT does not queue"
    );
}

/// `MIGRATE` to another server outside a cluster (docs/commands.md, "Keys
/// and other commands"): the lock moves with its holder and token, and is
/// gone here as after `DEL`, so a client waiting here is granted it here.
#[test]
fn standalone_migrate_moves_the_holder_and_frees_the_key_here() {
    let source = Server::start();
    let target = Server::start();
    let mut c = source.conn();
    let t = token(c.acquire("m", "holder", 60000));
    let mut w = source.conn();
    w.send(&["LOCK.ACQUIRE", "m", "waiter", "60000", "WAIT", "10000"])
        .unwrap();
    w.set_timeout(std::time::Duration::from_secs(8));
    wait_until(std::time::Duration::from_secs(5), "the waiter", || {
        c.lock_info("m").is_some_and(|i| i.waiters == 1)
    });
    let port = target.port.to_string();
    let r = c.cmd(&["MIGRATE", "127.0.0.1", &port, "m", "0", "5000"]);
    assert!(r.is("OK"), "MIGRATE: {r:?}");
    let granted = token(w.read_reply().expect("the waiter's answer"));
    assert!(granted > t, "a new grant here, above the moved one's token");
    assert_eq!(info(&mut c, "m").holder("waiter").token, granted);
    let mut there = target.conn();
    assert_eq!(info(&mut there, "m").holder("holder").token, t);
}
