//! `LOCK.RELEASE key owner [TOKEN token]` and `LOCK.RENEW key owner ttl
//! [TOKEN token]` (contract v4, "Commands"): with `TOKEN` they act only on
//! the owner's grant carrying that token. A holder that lost its grant
//! behind its back (DEL, an expiry) and whose owner name was granted again
//! gets nil / `0`, and the later grant keeps the lock: on an exclusive lock,
//! a reentrant one, a reader, a semaphore permit and a `LOCK.MACQUIRE` key;
//! waiters stay queued, bound holders keep their `LOCK.KEEPALIVE`, a stale
//! token replicates nothing, and replicas and the AOF follow a release by
//! token. Bad tokens are in the shared bad-input table (`bad_inputs`).

use crate::common::*;

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

fn release(c: &mut Conn, key: &str, owner: &str, t: i64) -> Reply {
    c.cmd(&["LOCK.RELEASE", key, owner, "TOKEN", &t.to_string()])
}

fn renew(c: &mut Conn, key: &str, owner: &str, ttl: i64, t: i64) -> Reply {
    c.cmd(&[
        "LOCK.RENEW",
        key,
        owner,
        &ttl.to_string(),
        "TOKEN",
        &t.to_string(),
    ])
}

/// Asserts that `old` (a token `owner` no longer holds under) releases and
/// renews nothing on `key`: nil, `0`, and LOCK.INFO (ttls aside) and PTTL
/// as they were.
#[track_caller]
fn stale_changes_nothing(c: &mut Conn, key: &str, owner: &str, old: i64) {
    let before = c.lock_info(key).expect("held");
    let pttl = c.pttl(key);
    assert!(release(c, key, owner, old).is_nil(), "a stale RELEASE");
    assert_eq!(renew(c, key, owner, 900_000, old).int(), 0, "a stale RENEW");
    // Lower case, and the largest token there is: the same.
    let r = c.cmd(&["LOCK.RELEASE", key, owner, "token", &old.to_string()]);
    assert!(r.is_nil(), "{r:?}");
    let r = c.cmd(&["LOCK.RELEASE", key, owner, "TOKEN", "9223372036854775807"]);
    assert!(r.is_nil(), "{r:?}");
    let after = c.lock_info(key).expect("still held");
    assert_eq!(
        after.stable(),
        before.stable(),
        "a stale token changed {key}"
    );
    for (a, b) in after.holders.iter().zip(&before.holders) {
        assert!(a.ttl <= b.ttl, "a stale RENEW moved a deadline: {after:?}");
    }
    let now = c.pttl(key);
    // (A key of a bound holder has no Redis TTL, -1: its holder follows its
    // connection's lease; it keeps none.)
    let kept = match pttl {
        -1 => now == -1,
        _ => now <= pttl && now > 0,
    };
    assert!(kept, "PTTL {pttl} -> {now}");
}

#[test]
fn a_stale_token_after_del_and_a_new_grant_to_the_same_owner_frees_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.acquire("job", "worker-1", 60_000));
    // The grant ends behind its holder's back; the same owner name is
    // granted again.
    assert_eq!(c.cmd(&["DEL", "job"]).int(), 1);
    let new = token(c.acquire("job", "worker-1", 60_000));
    assert!(new > old);
    stale_changes_nothing(&mut c, "job", "worker-1", old);
    assert_eq!(
        c.lock_info("job").expect("held").holder("worker-1").token,
        new
    );
    // The new grant's own token renews and releases it.
    assert_eq!(renew(&mut c, "job", "worker-1", 120_000, new).int(), 1);
    assert!(c.pttl("job") > 60_000);
    assert_eq!(release(&mut c, "job", "worker-1", new).int(), 1);
    assert!(c.lock_info("job").is_none());
    assert_eq!(c.cmd(&["EXISTS", "job"]).int(), 0);
    // Without TOKEN, as before: any grant of the owner's.
    token(c.acquire("job", "worker-1", 60_000));
    assert_eq!(c.release("job", "worker-1").int(), 1);
    // A token on a free key: nil and 0.
    assert!(release(&mut c, "job", "worker-1", new).is_nil());
    assert_eq!(renew(&mut c, "job", "worker-1", 1_000, new).int(), 0);
    assert_eq!(c.cmd(&["EXISTS", "job"]).int(), 0);
}

#[test]
fn a_stale_token_after_an_expiry_frees_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.acquire("job", "worker-1", 50));
    wait_until(
        std::time::Duration::from_secs(10),
        "the lease to end",
        || c.lock_info("job").is_none(),
    );
    let new = token(c.acquire("job", "worker-1", 60_000));
    stale_changes_nothing(&mut c, "job", "worker-1", old);
    assert_eq!(
        c.lock_info("job").expect("held").holder("worker-1").token,
        new
    );
    // Another owner's token is no better.
    assert!(release(&mut c, "job", "worker-2", new).is_nil());
}

#[test]
fn a_reentrant_lock_gives_back_its_holds_under_its_own_token_only() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.racquire("r", "a", 60_000));
    c.cmd(&["DEL", "r"]);
    let t = token(c.racquire("r", "a", 60_000));
    assert_eq!(token(c.racquire("r", "a", 60_000)), t);
    stale_changes_nothing(&mut c, "r", "a", old);
    assert_eq!(c.lock_info("r").expect("held").holder("a").holds, 2);
    assert_eq!(release(&mut c, "r", "a", t).int(), 0, "one hold of two");
    assert_eq!(c.lock_info("r").expect("held").holder("a").holds, 1);
    assert_eq!(renew(&mut c, "r", "a", 60_000, t).int(), 1);
    assert_eq!(release(&mut c, "r", "a", t).int(), 1, "the last hold");
    assert!(c.lock_info("r").is_none());
}

#[test]
fn a_reader_acts_under_its_own_token_only() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.read("rw", "r1", 60_000));
    c.cmd(&["DEL", "rw"]);
    let t1 = token(c.read("rw", "r1", 60_000));
    let t2 = token(c.read("rw", "r2", 60_000));
    stale_changes_nothing(&mut c, "rw", "r1", old);
    // Another reader's token is not r1's.
    stale_changes_nothing(&mut c, "rw", "r1", t2);
    assert_eq!(release(&mut c, "rw", "r1", t1).int(), 1);
    let i = c.lock_info("rw").expect("r2 holds");
    assert_eq!(i.holders.len(), 1);
    assert_eq!(i.holder("r2").token, t2);
}

#[test]
fn a_semaphore_permit_acts_under_its_own_token_only() {
    let s = Server::start();
    let mut c = s.conn();
    let permit =
        |c: &mut Conn, owner: &str| token(c.cmd(&["LOCK.SEMAPHORE", "pool", "2", owner, "60000"]));
    let old = permit(&mut c, "a");
    assert_eq!(release(&mut c, "pool", "a", old).int(), 1);
    let a = permit(&mut c, "a");
    let b = permit(&mut c, "b");
    stale_changes_nothing(&mut c, "pool", "a", old);
    stale_changes_nothing(&mut c, "pool", "a", b);
    assert_eq!(renew(&mut c, "pool", "b", 60_000, b).int(), 1);
    assert_eq!(release(&mut c, "pool", "a", a).int(), 1);
    let i = c.lock_info("pool").expect("b holds");
    assert_eq!((i.holders.len(), i.limit), (1, Some(2)));
}

#[test]
fn each_macquire_key_is_released_under_its_own_token() {
    let s = Server::start();
    let mut c = s.conn();
    let grant = |c: &mut Conn| -> Vec<i64> {
        let r = c.cmd(&["LOCK.MACQUIRE", "2", "{m}a", "{m}b", "o", "60000"]);
        r.array().iter().map(|t| t.int()).collect()
    };
    let old = grant(&mut c);
    c.cmd(&["DEL", "{m}a", "{m}b"]);
    let new = grant(&mut c);
    stale_changes_nothing(&mut c, "{m}a", "o", old[0]);
    // The other key's token is not this key's.
    stale_changes_nothing(&mut c, "{m}a", "o", new[1]);
    assert_eq!(release(&mut c, "{m}a", "o", new[0]).int(), 1);
    assert!(c.lock_info("{m}a").is_none());
    assert_eq!(c.lock_info("{m}b").expect("held").holder("o").token, new[1]);
    assert_eq!(release(&mut c, "{m}b", "o", new[1]).int(), 1);
}

#[test]
fn a_stale_token_leaves_waiters_waiting_and_the_right_one_grants_them() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.acquire("q", "a", 60_000));
    c.cmd(&["DEL", "q"]);
    let t = token(c.acquire("q", "a", 60_000));
    let mut w = s.conn();
    w.send(&["LOCK.ACQUIRE", "q", "b", "60000", "WAIT", "0"])
        .expect("send");
    wait_until(std::time::Duration::from_secs(10), "b to wait", || {
        c.lock_info("q").is_some_and(|i| i.waiters == 1)
    });
    stale_changes_nothing(&mut c, "q", "a", old);
    assert_eq!(release(&mut c, "q", "a", t).int(), 1);
    let granted = token(w.read_reply().expect("b's grant"));
    assert_eq!(
        c.lock_info("q").expect("b holds").holder("b").token,
        granted
    );
}

#[test]
fn bound_holders_keep_their_keepalive_whatever_a_stale_token_says() {
    let s = Server::start();
    let mut c = s.conn();
    let old = token(c.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]));
    c.cmd(&["DEL", "k"]);
    let t = token(c.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]));
    stale_changes_nothing(&mut c, "k", "a", old);
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "90000"]).int(), 1);
    // (Its key has no Redis TTL: a bound holder follows its connection's
    // lease, which KEEPALIVE moves without a write of the key.)
    let left = c.lock_info("k").expect("held").holder("a").ttl;
    assert!(left > 60_000, "renewed by KEEPALIVE: {left}");
    assert_eq!(renew(&mut c, "k", "a", 30_000, t).int(), 1);
    assert_eq!(release(&mut c, "k", "a", t).int(), 1);
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "90000"]).int(), 0);
}

#[test]
fn replicas_follow_a_release_by_token_and_a_stale_one_replicates_nothing() {
    let master = Server::builder()
        .config("repl-ping-replica-period 3600")
        .start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let old = token(m.racquire("k", "a", 60_000));
    m.cmd(&["DEL", "k"]);
    let t = token(m.racquire("k", "a", 60_000));
    token(m.racquire("k", "a", 60_000));
    let r1 = token(m.read("rw", "r1", 60_000));
    token(m.read("rw", "r2", 60_000));
    wait_for_sync(&master, &replica);
    let offset = master.repl_offset();
    stale_changes_nothing(&mut m, "k", "a", old);
    stale_changes_nothing(&mut m, "rw", "r2", r1);
    assert_eq!(master.repl_offset(), offset, "a stale token was replicated");
    assert_eq!(release(&mut m, "k", "a", t).int(), 0);
    assert_eq!(renew(&mut m, "rw", "r1", 120_000, r1).int(), 1);
    assert!(master.repl_offset() > offset, "nothing replicated");
    let same = |what: &str| {
        wait_for_sync(&master, &replica);
        let mut r = replica.conn();
        let mut m = master.conn();
        for key in ["k", "rw"] {
            assert_same_lock(&m.lock_info(key), &r.lock_info(key), 100, what);
        }
    };
    same("after a RELEASE and a RENEW by token");
    assert_eq!(release(&mut m, "k", "a", t).int(), 1);
    assert_eq!(release(&mut m, "rw", "r1", r1).int(), 1);
    same("after the last holds released by token");
    assert!(replica.conn().lock_info("k").is_none());
    // A replica refuses them, TOKEN or not.
    let r = replica
        .conn()
        .cmd(&["LOCK.RELEASE", "rw", "r2", "TOKEN", "1"]);
    assert!(
        matches!(&r, Reply::Error(e) if e.starts_with("READONLY")),
        "{r:?}"
    );
}

#[test]
fn the_aof_replays_a_release_and_a_renewal_by_token() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .start();
    let mut c = s.conn();
    let t = token(c.racquire("k", "a", 60_000));
    token(c.racquire("k", "a", 60_000));
    let r = token(c.read("rw", "r", 60_000));
    assert_eq!(release(&mut c, "k", "a", t).int(), 0);
    assert_eq!(renew(&mut c, "rw", "r", 300_000, r).int(), 1);
    let before: Vec<_> = ["k", "rw"].iter().map(|k| c.lock_info(k)).collect();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    for (key, want) in ["k", "rw"].iter().zip(&before) {
        assert_same_lock(want, &c.lock_info(key), 5_000, "after an AOF restart");
    }
    assert_eq!(c.lock_info("k").expect("held").holder("a").holds, 1);
    assert!(c.lock_info("rw").expect("held").holder("r").ttl > 60_000);
}

/// docs/commands.md's LOCK.RELEASE and LOCK.RENEW examples, replayed
/// through redis-cli.
#[test]
fn the_docs_release_and_renew_examples_run() {
    let doc = markdown("docs/commands.md");
    for heading in ["## LOCK.RELEASE key owner", "## LOCK.RENEW key owner ttl"] {
        let section = section(&doc, heading);
        let blocks = fenced_blocks(&[(heading, section)], "");
        assert!(!blocks.is_empty(), "{heading}: no example");
        for (_, block) in blocks {
            replay_cli_transcript(&block);
        }
    }
}
