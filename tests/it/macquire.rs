//! `LOCK.MACQUIRE` (shared/CONTRACT.md, "Several keys at once"): all or
//! none, atomically; a waiting request holds none of its keys and is never
//! overtaken on any of them.

use std::time::Duration;

use crate::common::*;

fn tokens(r: Reply) -> Vec<i64> {
    match r {
        Reply::Array(a) => a.iter().map(Reply::int).collect(),
        other => panic!("expected tokens, got {other:?}"),
    }
}

fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn waiters(obs: &mut Conn, key: &str) -> i64 {
    obs.lock_info(key).map_or_else(
        || {
            // A free key's waiters are not shown by LOCK.INFO: count them all.
            obs.info_field("lock", "lock_waiters").parse().unwrap()
        },
        |i| i.waiters,
    )
}

#[test]
fn all_or_none_with_tokens_in_key_order() {
    let s = Server::start();
    let mut c = s.conn();
    let t = tokens(c.cmd(&["LOCK.MACQUIRE", "3", "{a}1", "{a}2", "{a}3", "o", "60000"]));
    assert_eq!(t.len(), 3);
    assert!(t[0] < t[1] && t[1] < t[2], "issued in key order: {t:?}");
    for (i, key) in ["{a}1", "{a}2", "{a}3"].iter().enumerate() {
        let info = c.lock_info(key).unwrap();
        assert_eq!(
            (info.mode.as_str(), info.holder("o").token),
            ("exclusive", t[i])
        );
    }
    // One key held by another: none granted, nothing changed.
    token(c.acquire("{a}5", "p", 60000));
    let r = c.cmd(&["LOCK.MACQUIRE", "2", "{a}4", "{a}5", "q", "60000"]);
    assert!(r.is_nil(), "{r:?}");
    assert!(c.lock_info("{a}4").is_none(), "no key granted");
    // Keys the owner holds count as free for it: token kept, deadline reset.
    token(c.acquire("{a}6", "o", 1000));
    let again = tokens(c.cmd(&["LOCK.MACQUIRE", "2", "{a}1", "{a}6", "o", "90000"]));
    assert_eq!(again[0], t[0]);
    assert!(c.lock_info("{a}6").unwrap().holder("o").ttl > 60_000);
    // Each key is an ordinary lock.
    assert_eq!(c.release("{a}2", "o").int(), 1);
    assert!(c.lock_info("{a}2").is_none());
    // An owner holding one key shared, or a semaphore, is refused with an
    // error and nothing changes.
    token(c.read("{a}7", "o", 60000));
    let r = c.cmd(&["LOCK.MACQUIRE", "2", "{a}8", "{a}7", "o", "60000"]);
    assert!(r.err().starts_with("ERR"), "{r:?}");
    assert!(c.lock_info("{a}8").is_none());
}

#[test]
fn bad_input_is_an_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let cases: &[&[&str]] = &[
        &["LOCK.MACQUIRE", "0", "a", "o", "10"],
        &["LOCK.MACQUIRE", "-1", "a", "o", "10"],
        &["LOCK.MACQUIRE", "1001", "a", "o", "10"],
        &["LOCK.MACQUIRE", "x", "a", "o", "10"],
        &["LOCK.MACQUIRE", "3", "a", "b", "o", "10"],
        &["LOCK.MACQUIRE", "2", "a", "a", "o", "10"],
        &["LOCK.MACQUIRE", "1", "a", "", "10"],
        &["LOCK.MACQUIRE", "1", "a", "o", "0"],
        &["LOCK.MACQUIRE", "1", "a", "o", "10", "WAIT"],
        &[
            "LOCK.MACQUIRE",
            "1",
            "a",
            "o",
            "10",
            "WAIT",
            "1",
            "WAIT",
            "1",
        ],
        &["LOCK.MACQUIRE", "1", "a", "o", "10", "BIND", "BIND"],
        &["LOCK.MACQUIRE", "1", "a", "o", "10", "NOPE"],
        &["LOCK.MACQUIRE", "1", "a", "o"],
    ];
    for args in cases {
        let r = c.cmd(args);
        assert!(r.is_err() && r.err().starts_with("ERR"), "{args:?}: {r:?}");
    }
    assert!(c.lock_info("a").is_none());
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 0);
    c.cmd(&["SET", "str", "v"]).ok();
    let r = c.cmd(&["LOCK.MACQUIRE", "2", "k", "str", "o", "10"]);
    assert!(r.err().starts_with("WRONGTYPE"), "{r:?}");
    assert!(c.lock_info("k").is_none());
    // 1000 keys at once.
    let mut args: Vec<String> = vec!["LOCK.MACQUIRE".into(), "1000".into()];
    args.extend((0..1000).map(|i| format!("k{i}")));
    args.extend(["o".into(), "60000".into()]);
    assert_eq!(tokens(c.cmd(&args)).len(), 1000);
    // The keys are found from numkeys.
    let r = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.MACQUIRE",
        "2",
        "x",
        "y",
        "o",
        "10",
    ]);
    assert_eq!(
        r.array().iter().map(Reply::str).collect::<Vec<_>>(),
        ["x", "y"]
    );
}

#[test]
fn a_waiting_request_holds_none_of_its_keys_and_is_never_overtaken() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("b", "holder", 60000));
    let mut m = s.conn();
    m.send(&[
        "LOCK.MACQUIRE",
        "2",
        "a",
        "b",
        "multi",
        "60000",
        "WAIT",
        "10000",
    ])
    .unwrap();
    m.set_timeout(Duration::from_secs(8));
    let mut obs = s.conn();
    wait_until(Duration::from_secs(5), "the request to queue", || {
        waiters(&mut obs, "b") == 1
    });
    // It holds none of its keys meanwhile, and nobody passes it on `a`.
    assert!(c.lock_info("a").is_none());
    assert!(
        c.acquire("a", "late", 60000).is_nil(),
        "a later request overtook it"
    );
    let mut late = s.conn();
    late.send(&["LOCK.ACQUIRE", "a", "late2", "60000", "WAIT", "10000"])
        .unwrap();
    late.set_timeout(Duration::from_secs(8));
    wait_until(Duration::from_secs(5), "the second waiter", || {
        obs.info_field("lock", "lock_waiters") == "2"
    });
    assert!(c.lock_info("a").is_none());
    // `b` frees: both keys at once.
    assert_eq!(c.release("b", "holder").int(), 1);
    let t = tokens(m.read_reply().unwrap());
    assert_eq!(t.len(), 2);
    assert_eq!(c.lock_info("a").unwrap().holder("multi").token, t[0]);
    assert_eq!(c.lock_info("b").unwrap().holder("multi").token, t[1]);
    assert_eq!(c.release("a", "multi").int(), 1);
    token(late.read_reply().unwrap());
}

#[test]
fn a_waiting_request_is_granted_at_lease_end_and_times_out_cleanly() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("x", "h", 700));
    let mut m = s.conn();
    m.set_timeout(Duration::from_secs(8));
    let r = m.cmd(&["LOCK.MACQUIRE", "2", "x", "y", "m", "60000", "WAIT", "5000"]);
    assert_eq!(tokens(r).len(), 2, "granted when x's lease ended");
    // A timeout leaves no trace, and the keys it waited on are free for others.
    let r = m.cmd(&["LOCK.MACQUIRE", "2", "z", "x", "n", "60000", "WAIT", "300"]);
    assert!(r.is_nil(), "{r:?}");
    assert!(c.lock_info("z").is_none());
    assert_eq!(c.info_field("lock", "lock_waiters"), "0");
    token(c.acquire("z", "other", 1000));
    // A disconnected waiter is never granted.
    let mut gone = s.conn();
    gone.send(&["LOCK.MACQUIRE", "2", "w", "x", "g", "60000", "WAIT", "0"])
        .unwrap();
    wait_until(Duration::from_secs(5), "queued", || {
        c.info_field("lock", "lock_waiters") == "1"
    });
    drop(gone);
    wait_until(Duration::from_secs(5), "gone", || {
        c.info_field("lock", "lock_waiters") == "0"
    });
    assert_eq!(c.release("x", "m").int(), 1);
    assert!(c.lock_info("w").is_none() && c.lock_info("x").is_none());
}

#[test]
fn bind_replication_and_the_aof_get_every_key() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut c = master.conn();
    let id = c.cmd(&["CLIENT", "ID"]).int();
    let t = tokens(c.cmd(&["LOCK.MACQUIRE", "2", "p", "q", "o", "60000", "BIND"]));
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    for (i, key) in ["p", "q"].iter().enumerate() {
        assert_eq!(r.lock_info(key).unwrap().holder("o").token, t[i]);
    }
    let mut k = master.conn();
    k.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]).int();
    wait_until(Duration::from_secs(5), "released on disconnect", || {
        k.lock_info("p").is_none() && k.lock_info("q").is_none()
    });
    wait_for_sync(&master, &replica);
    assert!(r.lock_info("p").is_none() && r.lock_info("q").is_none());
    assert!(r
        .cmd(&["LOCK.MACQUIRE", "1", "p", "o", "10"])
        .err()
        .starts_with("READONLY"));
}

#[test]
fn inside_multi_wait_is_an_immediate_try() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("b", "h", 60000));
    c.cmd(&["MULTI"]).ok();
    c.cmd(&["LOCK.MACQUIRE", "2", "a", "b", "m", "1000", "WAIT", "0"]);
    let r = c.cmd(&["EXEC"]);
    assert!(r.array()[0].is_nil(), "{r:?}");
    assert!(c.lock_info("a").is_none());
}

/// A free key that only a waiting multi-key request is queued on: nobody
/// holds it, yet `LOCK.ACQUIRE` is refused there (nobody overtakes the
/// request). `LOCK.INFO key WAITERS` shows that queue (`mode` `free`, no
/// holders, `waiters` and `waiting`); `LOCK.INFO key` stays nil (free).
#[test]
fn info_with_waiters_shows_the_queue_on_a_free_key() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("b", "holder", 60000));
    let mut m = s.conn();
    m.send(&[
        "LOCK.MACQUIRE",
        "2",
        "a",
        "b",
        "multi",
        "60000",
        "WAIT",
        "10000",
    ])
    .unwrap();
    m.set_timeout(Duration::from_secs(8));
    let mut obs = s.conn();
    wait_until(Duration::from_secs(5), "the request to queue", || {
        waiters(&mut obs, "b") == 1
    });
    assert!(c.acquire("a", "late", 60000).is_nil());
    assert!(c.cmd(&["LOCK.INFO", "a"]).is_nil(), "free: nil");
    for proto in [2, 3] {
        let mut q = s.conn();
        if proto == 3 {
            q.hello3();
        }
        let r = q.cmd(&["LOCK.INFO", "a", "WAITERS"]);
        let pairs = r.pairs();
        let names: Vec<&str> = pairs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["mode", "holders", "waiters", "waiting"], "{r:?}");
        assert!(pairs[0].1.is("free"), "{r:?}");
        assert!(pairs[1].1.array().is_empty(), "{r:?}");
        assert_eq!(pairs[2].1.int(), 1, "{r:?}");
        let waiting = pairs[3].1.array();
        assert_eq!(waiting.len(), 1, "{r:?}");
        assert_eq!(waiting[0].array()[0].bulk(), b"multi", "{r:?}");
    }
    // A key nobody holds or waits for is nil with WAITERS too.
    assert!(c.cmd(&["LOCK.INFO", "z", "WAITERS"]).is_nil());
    assert_eq!(c.release("b", "holder").int(), 1);
    assert_eq!(tokens(m.read_reply().unwrap()).len(), 2);
}
