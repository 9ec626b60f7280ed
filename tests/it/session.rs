//! Sessions (contract v4, "Sessions"; issue 42): `LOCK.SESSION OPEN |
//! KEEPALIVE | CLOSE | INFO` and `SESSION id` on every grant command. A
//! session holder holds while its session lives and ends the moment it
//! ends (CLOSE, its deadline, a shortening KEEPALIVE) for every command,
//! its waiters granted; a waiter whose session ends gets `NOSESSION`;
//! replicas, RDB, AOF, DEBUG RELOAD and a promotion keep sessions, deadlines
//! and holders; DUMP/RESTORE gives the copy the session's deadline; a
//! hundred thousand holders end with one CLOSE; a session survives its
//! client's connections being killed every 100 ms where `BIND` loses
//! everything at the first kill.

use std::time::{Duration, Instant};

use crate::common::*;

#[track_caller]
fn open(c: &mut Conn, ttl: i64) -> i64 {
    let r = c.cmd(&["LOCK.SESSION", "OPEN", &ttl.to_string()]);
    let id = r.int();
    assert!(id > 0, "a session id is a positive integer: {r:?}");
    id
}

/// `LOCK.SESSION INFO id`: `(ttl, holders)`, or `None`.
#[track_caller]
fn session_info(c: &mut Conn, id: i64) -> Option<(i64, i64)> {
    let r = c.cmd(&["LOCK.SESSION", "INFO", &id.to_string()]);
    if r.is_nil() {
        return None;
    }
    let pairs = r.pairs();
    let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["ttl", "holders"], "{r:?}");
    Some((pairs[0].1.int(), pairs[1].1.int()))
}

fn s(id: i64) -> String {
    id.to_string()
}

#[track_caller]
fn nosession(r: &Reply) {
    assert!(
        r.is_err() && r.err().starts_with("NOSESSION"),
        "expected NOSESSION, got {r:?}"
    );
}

#[test]
fn open_keepalive_info_close_and_ids_drawn_like_tokens() {
    let srv = Server::start();
    let mut c = srv.conn();
    let t = c.acquire("k", "a", 60_000).int();
    let id = open(&mut c, 30_000);
    assert!(
        id > t,
        "a session id is drawn above every token ({id} <= {t})"
    );
    let t2 = c.acquire("k2", "a", 60_000).int();
    assert!(t2 > id, "and a token above every id");
    let (ttl, holders) = session_info(&mut c, id).expect("live");
    assert!(ttl > 25_000 && ttl <= 30_000, "{ttl}");
    assert_eq!(holders, 0);
    // KEEPALIVE lengthens, and shortens.
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "90000"]).int(),
        1
    );
    assert!(session_info(&mut c, id).expect("live").0 > 60_000);
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "5000"]).int(),
        1
    );
    assert!(session_info(&mut c, id).expect("live").0 <= 5_000);
    // RESP3: a map.
    let mut c3 = srv.conn();
    c3.hello3();
    let r = c3.cmd(&["LOCK.SESSION", "INFO", &s(id)]);
    assert!(matches!(r, Reply::Map(_)), "RESP3 INFO is a map: {r:?}");
    assert_eq!(c.info_field("lock", "lock_sessions"), "1");
    // CLOSE: 0 holders; then it is gone for every subcommand.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 0);
    assert_eq!(session_info(&mut c, id), None);
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 0);
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "5000"]).int(),
        0
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", "123"]).int(), 0);
    assert_eq!(session_info(&mut c, 123), None);
    assert_eq!(c.info_field("lock", "lock_sessions"), "0");
    // Ids are never reused.
    let next = open(&mut c, 1000);
    assert!(next > t2);
}

#[test]
fn every_grant_command_follows_the_session_and_close_ends_them_all() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 60_000);
    let sid = s(id);
    assert!(
        c.cmd(&["LOCK.ACQUIRE", "x", "a", "1000", "SESSION", &sid])
            .int()
            > 0
    );
    assert!(
        c.cmd(&["LOCK.RACQUIRE", "rx", "a", "1000", "SESSION", &sid])
            .int()
            > 0
    );
    assert!(
        c.cmd(&["LOCK.READ", "r", "a", "1000", "SESSION", &sid])
            .int()
            > 0
    );
    assert!(
        c.cmd(&["LOCK.READ", "r", "b", "1000", "session", &sid])
            .int()
            > 0
    );
    assert!(
        c.cmd(&["LOCK.SEMAPHORE", "sem", "3", "a", "1000", "SESSION", &sid])
            .int()
            > 0
    );
    let r = c.cmd(&[
        "LOCK.MACQUIRE",
        "2",
        "m1",
        "m2",
        "a",
        "1000",
        "SESSION",
        &sid,
    ]);
    assert_eq!(r.array().len(), 2, "{r:?}");
    // A holder with its own lease beside them.
    assert!(c.cmd(&["LOCK.READ", "r", "own", "60000"]).int() > 0);
    assert_eq!(session_info(&mut c, id).expect("live").1, 7);
    // Its ttl argument is unused: the lease is the session's.
    for key in ["x", "rx", "r", "sem", "m1", "m2"] {
        let info = c.lock_info(key).expect("held");
        let h = info.holder("a");
        assert!(h.ttl > 50_000, "{key}: the session's ttl: {info:?}");
        // No Redis TTL while the session lives.
        assert_eq!(c.pttl(key), -1, "{key}");
    }
    // RENEW of a session holder: 1, nothing changed.
    assert_eq!(c.cmd(&["LOCK.RENEW", "x", "a", "10"]).int(), 1);
    sleep_ms(50);
    assert!(c.lock_info("x").expect("held").holder("a").ttl > 50_000);
    // A reentrant repeat keeps the session.
    assert!(c.cmd(&["LOCK.RACQUIRE", "rx", "a", "10"]).int() > 0);
    assert_eq!(c.lock_info("rx").expect("held").holder("a").holds, 2);
    sleep_ms(50);
    assert!(c.lock_info("rx").expect("held").holder("a").ttl > 50_000);
    // A plain RELEASE works as for any holder.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "m2", "a"]).int(), 1);
    assert_eq!(session_info(&mut c, id).expect("live").1, 6);
    // CLOSE: every holder ends at once, for every command.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &sid]).int(), 6);
    for key in ["x", "rx", "sem", "m1"] {
        assert!(c.lock_info(key).is_none(), "{key} ended with its session");
        assert!(c.cmd(&["LOCK.RELEASE", key, "a"]).is_nil(), "{key}");
    }
    let info = c.lock_info("r").expect("own reader");
    assert_eq!(info.holders.len(), 1, "{info:?}");
    assert_eq!(info.holders[0].owner, b"own");
    let b = c.cmd(&["LOCK.ACQUIRE", "x", "b", "1000"]);
    assert!(b.int() > 0, "x is free: {b:?}");
    wait_until(Duration::from_secs(5), "the ended keys cleaned up", || {
        c.cmd(&["EXISTS", "rx", "sem", "m1"]).int() == 0
    });
    // The reader with its own lease is left, with its own TTL again.
    wait_until(Duration::from_secs(5), "r's TTL its own", || {
        c.pttl("r") > 0
    });
}

#[test]
fn a_session_that_is_unknown_or_ended_is_nosession_and_changes_nothing() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 60_000);
    c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]);
    for sid in [s(id), "424242".to_string()] {
        nosession(&c.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &sid]));
        nosession(&c.cmd(&["LOCK.READ", "k", "a", "1000", "SESSION", &sid, "WAIT", "10"]));
        nosession(&c.cmd(&["LOCK.SEMAPHORE", "k", "2", "a", "1000", "SESSION", &sid]));
        nosession(&c.cmd(&["LOCK.MACQUIRE", "2", "k", "j", "a", "1000", "SESSION", &sid]));
        nosession(&c.cmd(&["LOCK.RACQUIRE", "k", "a", "1000", "BIND", "SESSION", &sid]));
    }
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 0);
    // A holder's repeat naming a dead session changes nothing either.
    let t = c.acquire("k", "a", 60_000).int();
    nosession(&c.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &s(id)]));
    let info = c.lock_info("k").expect("held");
    assert_eq!(info.holder("a").token, t);
    assert!(c.pttl("k") > 50_000);
}

#[test]
fn a_repeat_moves_to_the_session_it_names() {
    let srv = Server::start();
    let mut c = srv.conn();
    let one = open(&mut c, 60_000);
    let two = open(&mut c, 60_000);
    let t = c
        .cmd(&["LOCK.RACQUIRE", "k", "a", "1000", "SESSION", &s(one)])
        .int();
    assert_eq!(
        c.cmd(&["LOCK.RACQUIRE", "k", "a", "1000", "SESSION", &s(two)])
            .int(),
        t
    );
    assert_eq!(session_info(&mut c, one).expect("live").1, 0);
    assert_eq!(session_info(&mut c, two).expect("live").1, 1);
    // Closing the first changes nothing now.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(one)]).int(), 0);
    assert_eq!(c.lock_info("k").expect("held").holder("a").holds, 2);
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(two)]).int(), 1);
    assert!(c.lock_info("k").is_none());
}

#[test]
fn a_session_ends_at_its_deadline_even_if_nobody_touches_its_keys() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    for i in 0..50 {
        let key = format!("k{i}");
        assert!(
            c.cmd(&["LOCK.ACQUIRE", &key, "a", "60000", "SESSION", &s(id)])
                .int()
                > 0
        );
    }
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 50);
    // Its deadline 300 ms from now; nobody touches its keys after.
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "300"]).int(),
        1
    );
    wait_until(
        Duration::from_secs(10),
        "the timer ended the session",
        || c.cmd(&["DBSIZE"]).int() == 0,
    );
    assert_eq!(session_info(&mut c, id), None);
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "5000"]).int(),
        0
    );
}

#[test]
fn keepalive_shortening_ends_the_holders_and_grants_their_waiters() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    assert!(
        c.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &s(id)])
            .int()
            > 0
    );
    let mut w = srv.conn();
    w.send(&["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"])
        .unwrap();
    wait_until(Duration::from_secs(5), "b waits", || {
        c.lock_info("k").is_some_and(|i| i.waiters == 1)
    });
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "200"]).int(),
        1
    );
    let granted = w.read_reply().expect("b's answer");
    assert!(
        granted.int() > 0,
        "b granted at the new deadline: {granted:?}"
    );
    let info = c.lock_info("k").expect("b holds");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, b"b");
}

#[test]
fn close_grants_the_waiters_and_ends_the_sessions_own_waiters_with_nosession() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    let other = open(&mut c, 600_000);
    assert!(
        c.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &s(id)])
            .int()
            > 0
    );
    assert!(c.cmd(&["LOCK.ACQUIRE", "j", "x", "60000"]).int() > 0);
    // b waits for k (its own lease); d waits for j with the other session.
    let mut b = srv.conn();
    b.send(&["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "0"])
        .unwrap();
    let mut d = srv.conn();
    d.send(&[
        "LOCK.ACQUIRE",
        "j",
        "d",
        "60000",
        "WAIT",
        "0",
        "SESSION",
        &s(other),
    ])
    .unwrap();
    wait_until(Duration::from_secs(5), "both wait", || {
        c.lock_info("k").is_some_and(|i| i.waiters == 1)
            && c.lock_info("j").is_some_and(|i| i.waiters == 1)
    });
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 1);
    assert!(b.read_reply().expect("b").int() > 0, "b granted");
    // The other session ends while d waits: d leaves the queue, NOSESSION.
    c.cmd(&["LOCK.SESSION", "CLOSE", &s(other)]);
    nosession(&d.read_reply().expect("d"));
    assert_eq!(c.lock_info("j").expect("x holds").waiters, 0);
    // A waiter with a live session follows it once granted.
    let third = open(&mut c, 600_000);
    let mut e = srv.conn();
    e.send(&[
        "LOCK.ACQUIRE",
        "j",
        "e",
        "10",
        "WAIT",
        "0",
        "SESSION",
        &s(third),
    ])
    .unwrap();
    wait_until(Duration::from_secs(5), "e waits", || {
        c.lock_info("j").is_some_and(|i| i.waiters == 1)
    });
    c.cmd(&["LOCK.RELEASE", "j", "x"]);
    assert!(e.read_reply().expect("e").int() > 0);
    sleep_ms(50);
    assert!(c.lock_info("j").expect("e holds").holder("e").ttl > 500_000);
    assert_eq!(session_info(&mut c, third).expect("live").1, 1);
}

/// A session's waiter that was granted leaves the session's waiters: its
/// id (the blocked client's) may be a later waiter's, which the session's
/// end must not answer `NOSESSION`.
#[test]
fn a_session_ends_only_its_own_waiters_not_those_granted_before() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    assert!(
        c.cmd(&["LOCK.ACQUIRE", "k1", "o1", "600000", "SESSION", &s(id)])
            .int()
            > 0
    );
    assert!(c.cmd(&["LOCK.ACQUIRE", "w", "o9", "30000"]).int() > 0);
    // One connection waits twice: first with the session (granted), then
    // without one on the session's key; its blocked client is made the
    // same way both times.
    let mut b = srv.conn();
    for round in 0..20 {
        let owner = format!("o1b-{round}");
        b.send(&[
            "LOCK.ACQUIRE",
            "w",
            &owner,
            "600000",
            "SESSION",
            &s(id),
            "WAIT",
            "5000",
        ])
        .unwrap();
        wait_until(Duration::from_secs(5), "the session's waiter waits", || {
            c.lock_info("w").is_some_and(|i| i.waiters == 1)
        });
        let holder = match round {
            0 => "o9".to_string(),
            n => format!("o1b-{}", n - 1),
        };
        assert_eq!(c.cmd(&["LOCK.RELEASE", "w", &holder]).int(), 1);
        assert!(b.read_reply().expect("granted").int() > 0);
    }
    b.send(&["LOCK.ACQUIRE", "k1", "o2", "30000", "WAIT", "5000"])
        .unwrap();
    wait_until(Duration::from_secs(5), "o2 waits", || {
        c.lock_info("k1").is_some_and(|i| i.waiters == 1)
    });
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 2);
    let r = b.read_reply().expect("o2");
    assert!(
        matches!(r, Reply::Int(t) if t > 0),
        "o2 granted, not refused: {r:?}"
    );
}

#[test]
fn bind_with_session_ends_at_the_first_of_the_two() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    let mut b = srv.conn();
    assert!(
        b.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "BIND", "SESSION", &s(id)])
            .int()
            > 0
    );
    assert!(
        b.cmd(&["LOCK.ACQUIRE", "j", "a", "1000", "SESSION", &s(id), "BIND"])
            .int()
            > 0
    );
    // KEEPALIVE of the connection renews nothing it needs to.
    assert_eq!(b.cmd(&["LOCK.KEEPALIVE", "5000"]).int(), 2);
    assert!(c.lock_info("k").expect("held").holder("a").ttl > 500_000);
    drop(b);
    wait_until(
        Duration::from_secs(5),
        "the connection's close ended both",
        || c.lock_info("k").is_none() && c.lock_info("j").is_none(),
    );
    // And the session's end ends a bound one too.
    let mut b = srv.conn();
    assert!(
        b.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "BIND", "SESSION", &s(id)])
            .int()
            > 0
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 1);
    assert!(c.lock_info("k").is_none());
    assert!(b.cmd(&["PING"]).is("PONG"));
}

#[test]
fn the_cap_on_sessions_and_bad_input_for_every_subcommand() {
    let srv = Server::start();
    let mut c = srv.conn();
    c.cmd(&["CONFIG", "SET", "lock.max-sessions", "2"]).ok();
    let a = open(&mut c, 60_000);
    open(&mut c, 60_000);
    let r = c.cmd(&["LOCK.SESSION", "OPEN", "60000"]);
    assert!(
        r.is_err() && r.err().starts_with("ERR too many sessions"),
        "{r:?}"
    );
    c.cmd(&["LOCK.SESSION", "CLOSE", &s(a)]);
    open(&mut c, 60_000);
    c.cmd(&["CONFIG", "SET", "lock.max-sessions", "100000"])
        .ok();
    let before = c.info_field("lock", "lock_sessions");
    let bad_ttl = bad_ttl();
    let bad_id = "ERR session id must be a positive integer";
    let arity = |r: &Reply| r.is_err() && r.err().contains("wrong number of arguments");
    let cases: Vec<(Vec<&str>, Option<&str>)> = vec![
        (vec!["LOCK.SESSION"], None),
        (vec!["LOCK.SESSION", "OPEN"], None),
        (vec!["LOCK.SESSION", "OPEN", "1", "2"], None),
        (vec!["LOCK.SESSION", "OPEN", "0"], Some(&bad_ttl)),
        (vec!["LOCK.SESSION", "OPEN", "-5"], Some(&bad_ttl)),
        (vec!["LOCK.SESSION", "OPEN", "abc"], Some(&bad_ttl)),
        (
            vec!["LOCK.SESSION", "OPEN", "99999999999999999999"],
            Some(&bad_ttl),
        ),
        (vec!["LOCK.SESSION", "KEEPALIVE", "1"], None),
        (vec!["LOCK.SESSION", "KEEPALIVE", "1", "2", "3"], None),
        (vec!["LOCK.SESSION", "KEEPALIVE", "0", "1000"], Some(bad_id)),
        (
            vec!["LOCK.SESSION", "KEEPALIVE", "-1", "1000"],
            Some(bad_id),
        ),
        (vec!["LOCK.SESSION", "KEEPALIVE", "x", "1000"], Some(bad_id)),
        (vec!["LOCK.SESSION", "KEEPALIVE", "1", "0"], Some(&bad_ttl)),
        (vec!["LOCK.SESSION", "CLOSE"], None),
        (vec!["LOCK.SESSION", "CLOSE", "1", "2"], None),
        (vec!["LOCK.SESSION", "CLOSE", "0"], Some(bad_id)),
        (vec!["LOCK.SESSION", "CLOSE", "1.5"], Some(bad_id)),
        (vec!["LOCK.SESSION", "INFO"], None),
        (vec!["LOCK.SESSION", "INFO", "", ""], None),
        (vec!["LOCK.SESSION", "INFO", ""], Some(bad_id)),
        (
            vec!["LOCK.SESSION", "INFO", "9223372036854775808"],
            Some(bad_id),
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "SESSION"],
            Some("ERR syntax error"),
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", "0"],
            Some(bad_id),
        ),
        (
            vec!["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", "-3"],
            Some(bad_id),
        ),
        (
            vec![
                "LOCK.ACQUIRE",
                "k",
                "a",
                "1000",
                "SESSION",
                "1",
                "SESSION",
                "1",
            ],
            Some("ERR syntax error"),
        ),
        (
            vec!["LOCK.READ", "k", "a", "0", "SESSION", "1"],
            Some(&bad_ttl),
        ),
    ];
    for (args, want) in &cases {
        let r = c.cmd(args);
        match want {
            Some(text) => assert_eq!(r.err(), *text, "{args:?}"),
            None => assert!(
                arity(&r) || r.err().contains("unknown subcommand"),
                "{args:?}: {r:?}"
            ),
        }
    }
    let r = c.cmd(&["LOCK.SESSION", "NOPE", "1"]);
    assert!(r.is_err(), "{r:?}");
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 0, "bad input changed nothing");
    assert_eq!(c.info_field("lock", "lock_sessions"), before);
}

#[test]
fn command_metadata_of_the_container_and_its_subcommands() {
    let srv = Server::start();
    let mut c = srv.conn();
    let r = c.cmd(&["COMMAND", "INFO", "lock.session"]);
    let info = &r.array()[0];
    assert_eq!(info.array()[1].int(), -3, "the container's arity");
    let subs = info.array()[9].array();
    let mut seen = Vec::new();
    for sub in subs {
        let a = sub.array();
        let name = a[0].str();
        let flags: Vec<String> = a[2].array().iter().map(|f| f.str()).collect();
        let arity = a[1].int();
        let (want_arity, write) = match name.as_str() {
            "lock.session|open" => (3, true),
            "lock.session|keepalive" => (4, true),
            "lock.session|close" => (3, true),
            "lock.session|info" => (3, false),
            other => panic!("unexpected subcommand {other}"),
        };
        assert_eq!(arity, want_arity, "{name}");
        assert_eq!(
            flags.contains(&"write".to_string()),
            write,
            "{name}: {flags:?}"
        );
        assert_eq!(
            flags.contains(&"readonly".to_string()),
            !write,
            "{name}: {flags:?}"
        );
        let categories: Vec<String> = a[6].array().iter().map(|f| f.str()).collect();
        if !categories.is_empty() {
            // Where the server takes module ACL categories (7.2 on).
            let want = if write { "@write" } else { "@read" };
            assert!(
                categories.contains(&want.to_string()),
                "{name}: {categories:?}"
            );
        }
        seen.push(name);
    }
    seen.sort();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let docs = c.cmd(&["COMMAND", "DOCS", "lock.session"]);
    let mut words = Vec::new();
    flatten(&docs, &mut words);
    for sub in ["open", "keepalive", "close", "info"] {
        let name = format!("lock.session|{sub}");
        assert!(words.contains(&name), "{name} in {words:?}");
    }
    assert!(
        words.iter().filter(|w| *w == "summary").count() >= 5,
        "{words:?}"
    );
}

/// Every string of a nested reply, in order.
fn flatten(r: &Reply, out: &mut Vec<String>) {
    match r {
        Reply::Array(a) | Reply::Set(a) => a.iter().for_each(|x| flatten(x, out)),
        Reply::Map(m) => m.iter().for_each(|(k, v)| {
            flatten(k, out);
            flatten(v, out);
        }),
        Reply::Bulk(_) | Reply::Status(_) => out.push(r.str()),
        _ => {}
    }
}

/// The replica's view of sessions and locks equals the master's.
#[track_caller]
fn same_view(m: &mut Conn, r: &mut Conn, id: i64, keys: &[&str]) {
    let a = session_info(m, id);
    let b = session_info(r, id);
    assert_eq!(a.map(|x| x.1), b.map(|x| x.1), "session {id}'s holders");
    if let (Some(a), Some(b)) = (a, b) {
        assert!((a.0 - b.0).abs() < 2_000, "session ttl {a:?} vs {b:?}");
    }
    for key in keys {
        assert_same_lock(&m.lock_info(key), &r.lock_info(key), 2_000, key);
    }
}

#[test]
fn a_replica_sees_the_same_sessions_and_holders_and_a_promoted_one_keeps_them() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let id = open(&mut m, 60_000);
    let gone = open(&mut m, 60_000);
    m.cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &s(id)]);
    m.cmd(&["LOCK.READ", "r", "a", "1000", "SESSION", &s(id)]);
    m.cmd(&["LOCK.READ", "r", "b", "60000"]);
    m.cmd(&["LOCK.READ", "r", "c", "1000", "SESSION", &s(gone)]);
    m.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "90000"]);
    m.cmd(&["LOCK.SESSION", "CLOSE", &s(gone)]);
    wait_for_sync(&master, &replica);
    same_view(&mut m, &mut r, id, &["k", "r"]);
    assert_eq!(session_info(&mut r, gone), None);
    // A replica refuses the writes, answers INFO.
    for args in [
        vec!["LOCK.SESSION", "OPEN", "1000"],
        vec!["LOCK.SESSION", "KEEPALIVE", &s(id), "1000"],
        vec!["LOCK.SESSION", "CLOSE", &s(id)],
    ] {
        let e = r.cmd(&args);
        assert!(
            e.is_err() && e.err().starts_with("READONLY"),
            "{args:?}: {e:?}"
        );
    }
    assert!(session_info(&mut r, id).is_some());
    // Promoted: the same sessions, and ids drawn above.
    replica.promote();
    let next = open(&mut r, 1000);
    assert!(next > id);
    assert_eq!(session_info(&mut r, id).expect("kept").1, 2);
    assert_eq!(r.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 2);
    assert!(r.lock_info("k").is_none());
}

#[test]
fn a_replica_hears_of_an_end_by_time() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let id = open(&mut m, 600_000);
    for i in 0..20 {
        m.cmd(&[
            "LOCK.ACQUIRE",
            &format!("k{i}"),
            "a",
            "1000",
            "SESSION",
            &s(id),
        ]);
    }
    wait_for_sync(&master, &replica);
    assert_eq!(r.cmd(&["DBSIZE"]).int(), 20);
    // Shortened: it ends by time, on the master's timer.
    assert_eq!(
        m.cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "200"]).int(),
        1
    );
    wait_until(
        Duration::from_secs(10),
        "the end reached the replica",
        || r.cmd(&["DBSIZE"]).int() == 0 && session_info(&mut r, id).is_none(),
    );
}

fn restart_keeps(srv: &mut Server, how: &str, reload: impl FnOnce(&mut Server)) {
    let mut c = srv.conn();
    let id = open(&mut c, 120_000);
    let ended = open(&mut c, 120_000);
    let t = c
        .cmd(&["LOCK.ACQUIRE", "k", "a", "1000", "SESSION", &s(id)])
        .int();
    c.cmd(&["LOCK.READ", "r", "a", "1000", "SESSION", &s(id)]);
    c.cmd(&["LOCK.READ", "r", "b", "60000"]);
    c.cmd(&["LOCK.SESSION", "CLOSE", &s(ended)]);
    let before = (session_info(&mut c, id), c.lock_info("k"), c.lock_info("r"));
    drop(c);
    reload(srv);
    let mut c = srv.conn();
    let after = (session_info(&mut c, id), c.lock_info("k"), c.lock_info("r"));
    assert_eq!(
        after.0.map(|x| x.1),
        Some(2),
        "{how}: the session's holders"
    );
    assert!(
        (after.0.expect("live").0 - before.0.expect("live").0).abs() < 10_000,
        "{how}: the same deadline"
    );
    assert_same_lock(&before.1, &after.1, 10_000, how);
    assert_same_lock(&before.2, &after.2, 10_000, how);
    assert_eq!(session_info(&mut c, ended), None, "{how}");
    assert_eq!(c.pttl("k"), -1, "{how}");
    let next = open(&mut c, 1000);
    assert!(next > t, "{how}: ids above what was issued");
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 2, "{how}");
    assert!(c.lock_info("k").is_none(), "{how}");
    let r = c.lock_info("r").expect("b's own lease");
    assert_eq!(r.holders.len(), 1, "{how}");
}

#[test]
fn rdb_restart_and_debug_reload_keep_sessions_deadlines_and_holders() {
    let mut srv = Server::start();
    restart_keeps(&mut srv, "DEBUG RELOAD", |s| {
        s.conn().cmd(&["DEBUG", "RELOAD"]).ok();
    });
    let mut srv = Server::start();
    restart_keeps(&mut srv, "RDB restart", |s| {
        s.conn().cmd(&["SAVE"]).ok();
        s.restart();
    });
}

#[test]
fn aof_restart_keeps_them_with_and_without_the_rdb_preamble() {
    for preamble in ["yes", "no"] {
        let mut srv = Server::builder()
            .config("appendonly yes")
            .config("appendfsync always")
            .config(&format!("aof-use-rdb-preamble {preamble}"))
            .start();
        restart_keeps(&mut srv, &format!("AOF (preamble {preamble})"), |s| {
            s.restart();
        });
        let mut srv = Server::builder()
            .config("appendonly yes")
            .config(&format!("aof-use-rdb-preamble {preamble}"))
            .start();
        restart_keeps(
            &mut srv,
            &format!("AOF rewrite (preamble {preamble})"),
            |s| {
                let mut c = s.conn();
                c.cmd(&["BGREWRITEAOF"]);
                wait_until(Duration::from_secs(20), "the rewrite", || {
                    c.info_field("persistence", "aof_rewrite_in_progress") == "0"
                        && c.info_field("persistence", "aof_rewrite_scheduled") == "0"
                });
                s.restart();
            },
        );
    }
}

#[test]
fn dump_and_restore_give_the_copy_the_sessions_deadline() {
    let srv = Server::start();
    let other = Server::start();
    let mut c = srv.conn();
    let mut o = other.conn();
    let id = open(&mut c, 90_000);
    c.cmd(&["LOCK.READ", "r", "a", "1000", "SESSION", &s(id)]);
    c.cmd(&["LOCK.READ", "r", "b", "30000"]);
    let dump = c.cmd(&["DUMP", "r"]);
    let payload = dump.bulk().to_vec();
    for (conn, key) in [(&mut c, "copy"), (&mut o, "r")] {
        let r = conn.cmdv(&[
            b"RESTORE".to_vec(),
            key.as_bytes().to_vec(),
            b"0".to_vec(),
            payload.clone(),
        ]);
        assert!(r.is("OK"), "{r:?}");
        let info = conn.lock_info(key).expect("restored");
        let a = info.holder("a");
        assert!(
            a.ttl > 80_000 && a.ttl <= 90_000,
            "{key}: the session's deadline at the dump: {info:?}"
        );
        wait_until(
            Duration::from_secs(5),
            "the copy's TTL its latest lease",
            || conn.pttl(key) > 80_000,
        );
    }
    // The copy no longer follows the session: its CLOSE leaves it.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 1);
    assert_eq!(c.lock_info("copy").expect("own lease").holders.len(), 2);
    assert_eq!(c.lock_info("r").expect("b").holders.len(), 1);
}

#[test]
fn closing_a_session_with_a_hundred_thousand_holders_ends_them_all() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    let sid = s(id);
    const N: usize = 100_000;
    const BATCH: usize = 5_000;
    for start in (0..N).step_by(BATCH) {
        for i in start..start + BATCH {
            let key = format!("h{i}");
            encode_strs(
                c.out(),
                &["LOCK.ACQUIRE", &key, "o", "1000", "SESSION", &sid],
            );
        }
        c.flush().unwrap();
        for _ in 0..BATCH {
            assert!(c.read_reply().unwrap().int() > 0);
        }
    }
    assert_eq!(session_info(&mut c, id).expect("live").1, N as i64);
    // Waiters on a few of its keys.
    let mut waiters: Vec<Conn> = (0..5)
        .map(|i| {
            let mut w = srv.conn();
            w.send(&[
                "LOCK.ACQUIRE",
                &format!("h{}", i * 20_000),
                "w",
                "60000",
                "WAIT",
                "0",
            ])
            .unwrap();
            w
        })
        .collect();
    wait_until(Duration::from_secs(10), "they wait", || {
        c.info_field("lock", "lock_waiters") == "5"
    });
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &sid]).int(), N as i64);
    // Ended for every command at once.
    assert!(c.lock_info("h77777").is_none());
    assert!(c.cmd(&["LOCK.ACQUIRE", "h88888", "z", "600000"]).int() > 0);
    for w in waiters.iter_mut() {
        w.set_timeout(Duration::from_secs(60));
        assert!(w.read_reply().unwrap().int() > 0, "a waiter granted");
    }
    wait_until(Duration::from_secs(120), "every key cleaned up", || {
        c.cmd(&["DBSIZE"]).int() == 6
    });
    assert!(c.cmd(&["PING"]).is("PONG"));
}

/// Kills every connection of the client named `name` but `keep`.
fn kill_client(c: &mut Conn, name: &str) -> i64 {
    let list = c.cmd(&["CLIENT", "LIST"]).text();
    let mut killed = 0;
    for line in list.lines() {
        if line.split(' ').any(|f| f == format!("name={name}")) {
            let id = line
                .split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .expect("an id");
            killed += c.cmd(&["CLIENT", "KILL", "ID", id]).as_int().unwrap_or(0);
        }
    }
    killed
}

/// A client holding 1,000 locks: with a session, its connections killed every
/// 100 ms for 10 s while it reconnects and keeps the session alive from the
/// new connection: none lost; the same with BIND loses them all at the
/// first kill.
#[test]
fn killed_connections_lose_nothing_on_a_session_and_everything_bound() {
    const LOCKS: usize = 1_000;
    let srv = Server::start();
    let mut admin = srv.conn();
    let port = srv.port;
    let connect = || {
        let mut c = Conn::connect(port);
        c.cmd(&["CLIENT", "SETNAME", "holder"]).ok();
        c
    };
    // The session: 5 s ttl, kept alive every 20 ms or so from whichever
    // connection the client has.
    let mut c = connect();
    let id = open(&mut c, 5_000);
    for i in 0..LOCKS {
        let key = format!("s{i}");
        encode_strs(
            c.out(),
            &["LOCK.ACQUIRE", &key, "me", "1000", "SESSION", &s(id)],
        );
    }
    c.flush().unwrap();
    for _ in 0..LOCKS {
        assert!(c.read_reply().unwrap().int() > 0);
    }
    // BIND: the same locks, bound to another connection of the client.
    let mut bound = connect();
    for i in 0..LOCKS {
        let key = format!("b{i}");
        encode_strs(bound.out(), &["LOCK.ACQUIRE", &key, "me", "60000", "BIND"]);
    }
    bound.flush().unwrap();
    for _ in 0..LOCKS {
        assert!(bound.read_reply().unwrap().int() > 0);
    }
    let killer = std::thread::spawn(move || {
        let start = Instant::now();
        let mut kills = 0;
        while start.elapsed() < Duration::from_secs(10) {
            sleep_ms(100);
            kills += kill_client(&mut admin, "holder");
        }
        kills
    });
    let start = Instant::now();
    let mut reconnects = 0;
    let mut first_kill_seen = false;
    let mut bound_after_first_kill = None;
    while start.elapsed() < Duration::from_secs(10) {
        match c.try_cmd(&["LOCK.SESSION", "KEEPALIVE", &s(id), "5000"]) {
            Ok(r) if r.as_int() == Some(1) => {}
            Ok(r) => panic!("the session ended: {r:?}"),
            Err(_) => {
                reconnects += 1;
                c = connect();
                if !first_kill_seen {
                    first_kill_seen = true;
                    let mut look = Conn::connect(port);
                    wait_until(Duration::from_secs(5), "the bound locks freed", || {
                        look.cmd(&["EXISTS", "b0"]).int() == 0
                    });
                    let left = (0..LOCKS)
                        .filter(|i| look.lock_info(format!("b{i}")).is_some())
                        .count();
                    bound_after_first_kill = Some(left);
                }
            }
        }
        sleep_ms(20);
    }
    let kills = killer.join().unwrap();
    assert!(kills >= 10, "the connections were killed ({kills})");
    assert!(reconnects >= 5, "the client reconnected ({reconnects})");
    assert_eq!(
        bound_after_first_kill,
        Some(0),
        "BIND lost every lock at the first kill"
    );
    let mut c = Conn::connect(port);
    let held = (0..LOCKS)
        .filter(|i| {
            c.lock_info(format!("s{i}"))
                .is_some_and(|info| info.holders.iter().any(|h| h.owner == b"me"))
        })
        .count();
    assert_eq!(held, LOCKS, "a session lost nothing");
    assert_eq!(session_info(&mut c, id).expect("live").1, LOCKS as i64);
}

/// docs/commands.md's LOCK.SESSION example, replayed through redis-cli.
#[test]
fn the_docs_session_example_runs() {
    let doc = markdown("docs/commands.md");
    let heading = "## LOCK.SESSION OPEN|KEEPALIVE|CLOSE|INFO";
    let section = section(&doc, heading);
    let blocks = fenced_blocks(&[(heading, section)], "");
    assert!(!blocks.is_empty(), "{heading}: no example");
    for (_, block) in blocks {
        replay_cli_transcript(&block);
    }
}

/// A session's holder count follows its holders wherever they go: RENAME
/// and MOVE carry them (its end still finds them), DEL and FLUSHDB take
/// them away, SWAPDB moves them with their database.
#[test]
fn the_holder_count_follows_rename_move_del_flush_and_swapdb() {
    let srv = Server::start();
    let mut c = srv.conn();
    let id = open(&mut c, 600_000);
    for key in ["a", "b", "c", "d"] {
        assert!(
            c.cmd(&["LOCK.ACQUIRE", key, "o", "1000", "SESSION", &s(id)])
                .int()
                > 0
        );
    }
    assert_eq!(c.cmd(&["RENAME", "a", "a2"]).str(), "OK");
    assert_eq!(c.cmd(&["MOVE", "b", "1"]).int(), 1);
    assert_eq!(c.cmd(&["DEL", "c"]).int(), 1);
    assert_eq!(session_info(&mut c, id).expect("live").1, 3);
    c.cmd(&["SWAPDB", "0", "1"]).ok();
    assert_eq!(session_info(&mut c, id).expect("live").1, 3);
    // db 0 now holds b; db 1 holds a2 and d.
    c.cmd(&["SELECT", "1"]).ok();
    c.cmd(&["FLUSHDB"]).ok();
    assert_eq!(session_info(&mut c, id).expect("live").1, 1);
    c.cmd(&["SELECT", "0"]).ok();
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &s(id)]).int(), 1);
    wait_until(
        Duration::from_secs(5),
        "b cleaned up where it is now",
        || c.cmd(&["EXISTS", "b"]).int() == 0,
    );
}
