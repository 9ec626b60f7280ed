//! `LOCK.SEMAPHORE` (shared/CONTRACT.md, "Semaphores"): permits that cannot
//! leak, each with its own lease and token, first come first served.

use std::time::{Duration, Instant};

use crate::common::*;

fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn sem(c: &mut Conn, key: &str, limit: &str, owner: &str, ttl: &str) -> Reply {
    c.cmd(&["LOCK.SEMAPHORE", key, limit, owner, ttl])
}

fn stat(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .unwrap()
}

fn queued(obs: &mut Conn, key: &str, n: i64) {
    wait_until(Duration::from_secs(5), "waiters to queue", || {
        obs.lock_info(key).map_or(0, |i| i.waiters) == n
    });
}

#[test]
fn up_to_limit_holders_each_with_its_own_lease_and_token() {
    let s = Server::start();
    let mut c = s.conn();
    let a = token(sem(&mut c, "s", "2", "a", "60000"));
    let b = token(sem(&mut c, "s", "2", "b", "30000"));
    assert!(b > a);
    assert!(
        sem(&mut c, "s", "2", "c", "60000").is_nil(),
        "every permit is held"
    );
    // A holder's repeat: its token, its deadline reset, still one permit.
    assert_eq!(token(sem(&mut c, "s", "2", "b", "90000")), b);
    let info = c.lock_info("s").unwrap();
    assert_eq!(
        (info.mode.as_str(), info.limit, info.waiters),
        ("semaphore", Some(2), 0)
    );
    assert_eq!(info.holder("a").token, a);
    assert_eq!(info.holder("b").holds, 1);
    assert!(info.holder("b").ttl > 60_000, "b's own lease: {info:?}");
    assert!(info.holder("a").ttl <= 60_000);
    // The key lives as long as its latest lease.
    assert!(c.pttl("s") > 60_000);
    assert_eq!(
        c.release("s", "b").int(),
        1,
        "one permit per owner: RELEASE says 1"
    );
    assert!(c.release("s", "b").is_nil());
    assert_eq!(c.renew("s", "a", 120_000).int(), 1);
    assert!(c.lock_info("s").unwrap().holder("a").ttl > 100_000);
    token(sem(&mut c, "s", "2", "c", "60000"));
    // RESP3: a map with the limit last.
    let mut c3 = s.conn();
    c3.hello3();
    let r = c3.cmd(&["LOCK.INFO", "s"]);
    assert_eq!(LockInfo::parse(&r).unwrap().limit, Some(2));
    assert_eq!(c.type_of("s"), TYPE_NAME);
}

#[test]
fn the_limit_is_fixed_by_the_grant_that_creates_the_key_and_kinds_do_not_mix() {
    let s = Server::start();
    let mut c = s.conn();
    token(sem(&mut c, "s", "3", "a", "60000"));
    let before = c.lock_info("s").map(|i| (i.stable(), i.limit));
    let r = sem(&mut c, "s", "4", "b", "60000");
    assert!(
        r.err().starts_with("ERR") && r.err().contains("limit is 3"),
        "{r:?}"
    );
    // Even its holder cannot change it.
    assert!(sem(&mut c, "s", "2", "a", "60000").is_err());
    for cmd in ["LOCK.ACQUIRE", "LOCK.RACQUIRE", "LOCK.READ"] {
        let r = c.cmd(&[cmd, "s", "a", "1000"]);
        assert!(r.err().contains("semaphore"), "{cmd} on a semaphore: {r:?}");
    }
    let r = c.cmd(&["LOCK.MACQUIRE", "1", "s", "z", "1000"]);
    assert!(
        r.err().contains("semaphore"),
        "MACQUIRE on a semaphore: {r:?}"
    );
    let after = c.lock_info("s").map(|i| (i.stable(), i.limit));
    assert_eq!(after, before, "refusals change nothing");
    token(c.acquire("l", "a", 60000));
    token(c.read("r", "a", 60000));
    for key in ["l", "r"] {
        let r = sem(&mut c, key, "3", "b", "60000");
        assert!(r.err().contains("not a semaphore"), "{r:?}");
        let r = sem(&mut c, key, "3", "a", "60000");
        assert!(r.err().contains("not a semaphore"), "its holder too: {r:?}");
    }
    // Once every permit is gone the next grant sets a new limit.
    assert_eq!(c.release("s", "a").int(), 1);
    assert!(c.lock_info("s").is_none());
    token(sem(&mut c, "s", "1", "b", "60000"));
    assert_eq!(c.lock_info("s").unwrap().limit, Some(1));
    // Bad limits.
    for bad in ["0", "-1", "1000001", "x", "01", "+2", ""] {
        let r = sem(&mut c, "n", bad, "a", "1000");
        assert!(r.err().starts_with("ERR limit"), "limit {bad:?}: {r:?}");
    }
    token(sem(&mut c, "n", "1000000", "a", "1000"));
    assert!(c.cmd(&["LOCK.SEMAPHORE", "n", "2", "a"]).is_err(), "arity");
    assert!(
        c.cmd(&["LOCK.SEMAPHORE", "n", "2", "", "10"]).is_err(),
        "empty owner"
    );
    assert!(c
        .cmd(&["LOCK.SEMAPHORE", "n", "2", "a", "10", "WAIT"])
        .is_err());
    c.cmd(&["SET", "str", "v"]).ok();
    assert!(sem(&mut c, "str", "2", "a", "10")
        .err()
        .starts_with("WRONGTYPE"));
}

#[test]
fn waiters_are_granted_in_order_at_release_lease_end_delete_and_disconnect() {
    let s = Server::start();
    let mut c = s.conn();
    let mut bound = s.conn();
    token(bound.cmd(&["LOCK.SEMAPHORE", "s", "2", "bound", "60000", "BIND"]));
    token(sem(&mut c, "s", "2", "short", "1500"));
    let mut obs = s.conn();
    let mut waiters: Vec<Conn> = Vec::new();
    for (i, name) in ["w1", "w2", "w3", "w4"].iter().enumerate() {
        let mut w = s.conn();
        w.send(&["LOCK.SEMAPHORE", "s", "2", name, "60000", "WAIT", "10000"])
            .unwrap();
        w.set_timeout(Duration::from_secs(8));
        queued(&mut obs, "s", i as i64 + 1);
        waiters.push(w);
    }
    // A newcomer never jumps the queue.
    assert!(sem(&mut c, "s", "2", "late", "60000").is_nil());
    // Lease end: w1, promptly.
    let start = Instant::now();
    let t1 = token(waiters[0].read_reply().unwrap());
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // Disconnect of a bound holder: w2.
    drop(bound);
    let t2 = token(waiters[1].read_reply().unwrap());
    assert!(t2 > t1);
    // Release: w3.
    assert_eq!(c.release("s", "w1").int(), 1);
    token(waiters[2].read_reply().unwrap());
    // DEL frees every permit: w4 (and it alone: the limit is set anew).
    assert_eq!(c.cmd(&["DEL", "s"]).int(), 1);
    token(waiters[3].read_reply().unwrap());
    let info = c.lock_info("s").unwrap();
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, b"w4");
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn a_semaphore_is_replicated_with_its_limit_and_keepalive_serves_its_holders() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut c = master.conn();
    token(c.cmd(&["LOCK.SEMAPHORE", "s", "5", "a", "5000", "BIND"]));
    token(sem(&mut c, "s", "5", "b", "60000"));
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 1);
    assert!(c.lock_info("s").unwrap().holder("a").ttl > 30_000);
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    let (m, rep) = (c.lock_info("s"), r.lock_info("s"));
    assert_same_lock(&m, &rep, 200, "replica");
    assert_eq!(rep.unwrap().limit, Some(5));
    assert!(r
        .cmd(&["LOCK.SEMAPHORE", "s", "5", "z", "100"])
        .err()
        .starts_with("READONLY"));
    assert_eq!(c.release("s", "a").int(), 1);
    wait_for_sync(&master, &replica);
    assert_eq!(r.lock_info("s").unwrap().holders.len(), 1);
}
