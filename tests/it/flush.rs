//! FLUSHDB, FLUSHALL and SWAPDB with many bound holders and a session's
//! many holders (issue 38 item 1, docs/design.md "What the module hears",
//! databases' homes): the module's part is O(1) at the event, and the
//! replies right after it are exact (`LOCK.KEEPALIVE`'s count,
//! `LOCK.SESSION INFO`, `INFO lock`); new grants on the same names work;
//! `DEBUG RELOAD` after a flush brings back nothing. And a bound holder
//! removed by other means (DEL, expiry, the value a RENAME replaced) is
//! not counted by the connection's next `LOCK.KEEPALIVE`.

use crate::common::*;
use std::time::Duration;

#[track_caller]
fn token(r: &Reply) -> i64 {
    let t = r.clone().int();
    assert!(t > 0, "a token is a positive integer, got {r:?}");
    t
}

fn s(n: i64) -> String {
    n.to_string()
}

/// `n` locks `f:<i>` on `c`'s database, with `extra` after the ttl
/// (`BIND`, `SESSION id`), pipelined.
fn grant_many(c: &mut Conn, n: usize, extra: &[&str]) {
    const BATCH: usize = 5_000;
    let mut done = 0;
    while done < n {
        let upto = (done + BATCH).min(n);
        for i in done..upto {
            let key = format!("f:{i}");
            let mut args: Vec<&[u8]> = vec![b"LOCK.ACQUIRE", key.as_bytes(), b"o", b"600000"];
            args.extend(extra.iter().map(|a| a.as_bytes()));
            c.push(&args);
        }
        c.flush().unwrap();
        for _ in done..upto {
            token(&c.read_reply().unwrap());
        }
        done = upto;
    }
}

#[track_caller]
fn info_field(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .unwrap_or_else(|_| panic!("lock_{field} is an integer"))
}

fn open_session(c: &mut Conn) -> i64 {
    let id = c.cmd(&["LOCK.SESSION", "OPEN", "600000"]).int();
    assert!(id > 0);
    id
}

/// `LOCK.SESSION INFO id`'s holder count (`None`: no such session).
fn session_holders(c: &mut Conn, id: i64) -> Option<i64> {
    let r = c.cmd(&["LOCK.SESSION", "INFO", &s(id)]);
    if r.is_nil() {
        return None;
    }
    let pairs = r.pairs();
    assert_eq!(pairs[1].0, "holders", "{r:?}");
    Some(pairs[1].1.int())
}

#[test]
fn a_bound_holder_removed_by_del_expiry_or_a_rename_over_it_is_not_counted_by_keepalive() {
    let server = Server::start();
    let mut c = server.conn();
    let mut other = server.conn();
    let sid = open_session(&mut other);
    // Bound holders following the connection's lease, and bound holders
    // following a session.
    for key in ["lease-del", "lease-exp", "lease-over"] {
        token(&c.cmd(&["LOCK.ACQUIRE", key, "o", "600000", "BIND"]));
    }
    for key in ["sess-del", "sess-exp", "sess-over"] {
        token(&c.cmd(&[
            "LOCK.ACQUIRE",
            key,
            "o",
            "600000",
            "SESSION",
            &s(sid),
            "BIND",
        ]));
    }
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 6);
    assert_eq!(info_field(&mut other, "bound_holders"), 6);

    other.cmd(&["DEL", "lease-del", "sess-del"]).int();
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 4);
    assert_eq!(session_holders(&mut other, sid), Some(2));

    other.cmd(&["SET", "plain", "v"]).ok();
    other.cmd(&["SET", "plain2", "v"]).ok();
    other.cmd(&["RENAME", "plain", "lease-over"]).ok();
    other.cmd(&["RENAME", "plain2", "sess-over"]).ok();
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 2);
    assert_eq!(session_holders(&mut other, sid), Some(1));

    // Redis's expiry: a TTL set and run out before the module's timer
    // looks (it would take the TTL back off: a follower's key has none),
    // the keys expired by the read in the same pipeline.
    other.push(&[b"PEXPIRE", b"lease-exp", b"1"]);
    other.push(&[b"PEXPIRE", b"sess-exp", b"1"]);
    other.push(&[b"DEBUG", b"SLEEP", b"0.02"]);
    other.push(&[b"EXISTS", b"lease-exp", b"sess-exp"]);
    other.flush().unwrap();
    for _ in 0..3 {
        other.read_reply().unwrap();
    }
    assert_eq!(other.read_reply().unwrap().int(), 0, "expired");
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 0);
    assert_eq!(session_holders(&mut other, sid), Some(0));
    assert_eq!(info_field(&mut other, "bound_holders"), 0);

    // A new bound grant on a name counts once.
    token(&c.cmd(&[
        "LOCK.ACQUIRE",
        "sess-del",
        "o",
        "600000",
        "SESSION",
        &s(sid),
        "BIND",
    ]));
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 1);
    assert_eq!(info_field(&mut other, "bound_holders"), 1);
}

/// `LOCK.KEEPALIVE`'s count on `c`.
fn keepalive(c: &mut Conn) -> i64 {
    c.cmd(&["LOCK.KEEPALIVE", "600000"]).int()
}

#[test]
fn flushdb_swapdb_and_flushall_with_100000_bound_holders_answer_exactly_at_once() {
    const N: usize = 100_000;
    let server = Server::start();
    let mut c = server.conn();
    c.set_timeout(Duration::from_secs(120));
    let mut other = server.conn();
    other.set_timeout(Duration::from_secs(120));
    grant_many(&mut c, N, &["BIND"]);
    c.cmd(&["SELECT", "1"]).ok();
    for i in 0..10 {
        token(&c.cmd(&["LOCK.ACQUIRE", &format!("g:{i}"), "o", "600000", "BIND"]));
    }
    c.cmd(&["SELECT", "0"]).ok();
    assert_eq!(keepalive(&mut c), N as i64 + 10);
    assert_eq!(info_field(&mut other, "bound_holders"), N as i64 + 10);

    // FLUSHDB of database 0: its 100,000 bound holders are gone for every
    // answer at once; database 1's stay.
    other.cmd(&["FLUSHDB"]).ok();
    assert_eq!(info_field(&mut other, "bound_holders"), 10);
    assert_eq!(keepalive(&mut c), 10);
    assert!(c.lock_info("f:0").is_none());
    // The same names are free for new grants, bound or not.
    let t = token(&c.cmd(&["LOCK.ACQUIRE", "f:0", "o", "600000", "BIND"]));
    token(&other.cmd(&["LOCK.ACQUIRE", "f:1", "p", "600000"]));
    assert_eq!(keepalive(&mut c), 11);
    assert_eq!(info_field(&mut other, "bound_holders"), 11);
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", "f:0", "o", "TOKEN", &s(t)]).int(),
        1
    );
    assert_eq!(keepalive(&mut c), 10);
    token(&c.cmd(&["LOCK.ACQUIRE", "f:0", "o", "600000", "BIND"]));

    // SWAPDB: the bindings follow their keys.
    other.cmd(&["SWAPDB", "0", "1"]).ok();
    assert_eq!(keepalive(&mut c), 11);
    let g = c.lock_info("g:0").expect("g:0 is in database 0 now");
    let g_token = g.holders[0].token;
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", "g:0", "o", "TOKEN", &s(g_token)])
            .int(),
        1,
        "released where SWAPDB put it"
    );
    assert_eq!(keepalive(&mut c), 10);
    // The bound holder of f:0 is in database 1 now: a FLUSHDB of 0 leaves it.
    other.cmd(&["FLUSHDB"]).ok();
    assert_eq!(keepalive(&mut c), 1);
    c.cmd(&["SELECT", "1"]).ok();
    assert!(c.lock_info("f:0").is_some());
    c.cmd(&["SELECT", "0"]).ok();

    // A connection that closes after a flush: only its live holder is
    // released.
    let mut d = server.conn();
    d.set_timeout(Duration::from_secs(120));
    grant_many(&mut d, N, &["BIND"]);
    other.cmd(&["FLUSHDB"]).ok();
    assert_eq!(keepalive(&mut d), 0);
    assert_eq!(info_field(&mut other, "bound_holders"), 1);
    drop(d);

    // FLUSHALL, then DEBUG RELOAD: nothing comes back.
    grant_many(&mut c, N, &["BIND"]);
    assert_eq!(keepalive(&mut c), N as i64 + 1);
    other.cmd(&["FLUSHALL"]).ok();
    assert_eq!(keepalive(&mut c), 0);
    assert_eq!(info_field(&mut other, "bound_holders"), 0);
    other.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(keepalive(&mut c), 0);
    assert_eq!(other.cmd(&["DBSIZE"]).int(), 0);
    token(&c.cmd(&["LOCK.ACQUIRE", "f:7", "o", "600000", "BIND"]));
    assert_eq!(keepalive(&mut c), 1);
    // And a DEBUG RELOAD alone keeps the bindings (parked and back).
    other.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(keepalive(&mut c), 1);
    assert_eq!(info_field(&mut other, "bound_holders"), 1);
    // What the flushes left is dropped over the next turns.
    let start = std::time::Instant::now();
    while info_field(&mut other, "bindings_memory") > 1_000
        && start.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(keepalive(&mut c), 1);
}

#[test]
fn a_session_with_100000_holders_through_swapdb_flushdb_and_flushall() {
    const N: usize = 100_000;
    let server = Server::start();
    let mut c = server.conn();
    c.set_timeout(Duration::from_secs(120));
    let sid = open_session(&mut c);
    let session = s(sid);
    grant_many(&mut c, N, &["SESSION", &session]);
    c.cmd(&["SELECT", "1"]).ok();
    for i in 0..5 {
        token(&c.cmd(&[
            "LOCK.ACQUIRE",
            &format!("g:{i}"),
            "o",
            "600000",
            "SESSION",
            &session,
        ]));
    }
    assert_eq!(session_holders(&mut c, sid), Some(N as i64 + 5));

    // SWAPDB: database 1 holds the 100,000 now; counts unchanged.
    c.cmd(&["SWAPDB", "0", "1"]).ok();
    assert_eq!(session_holders(&mut c, sid), Some(N as i64 + 5));
    assert!(c.lock_info("f:0").is_some(), "f:0 is in database 1 now");
    assert!(c.lock_info("g:0").is_none());

    // FLUSHDB of database 1: the session's count drops at once.
    c.cmd(&["FLUSHDB"]).ok();
    assert_eq!(session_holders(&mut c, sid), Some(5));
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", &session, "600000"])
            .int(),
        1
    );
    token(&c.cmd(&["LOCK.ACQUIRE", "f:0", "o", "600000", "SESSION", &session]));
    assert_eq!(session_holders(&mut c, sid), Some(6));

    // The session's end releases exactly its live holders.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &session]).int(), 6);
    let start = std::time::Instant::now();
    let mut left = -1;
    while start.elapsed() < Duration::from_secs(60) {
        c.cmd(&["SELECT", "0"]).ok();
        let zero = c.cmd(&["DBSIZE"]).int();
        c.cmd(&["SELECT", "1"]).ok();
        left = zero + c.cmd(&["DBSIZE"]).int();
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(left, 0, "the ended session's keys are released");

    // FLUSHALL, then DEBUG RELOAD: the session stays open with none.
    let sid = open_session(&mut c);
    let session = s(sid);
    c.cmd(&["SELECT", "0"]).ok();
    grant_many(&mut c, N, &["SESSION", &session]);
    assert_eq!(session_holders(&mut c, sid), Some(N as i64));
    c.cmd(&["FLUSHALL"]).ok();
    assert_eq!(session_holders(&mut c, sid), Some(0));
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(session_holders(&mut c, sid), Some(0));
    token(&c.cmd(&["LOCK.ACQUIRE", "f:9", "o", "600000", "SESSION", &session]));
    assert_eq!(session_holders(&mut c, sid), Some(1));
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", &session]).int(), 1);
}

#[test]
fn the_timers_plans_follow_swapdb_and_go_with_flushdb_at_once() {
    const N: usize = 2_000;
    let server = Server::start();
    let mut c = server.conn();
    c.set_timeout(Duration::from_secs(60));
    // Shared locks whose readers end apart: each planned for a visit.
    for i in 0..N {
        let key = format!("r:{i}");
        c.push(&[b"LOCK.READ", key.as_bytes(), b"a", b"600000"]);
        c.push(&[b"LOCK.READ", key.as_bytes(), b"b", b"500000"]);
    }
    c.flush().unwrap();
    for _ in 0..2 * N {
        token(&c.read_reply().unwrap());
    }
    token(&c.cmd(&["LOCK.READ", "short", "a", "600000"]));
    token(&c.cmd(&["LOCK.READ", "short", "b", "300"]));
    let planned = info_field(&mut c, "timer_keys");
    assert_eq!(planned, N as i64 + 1);

    // SWAPDB: the plans follow their keys; the short reader ends in
    // database 1, where its key is now.
    c.cmd(&["SWAPDB", "0", "1"]).ok();
    assert_eq!(info_field(&mut c, "timer_keys"), planned);
    c.cmd(&["SELECT", "1"]).ok();
    let start = std::time::Instant::now();
    while c.lock_info("short").map(|i| i.holders.len()) != Some(1)
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let short = c.lock_info("short").expect("short is in database 1");
    assert_eq!(short.holders.len(), 1, "the reader of 300 ms ended");
    assert_eq!(short.holders[0].owner, b"a");

    // FLUSHDB of database 1: its plans are gone from the count at once.
    c.cmd(&["FLUSHDB"]).ok();
    assert_eq!(info_field(&mut c, "timer_keys"), 0);
    // New plans on the same names count afresh.
    token(&c.cmd(&["LOCK.READ", "r:0", "a", "600000"]));
    token(&c.cmd(&["LOCK.READ", "r:0", "b", "300"]));
    assert_eq!(info_field(&mut c, "timer_keys"), 1);
    let start = std::time::Instant::now();
    while c.lock_info("r:0").map(|i| i.holders.len()) != Some(1)
        && start.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(c.lock_info("r:0").map(|i| i.holders.len()), Some(1));
}
