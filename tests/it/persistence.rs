//! Durability: DEBUG RELOAD, RDB save + restart, AOF (with and without rewrite,
//! with and without the RDB preamble), DUMP/RESTORE, and fencing tokens across
//! restarts.

use crate::common::*;
use std::path::Path;
use std::time::{Duration, Instant};

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

/// The keys [`build_state`] creates that hold a lock afterwards.
const KEYS: [&[u8]; 6] = [b"x", b"r", b"s", b"bin\0key", b"one", b"sem"];

/// Builds exclusive, reentrant, shared and binary-named locks, plus released and
/// expired ones. Returns every token issued (released locks' included).
fn build_state(c: &mut Conn) -> Vec<i64> {
    let mut tokens = Vec::new();
    // A released lock: its token must stay below every later one.
    tokens.push(token(c.acquire("gone", "a", 100_000)));
    assert_eq!(c.release("gone", "a").int(), 1);
    // Exclusive, renewed.
    tokens.push(token(c.acquire("x", "a", 60_000)));
    assert_eq!(c.renew("x", "a", 80_000).int(), 1);
    // Reentrant: 3 holds, one released -> 2.
    for _ in 0..3 {
        tokens.push(token(c.racquire("r", "a", 70_000)));
    }
    assert_eq!(c.release("r", "a").int(), 0);
    // Shared: r1 with 2 holds, r2 with 1, r3 released.
    tokens.push(token(c.read("s", "r1", 50_000)));
    tokens.push(token(c.read("s", "r1", 50_000)));
    tokens.push(token(c.read("s", "r2", 90_000)));
    tokens.push(token(c.read("s", "r3", 90_000)));
    assert_eq!(c.release("s", "r3").int(), 1);
    // Binary key and owner.
    tokens.push(token(c.cmd(&[
        b"LOCK.RACQUIRE".as_slice(),
        b"bin\0key",
        b"own\0er\xff",
        b"40000",
    ])));
    // A lock with no Redis TTL on its key (PERSIST): its deadline still holds.
    tokens.push(token(c.acquire("one", "a", 100_000)));
    assert_eq!(c.cmd(&["PERSIST", "one"]).int(), 1);
    // A semaphore of limit 3: two permits with their own leases, one released.
    for (owner, ttl) in [("p1", "60000"), ("p2", "90000"), ("p3", "90000")] {
        tokens.push(token(c.cmd(&["LOCK.SEMAPHORE", "sem", "3", owner, ttl])));
    }
    assert_eq!(c.release("sem", "p3").int(), 1);
    // An expired one.
    tokens.push(token(c.acquire("expired", "a", 30)));
    sleep_ms(80);
    tokens
}

type Snapshot = Vec<(Vec<u8>, Option<LockInfo>, i64)>;

fn snapshot(c: &mut Conn, keys: &[&[u8]]) -> Snapshot {
    keys.iter()
        .map(|k| (k.to_vec(), c.lock_info(k), c.pttl(k)))
        .collect()
}

/// Asserts that `after` has the same holders, holds and tokens as `before`, and
/// the same absolute deadlines: every remaining time went down by about the
/// time elapsed (`elapsed` plus slack), never up.
#[track_caller]
fn assert_same_state(before: &Snapshot, after: &Snapshot, elapsed: Duration, what: &str) {
    let max_drop = elapsed.as_millis() as i64 + 1_000;
    for ((k, b, bp), (_, a, ap)) in before.iter().zip(after) {
        let key = show(k);
        match (b, a) {
            (Some(b), Some(a)) => {
                assert_eq!(a.stable(), b.stable(), "{what}: key {key}");
                for (x, y) in b.holders.iter().zip(&a.holders) {
                    assert!(
                        y.ttl <= x.ttl + 5 && y.ttl >= x.ttl - max_drop,
                        "{what}: key {key}: ttl-ms-left {} -> {} (elapsed {elapsed:?}): \
                         the absolute deadline was not kept",
                        x.ttl,
                        y.ttl
                    );
                }
            }
            (None, None) => {}
            _ => panic!("{what}: key {key}: {b:?} -> {a:?}"),
        }
        if *bp == -2 {
            assert_eq!(*ap, -2, "{what}: key {key}: PTTL");
        } else if *bp == -1 {
            // A PERSISTed key: it may come back without a TTL, or with its
            // latest deadline as its TTL (what the contract says a key's TTL is).
            let latest = a
                .as_ref()
                .and_then(|a| a.holders.iter().map(|h| h.ttl).max());
            let ok = *ap == -1 || latest.map(|l| (ap - l).abs() <= 100).unwrap_or(false);
            assert!(
                ok,
                "{what}: key {key}: PTTL -1 -> {ap}, latest deadline in {latest:?} ms"
            );
        } else {
            assert!(
                *ap <= bp + 5 && *ap >= bp - max_drop,
                "{what}: key {key}: PTTL {bp} -> {ap} (elapsed {elapsed:?})"
            );
        }
    }
}

fn all_keys() -> Vec<&'static [u8]> {
    let mut k: Vec<&[u8]> = KEYS.to_vec();
    k.push(b"gone");
    k.push(b"expired");
    k
}

/// Checks the state after a restore, then that tokens go on above `tokens`.
fn check_restored(c: &mut Conn, before: &Snapshot, tokens: &[i64], elapsed: Duration, what: &str) {
    let after = snapshot(c, &all_keys());
    assert_same_state(before, &after, elapsed, what);
    // The shapes are what build_state made.
    let r = c.lock_info("r").expect("r held");
    assert_eq!(r.holder("a").holds, 2, "{what}");
    let s = c.lock_info("s").expect("s held");
    assert_eq!(s.mode, "shared", "{what}");
    assert_eq!(s.holders.len(), 2, "{what}");
    assert_eq!(s.holder("r1").holds, 2, "{what}");
    let sem = c.lock_info("sem").expect("sem held");
    assert_eq!(
        (sem.mode.as_str(), sem.limit),
        ("semaphore", Some(3)),
        "{what}"
    );
    assert_eq!(sem.holders.len(), 2, "{what}");
    assert!(c.lock_info("gone").is_none(), "{what}");
    assert!(c.lock_info("expired").is_none(), "{what}");
    // The limit survived: a third permit is free, a fourth is not.
    token(c.cmd(&["LOCK.SEMAPHORE", "sem", "3", "p4", "10000"]));
    assert!(
        c.cmd(&["LOCK.SEMAPHORE", "sem", "3", "p5", "10000"])
            .is_nil(),
        "{what}"
    );
    assert!(
        c.cmd(&["LOCK.SEMAPHORE", "sem", "4", "p5", "10000"])
            .is_err(),
        "{what}"
    );
    assert_eq!(c.release("sem", "p4").int(), 1, "{what}");
    // The restored state works: refusals, releases, re-entry.
    assert!(c.acquire("x", "b", 10_000).is_nil(), "{what}");
    assert!(c.acquire("s", "w", 10_000).is_nil(), "{what}");
    assert_eq!(c.release("r", "a").int(), 0, "{what}");
    assert_eq!(c.release("r", "a").int(), 1, "{what}");
    // New tokens are above every token issued before.
    let max = *tokens.iter().max().expect("tokens");
    let t1 = token(c.acquire("gone", "b", 10_000));
    let t2 = token(c.acquire("expired", "b", 10_000));
    let t3 = token(c.read("fresh", "z", 10_000));
    assert!(
        t1 > max && t2 > t1 && t3 > t2,
        "{what}: {t1}, {t2}, {t3} after max {max}"
    );
}

#[test]
fn debug_reload_keeps_every_holder() {
    let s = Server::start();
    let mut c = s.conn();
    let tokens = build_state(&mut c);
    let before = snapshot(&mut c, &all_keys());
    let start = Instant::now();
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    check_restored(&mut c, &before, &tokens, start.elapsed(), "DEBUG RELOAD");
}

#[test]
fn save_and_restart_keeps_every_holder() {
    let mut s = Server::start();
    let mut c = s.conn();
    let tokens = build_state(&mut c);
    let before = snapshot(&mut c, &all_keys());
    let start = Instant::now();
    c.cmd(&["SAVE"]).ok();
    s.kill9();
    sleep_ms(200);
    s.restart();
    let mut c = s.conn();
    check_restored(&mut c, &before, &tokens, start.elapsed(), "SAVE + restart");
}

#[test]
fn shutdown_save_and_restart_keeps_every_holder() {
    let mut s = Server::start();
    let mut c = s.conn();
    let tokens = build_state(&mut c);
    let before = snapshot(&mut c, &all_keys());
    let start = Instant::now();
    drop(c);
    s.shutdown_save();
    s.restart();
    let mut c = s.conn();
    check_restored(
        &mut c,
        &before,
        &tokens,
        start.elapsed(),
        "SHUTDOWN SAVE + restart",
    );
}

#[test]
fn a_deadline_that_passed_while_down_is_not_granted_anew() {
    let mut s = Server::start();
    let mut c = s.conn();
    let mut tokens = vec![
        token(c.acquire("short", "a", 300)),
        token(c.racquire("short_p", "a", 300)),
        token(c.read("sh", "r1", 300)),
        token(c.read("sh", "r2", 100_000)),
        token(c.acquire("long", "a", 100_000)),
    ];
    // No Redis TTL on this key: only the module's deadline can free it.
    assert_eq!(c.cmd(&["PERSIST", "short_p"]).int(), 1);
    c.cmd(&["SAVE"]).ok();
    s.kill9();
    sleep_ms(500);
    s.restart();
    let mut c = s.conn();
    assert!(c.lock_info("short").is_none());
    assert!(c.lock_info("short_p").is_none());
    assert!(c.release("short", "a").is_nil());
    assert!(c.release("short_p", "a").is_nil());
    assert_eq!(c.renew("short_p", "a", 10_000).int(), 0);
    let sh = c.lock_info("sh").expect("r2 still reads");
    assert_eq!(sh.holders.len(), 1, "{sh:?}");
    assert_eq!(sh.holder("r2").token, tokens[3]);
    assert_eq!(
        c.lock_info("long").expect("long held").holder("a").token,
        tokens[4]
    );
    let max = *tokens.iter().max().unwrap_or(&0);
    let t = token(c.acquire("short", "b", 10_000));
    let t2 = token(c.acquire("short_p", "b", 10_000));
    assert!(t > max && t2 > t, "{t}, {t2} after {max}");
    tokens.push(t2);
}

fn aof_server(preamble: &str) -> Server {
    Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config(&format!("aof-use-rdb-preamble {preamble}"))
        .start()
}

#[test]
fn aof_and_kill9_restores_every_holder() {
    let mut s = aof_server("yes");
    let mut c = s.conn();
    let tokens = build_state(&mut c);
    let before = snapshot(&mut c, &all_keys());
    let start = Instant::now();
    s.kill9();
    // Down for a while: an AOF replaying a relative ttl would show longer leases.
    sleep_ms(300);
    s.restart();
    let mut c = s.conn();
    check_restored(&mut c, &before, &tokens, start.elapsed(), "AOF + SIGKILL");
}

/// Waits until no AOF rewrite is running or scheduled.
fn wait_rewrite_done(c: &mut Conn) {
    wait_until(Duration::from_secs(20), "the AOF rewrite to finish", || {
        let info = c.info("persistence");
        info_get(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_get(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
    });
}

fn rewrite_aof(c: &mut Conn) {
    wait_rewrite_done(c);
    let r = c.cmd(&["BGREWRITEAOF"]);
    assert!(matches!(r, Reply::Status(_)), "BGREWRITEAOF: {r:?}");
    wait_rewrite_done(c);
    let status = c.info_field("persistence", "aof_last_bgrewrite_status");
    assert_eq!(status, "ok", "the AOF rewrite failed");
}

fn bgrewriteaof_then_restart(preamble: &str) {
    let mut s = aof_server(preamble);
    let mut c = s.conn();
    let mut tokens = build_state(&mut c);
    rewrite_aof(&mut c);
    // More changes after the rewrite go to the new incremental file.
    tokens.push(token(c.acquire("later", "a", 100_000)));
    assert_eq!(c.release("later", "a").int(), 1);
    let mut keys = all_keys();
    keys.push(b"later");
    let before = snapshot(&mut c, &keys);
    let start = Instant::now();
    s.kill9();
    sleep_ms(300);
    s.restart();
    let mut c = s.conn();
    let what = format!("BGREWRITEAOF (aof-use-rdb-preamble {preamble}) + restart");
    let after = snapshot(&mut c, &keys);
    assert_same_state(&before, &after, start.elapsed(), &what);
    check_restored(&mut c, &before, &tokens, start.elapsed(), &what);
    // A second rewrite of the restored state, and a second restart.
    rewrite_aof(&mut c);
    let before = snapshot(&mut c, &[b"x", b"s", b"bin\0key", b"one"]);
    let start = Instant::now();
    s.kill9();
    s.restart();
    let mut c = s.conn();
    let after = snapshot(&mut c, &[b"x", b"s", b"bin\0key", b"one"]);
    assert_same_state(&before, &after, start.elapsed(), &format!("{what}, twice"));
}

#[test]
fn bgrewriteaof_with_rdb_preamble_restores_every_holder() {
    bgrewriteaof_then_restart("yes");
}

#[test]
fn bgrewriteaof_without_rdb_preamble_restores_every_holder() {
    bgrewriteaof_then_restart("no");
}

/// Issues tokens, leaves no lock key, persists with `persist`, restarts and
/// checks that the next token is above all of them.
fn tokens_survive_without_keys(mut s: Server, persist: impl Fn(&mut Conn), what: &str) {
    let mut c = s.conn();
    let mut max = 0;
    for i in 0..5 {
        let key = format!("k{i}");
        max = max.max(token(c.acquire(&key, "a", 100_000)));
        max = max.max(token(c.read("shared", &format!("r{i}"), 100_000)));
        assert_eq!(c.release(&key, "a").int(), 1);
    }
    for i in 0..5 {
        assert_eq!(c.release("shared", &format!("r{i}")).int(), 1);
    }
    max = max.max(token(c.acquire("expiring", "a", 20)));
    sleep_ms(60);
    c.cmd(&["DEL", "expiring"]);
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 0, "{what}: no key left");
    persist(&mut c);
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 0, "{what}");
    let t = token(c.acquire("k0", "b", 10_000));
    assert!(
        t > max,
        "{what}: token {t} after restart, {max} issued before"
    );
}

#[test]
fn tokens_after_rdb_restart_are_above_every_earlier_token() {
    tokens_survive_without_keys(
        Server::start(),
        |c| {
            c.cmd(&["SAVE"]).ok();
        },
        "RDB with no lock key",
    );
}

#[test]
fn tokens_after_aof_restart_are_above_every_earlier_token() {
    tokens_survive_without_keys(aof_server("yes"), |_| {}, "AOF (no rewrite)");
    tokens_survive_without_keys(
        aof_server("yes"),
        rewrite_aof,
        "AOF rewritten, preamble yes",
    );
    tokens_survive_without_keys(aof_server("no"), rewrite_aof, "AOF rewritten, preamble no");
}

#[test]
fn tokens_after_debug_reload_are_above_every_earlier_token() {
    let s = Server::start();
    let mut c = s.conn();
    let t1 = token(c.acquire("k", "a", 100_000));
    assert_eq!(c.release("k", "a").int(), 1);
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    let t2 = token(c.acquire("k", "a", 100_000));
    assert!(t2 > t1, "{t2} after {t1}");
}

fn dump(c: &mut Conn, key: &str) -> Vec<u8> {
    match c.cmd(&["DUMP", key]) {
        Reply::Bulk(b) => b,
        other => panic!("DUMP {key}: {other:?}"),
    }
}

#[test]
fn dump_and_restore_keep_the_state() {
    let s = Server::start();
    let mut c = s.conn();
    build_state(&mut c);
    for key in ["x", "r", "s", "one", "sem"] {
        let payload = dump(&mut c, key);
        let before = c.lock_info(key).expect("held");
        // Into a new key.
        let copy = format!("{key}-copy");
        c.cmd(&[b"RESTORE".as_slice(), copy.as_bytes(), b"0", &payload])
            .ok();
        let restored = c.lock_info(&copy).expect("restored lock");
        assert_eq!(restored.stable(), before.stable(), "RESTORE {copy}");
        for (b, a) in before.holders.iter().zip(&restored.holders) {
            assert!(
                a.ttl <= b.ttl + 5 && a.ttl >= b.ttl - 2_000,
                "{before:?} -> {restored:?}"
            );
        }
        assert_eq!(c.type_of(&copy), TYPE_NAME);
        // Over the original, after DEL.
        c.cmd(&["DEL", key]).int();
        c.cmd(&[b"RESTORE".as_slice(), key.as_bytes(), b"0", &payload])
            .ok();
        let again = c.lock_info(key).expect("restored lock");
        assert_eq!(again.stable(), before.stable(), "RESTORE {key}");
        // REPLACE over an existing key.
        c.cmd(&[
            b"RESTORE".as_slice(),
            key.as_bytes(),
            b"0",
            &payload,
            b"REPLACE",
        ])
        .ok();
        assert_eq!(
            c.lock_info(key).expect("restored").stable(),
            before.stable()
        );
    }
    // The restored lock works.
    assert!(c.acquire("x-copy", "b", 10_000).is_nil());
    assert_eq!(c.release("r-copy", "a").int(), 0);
    assert_eq!(c.release("r-copy", "a").int(), 1);
    // A payload whose deadline has passed restores a free lock.
    token(c.acquire("short", "a", 300));
    let payload = dump(&mut c, "short");
    sleep_ms(450);
    let r = c.cmd(&[b"RESTORE".as_slice(), b"short2", b"0", &payload]);
    assert!(
        matches!(&r, Reply::Status(s) if s == "OK") || r.is_err(),
        "RESTORE of an expired lock: {r:?}"
    );
    assert!(c.lock_info("short2").is_none());
    token(c.acquire("short2", "b", 10_000));
    c.ping();
}

/// The payload of `key`'s lock as encoding `encver` (1 or 2, 0.1 and 0.2:
/// field by field) would carry it, from its `LOCK.INFO` (deadlines from the
/// ttls left).
fn old_payload(c: &mut Conn, key: &str, encver: u16) -> Vec<u8> {
    let info = c.lock_info(key).expect("held");
    let payload = dump(c, key);
    let (body, version) = dump_parts(&payload);
    let now = now_ms();
    let mode = match info.mode.as_str() {
        "exclusive" => 0,
        "shared" => 1,
        _ => 2,
    };
    let holders: Vec<OldHolder> = info
        .holders
        .iter()
        .map(|h| OldHolder {
            owner: h.owner.clone(),
            holds: h.holds as u64,
            token: h.token as u64,
            deadline: (now + h.ttl) as u64,
        })
        .collect();
    let limit = info.limit.map(|l| l as u64);
    let body = old_lock_body(body, encver, mode, limit, &holders);
    dump_with_footer(&body, version)
}

/// Encoding 3 (0.3) saves the lock's block; what encodings 2 (0.2, with
/// semaphores) and 1 (0.1) wrote field by field still loads, and a
/// semaphore cannot be in version 1. (tests/fixtures/locks-v2.rdb, written
/// by 0.2 itself, loads too: `an_rdb_written_by_0_2_loads`.)
#[test]
fn encodings_1_and_2_still_load() {
    let s = Server::start();
    let mut c = s.conn();
    build_state(&mut c);
    for key in ["x", "r", "s", "bin\0key", "sem"] {
        for encver in [2, 1] {
            if key == "sem" && encver == 1 {
                continue;
            }
            let old = old_payload(&mut c, key, encver);
            assert_ne!(old, dump(&mut c, key), "{key}: this build writes version 3");
            let before = c.lock_info(key).expect("held");
            let restored = format!("{key}-v{encver}");
            c.cmd(&[b"RESTORE".as_slice(), restored.as_bytes(), b"0", &old])
                .ok();
            assert_same_lock(
                &c.lock_info(&restored),
                &Some(before),
                50,
                &format!("{key} from encoding {encver}"),
            );
        }
    }
    let v1 = old_payload(&mut c, "sem", 1);
    let r = c.cmd(&[b"RESTORE".as_slice(), b"sem1", b"0", &v1]);
    assert!(r.is_err(), "a semaphore in encoding version 1: {r:?}");
    assert!(c.lock_info("sem1").is_none());
    c.ping();
}

/// Checks that the server is alive and the key `t` (if it exists) answers.
fn still_alive(s: &mut Server, c: &mut Conn, what: &str) {
    assert!(s.is_running(), "redis-server died after {what}");
    c.ping();
    let r = c.cmd(&["LOCK.INFO", "t"]);
    assert!(
        r.is_nil() || matches!(r, Reply::Array(_)) || r.is_err(),
        "{what}: LOCK.INFO t answered {r:?}"
    );
}

/// RESTOREs `payload` into `t`: an error (true), or a lock that is sane and
/// answers commands (false); the server must survive either way.
fn restore_error_or_sane(s: &mut Server, c: &mut Conn, payload: &[u8], what: &str) -> bool {
    let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", payload, b"REPLACE"]);
    let refused = match r {
        Reply::Error(_) => {
            assert_eq!(
                c.cmd(&["EXISTS", "t"]).int(),
                0,
                "{what}: a refused RESTORE left a key"
            );
            true
        }
        Reply::Status(ref ok) if ok == "OK" => {
            let info = c.cmd(&["LOCK.INFO", "t"]);
            if let Some(i) = LockInfo::parse(&info) {
                for h in &i.holders {
                    assert!(!h.owner.is_empty(), "{what}: empty owner {i:?}");
                    assert!(h.holds >= 1, "{what}: holds {i:?}");
                    assert!(h.token >= 1, "{what}: token {i:?}");
                }
                if i.mode == "exclusive" {
                    assert!(i.holders.len() <= 1, "{what}: {i:?}");
                }
            }
            let _ = c.cmd(&["LOCK.ACQUIRE", "t", "probe", "1000"]);
            let _ = c.cmd(&["LOCK.READ", "t", "probe2", "1000"]);
            let _ = c.cmd(&["LOCK.RELEASE", "t", "owner-a"]);
            let _ = c.cmd(&["LOCK.RENEW", "t", "r1", "1000"]);
            let _ = c.cmd(&["DUMP", "t"]);
            c.cmd(&["DEL", "t"]);
            false
        }
        other => panic!("{what}: {other:?}"),
    };
    still_alive(s, c, what);
    refused
}

#[test]
fn restore_of_a_truncated_or_corrupted_payload_is_refused() {
    let mut s = Server::start();
    let mut c = s.conn();
    token(c.racquire("ex", "owner-a", 100_000));
    token(c.racquire("ex", "owner-a", 100_000));
    token(c.read("sh", "r1", 100_000));
    token(c.cmd(&[b"LOCK.READ".as_slice(), b"sh", b"r\0\xff2", b"100000"]));
    for key in ["ex", "sh"] {
        let payload = dump(&mut c, key);
        let (body, version) = dump_parts(&payload);
        // Sanity: our footer rebuild gives back the same payload.
        assert_eq!(dump_with_footer(body, version), payload, "crc64 footer");

        // A bad checksum: refused by Redis itself.
        let mut bad = payload.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &bad]);
        assert!(r.is_err(), "RESTORE with a bad checksum: {r:?}");

        // A truncated payload: cut from the end, as a client would truncate it.
        for cut in [1, 5, 10, 11, payload.len() / 2, payload.len() - 1] {
            let p = &payload[..payload.len() - cut];
            let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", p, b"REPLACE"]);
            let what = format!("RESTORE of {key}'s payload without its last {cut} bytes");
            assert!(r.is_err(), "{what}: {r:?}");
            still_alive(&mut s, &mut c, &what);
            assert_eq!(c.cmd(&["EXISTS", "t"]).int(), 0, "{what}");
        }

        // The module data truncated at every length, with a valid footer, so
        // that the module itself meets the short read. Redis reads on into the
        // footer's bytes, so a cut can happen to parse: then it must be a sane
        // lock; otherwise an error, never a crash.
        let mut refused = 0;
        for len in 0..body.len() {
            let p = dump_with_footer(&body[..len], version);
            let what = format!(
                "RESTORE of {key}'s payload truncated to {len}/{} bytes (footer fixed)",
                body.len()
            );
            if restore_error_or_sane(&mut s, &mut c, &p, &what) {
                refused += 1;
            }
        }
        eprintln!("{key}: {refused}/{} truncations refused", body.len());
        assert!(refused * 2 > body.len(), "most truncations are refused");

        // The module type's encoding version (the low 10 bits of the module id,
        // an RDB 64-bit length: 0x81 then 8 bytes big-endian, after the type
        // byte) set to one this build cannot know.
        assert_eq!(body[1], 0x81, "a module value: {}", show(body));
        let mut future = body.to_vec();
        future[9] |= 0xff;
        future[8] |= 0x03;
        let p = dump_with_footer(&future, version);
        let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &p, b"REPLACE"]);
        assert!(r.is_err(), "RESTORE of encoding version 1023: {r:?}");
        still_alive(&mut s, &mut c, "encoding version 1023");

        // Every byte of the module's data replaced by a few values: an error
        // or a valid lock, never a crash; a restored lock must then work.
        for i in 10..body.len() {
            for v in [
                0x00u8,
                0xff,
                0x01,
                0x80,
                body[i] ^ 0x01,
                body[i].wrapping_add(1),
            ] {
                if v == body[i] {
                    continue;
                }
                let mut corrupt = body.to_vec();
                corrupt[i] = v;
                let p = dump_with_footer(&corrupt, version);
                let what = format!("RESTORE of {key}'s payload with byte {i} set to {v:#04x}");
                restore_error_or_sane(&mut s, &mut c, &p, &what);
            }
        }
    }
    // And the server still saves and reloads what it has.
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(c.lock_info("ex").expect("ex").holder("owner-a").holds, 2);
}

#[test]
fn crc64_matches_redis_check_value() {
    // The check value in Redis's crc64.c self-test.
    assert_eq!(crc64_redis(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

/// The commands in an AOF file (RESP arrays of bulk strings).
fn aof_commands(data: &[u8]) -> Vec<Vec<Vec<u8>>> {
    fn line(data: &[u8], pos: &mut usize) -> Vec<u8> {
        let start = *pos;
        while *pos + 1 < data.len() && &data[*pos..*pos + 2] != b"\r\n" {
            *pos += 1;
        }
        let l = data[start..*pos].to_vec();
        *pos += 2;
        l
    }
    fn num(l: &[u8]) -> usize {
        std::str::from_utf8(&l[1..])
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad AOF line {:?}", show(l)))
    }
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let l = line(data, &mut pos);
        assert_eq!(
            l.first(),
            Some(&b'*'),
            "AOF command starts with *: {:?}",
            show(&l)
        );
        let n = num(&l);
        let mut args = Vec::with_capacity(n);
        for _ in 0..n {
            let l = line(data, &mut pos);
            assert_eq!(l.first(), Some(&b'$'), "AOF argument starts with $");
            let len = num(&l);
            args.push(data[pos..pos + len].to_vec());
            pos += len + 2;
        }
        out.push(args);
    }
    out
}

/// Every command in the AOF files of `s` whose names end with `suffix`.
fn aof_files(s: &Server, suffix: &str) -> Vec<Vec<Vec<u8>>> {
    let dir = s.dir.join("appendonlydir");
    let mut cmds = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("appendonlydir") {
        let path = entry.expect("dir entry").path();
        if path.to_string_lossy().ends_with(suffix) {
            let data = std::fs::read(&path).expect("read AOF");
            cmds.extend(aof_commands(&data));
        }
    }
    cmds
}

#[test]
fn the_aof_gets_effects_not_clock_dependent_commands() {
    // What the AOF receives is also what replicas receive.
    let s = aof_server("no");
    let mut c = s.conn();
    build_state(&mut c);
    assert_eq!(c.renew("s", "r2", 100_000).int(), 1);
    assert!(c.acquire("x", "b", 100).is_nil());
    let user_commands = [
        "LOCK.ACQUIRE",
        "LOCK.RACQUIRE",
        "LOCK.READ",
        "LOCK.RELEASE",
        "LOCK.RENEW",
        "LOCK.INFO",
    ];
    let check = |cmds: &[Vec<Vec<u8>>], what: &str| {
        let names: Vec<String> = cmds
            .iter()
            .map(|a| String::from_utf8_lossy(&a[0]).to_uppercase())
            .collect();
        for n in &names {
            assert!(
                !user_commands.contains(&n.as_str()),
                "{what}: the AOF holds {n}, whose outcome depends on when it runs: {names:?}"
            );
        }
        // The effects are there: the lock keys are named.
        for key in [&b"x"[..], b"r", b"s", b"bin\0key", b"one"] {
            assert!(
                cmds.iter().any(|a| a.iter().any(|arg| arg == key)),
                "{what}: nothing about key {} in the AOF: {names:?}",
                show(key)
            );
        }
    };
    check(&aof_files(&s, ".incr.aof"), "incremental AOF");
    rewrite_aof(&mut c);
    check(&aof_files(&s, ".base.aof"), "rewritten AOF (no preamble)");
}

/// `payload` (a DUMP of a lock) with every occurrence of the 8-byte
/// big-endian encoding of `from` replaced by `to`, and the CRC fixed: a
/// payload Redis accepts as well-formed.
fn with_token(payload: &[u8], from: i64, to: u64) -> Vec<u8> {
    // Encoding 3 keeps numbers little-endian in the lock's block.
    let needle = (from as u64).to_le_bytes();
    let mut body = payload[..payload.len() - 8].to_vec();
    let mut found = false;
    let mut i = 0;
    while i + 8 <= body.len() {
        if body[i..i + 8] == needle {
            body[i..i + 8].copy_from_slice(&to.to_le_bytes());
            found = true;
        }
        i += 1;
    }
    assert!(found, "token {from} not found in the payload");
    let crc = crc64_redis(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// Issue 10: one RESTORE of a payload with a token of 2^63-1 used up the
/// token counter for good (every grant then failed, a restart kept it).
#[test]
fn restore_of_tokens_no_server_can_have_issued_is_refused_and_grants_go_on() {
    let mut s = Server::start();
    let mut c = s.conn();
    // The tokens are then in the payload as they are in the lock.
    c.cmd(&["CONFIG", "SET", "rdbcompression", "no"]).ok();
    let t = token(c.acquire("x", "a", 100_000));
    let payload = dump(&mut c, "x");
    for bad in [i64::MAX as u64, 1 << 63, u64::MAX, 0] {
        let crafted = with_token(&payload, t, bad);
        let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &crafted]);
        assert!(r.is_err(), "token {bad}: {r:?}");
        assert_eq!(c.cmd(&["EXISTS", "t"]).int(), 0);
    }
    // Two readers with one token.
    let r1 = token(c.read("sh", "r1", 100_000));
    let r2 = token(c.read("sh", "r2", 100_000));
    let payload = dump(&mut c, "sh");
    let crafted = with_token(&payload, r2, r1 as u64);
    let r = c.cmd(&[b"RESTORE".as_slice(), b"t", b"0", &crafted]);
    assert!(r.is_err(), "duplicate tokens: {r:?}");
    // The counter is untouched: grants go on, after a restart too.
    let next = token(c.acquire("y", "a", 100_000));
    assert!(next > r2 && next < i64::MAX / 2);
    c.cmd(&["SAVE"]).ok();
    s.restart();
    let mut c = s.conn();
    assert!(token(c.acquire("z", "a", 100_000)) > next);
    still_alive(&mut s, &mut c, "after the refused payloads");
}

/// The same bound on the AOF path: a LOCK.SYNC line with such a token is
/// refused (Redis goes on loading the rest of the AOF): no lock, and the
/// counter untouched.
#[test]
fn an_aof_line_with_an_impossible_token_is_refused() {
    let mut s = aof_server("no");
    let mut c = s.conn();
    let t = token(c.acquire("k", "a", 100_000));
    s.shutdown_save();
    let aof = std::fs::read_dir(s.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("the incremental AOF");
    let mut text = std::fs::read(&aof).unwrap();
    let deadline = (now_ms() + 100_000).to_string();
    let line = format!(
        "*8\r\n$9\r\nLOCK.SYNC\r\n$1\r\nq\r\n$3\r\nSET\r\n$1\r\no\r\n$9\r\nexclusive\r\n$1\r\n1\r\n$19\r\n{}\r\n${}\r\n{deadline}\r\n",
        i64::MAX,
        deadline.len()
    );
    text.extend_from_slice(line.as_bytes());
    std::fs::write(&aof, text).unwrap();
    s.restart();
    let mut c = s.conn();
    assert!(
        c.lock_info("q").is_none(),
        "the impossible grant was refused"
    );
    assert_eq!(c.lock_info("k").expect("k loaded").holders[0].token, t);
    let next = token(c.acquire("z", "a", 100_000));
    assert!(next > t && next < i64::MAX / 2, "{next}");
}

/// `tests/fixtures/locks-v2.rdb` was written by 0.2.0 itself (commit
/// 38ca8e7, RDB encoding 2), its clock shifted to 2090-01-01T00:00:00Z with
/// `tests/shims/clockshim.c`, after:
///
/// ```text
/// LOCK.RACQUIRE x a 2592000000              (twice: 2 holds)
/// LOCK.READ s r1 2592000000                 (twice) ; LOCK.READ s r2 2000000000
/// LOCK.SEMAPHORE sem 5 p1 2592000000 ; LOCK.SEMAPHORE sem 5 p2 2500000000
/// LOCK.ACQUIRE "bin\x00key" "own\x00er\xff" 2592000000
/// LOCK.ACQUIRE long <"o" x 300> 2592000000
/// SAVE
/// ```
///
/// This build (encoding 3) loads it, on a server whose clock is an hour
/// past that moment (so the 30-day leases still run and the tokens are ones
/// a server can have issued), with every holder, hold, token and lease.
#[test]
fn an_rdb_written_by_0_2_loads() {
    const T0: i64 = 3_786_912_000_000;
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "v2-fixture-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/locks-v2.rdb");
    std::fs::copy(&fixture, dir.join("dump.rdb")).unwrap();
    let clock = ShiftedClock::new(T0 + 3_600_000 - now_ms());
    let s = Server::builder().dir(&dir).clock(&clock).start();
    let mut c = s.conn();
    let t = |n: i64| 3_786_912_060_045_000 + n;
    let long = vec![b'o'; 300];
    // (key, mode, [(owner, holds, token, ttl at grant)], limit)
    type Holders<'a> = Vec<(&'a [u8], i64, i64, i64)>;
    let expect: [(&[u8], &str, Holders, Option<i64>); 5] = [
        (
            b"x",
            "exclusive",
            vec![(b"a", 2, t(1), 2_592_000_000)],
            None,
        ),
        (
            b"s",
            "shared",
            vec![
                (b"r1", 2, t(2), 2_592_000_000),
                (b"r2", 1, t(3), 2_000_000_000),
            ],
            None,
        ),
        (
            b"sem",
            "semaphore",
            vec![
                (b"p1", 1, t(4), 2_592_000_000),
                (b"p2", 1, t(5), 2_500_000_000),
            ],
            Some(5),
        ),
        (
            b"bin\0key",
            "exclusive",
            vec![(b"own\0er\xff", 1, t(6), 2_592_000_000)],
            None,
        ),
        (
            b"long",
            "exclusive",
            vec![(&long, 1, t(7), 2_592_000_000)],
            None,
        ),
    ];
    for (key, mode, holders, limit) in &expect {
        let info = c.lock_info(key).unwrap_or_else(|| panic!("{key:?} loaded"));
        assert_eq!(&info.mode, mode, "{key:?}");
        assert_eq!(info.limit, *limit, "{key:?}");
        let mut got: Vec<_> = info.holders.iter().collect();
        got.sort_by_key(|h| h.token);
        assert_eq!(got.len(), holders.len(), "{key:?}");
        for (h, (owner, holds, token, ttl)) in got.iter().zip(holders) {
            assert_eq!(
                (&h.owner[..], h.holds, h.token),
                (*owner, *holds, *token),
                "{key:?}"
            );
            // Granted a few seconds after T0, loaded an hour after it.
            let left = ttl - 3_600_000;
            assert!(
                (left - 120_000..=left + 120_000).contains(&h.ttl),
                "{key:?}: {} ms left, about {left} expected",
                h.ttl
            );
        }
    }
    // The counter is past every loaded token; the locks work as ever, and
    // are saved again in this build's encoding.
    assert!(token(c.acquire("new", "a", 10_000)) > t(7));
    assert!(c.acquire("x", "b", 10_000).is_nil());
    assert_eq!(c.release("x", "a").int(), 0);
    assert_eq!(c.release("s", "r2").int(), 1);
    let payload = dump(&mut c, "long");
    c.cmd(&[b"RESTORE".as_slice(), b"long2", b"0", &payload])
        .ok();
    assert_eq!(c.lock_info("long2").unwrap().holders[0].owner, long);
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(c.lock_info("sem").unwrap().holders.len(), 2);
    drop(c);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A lease that was legal when granted, past `lock.max-ttl` once the
/// setting is lowered, is clamped at the next load and counted in
/// `lock_loaded_state_fixed` (docs/commands.md: not only forged state), the
/// log line naming the setting.
#[test]
fn a_lowered_max_ttl_clamps_a_loaded_lease_and_counts_it() {
    let s = Server::start();
    let mut c = s.conn();
    let token = c.acquire("long", "o", 600_000).int();
    assert!(c.cmd(&["CONFIG", "SET", "lock.max-ttl", "5000"]).is("OK"));
    assert!(c.cmd(&["DEBUG", "RELOAD"]).is("OK"));
    let fixed: i64 = c
        .info_field("lock", "lock_loaded_state_fixed")
        .parse()
        .unwrap();
    assert_eq!(fixed, 1);
    let info = c.lock_info("long").expect("still held");
    assert_eq!(info.holders[0].token, token);
    assert!(info.holders[0].ttl <= 5000, "{info:?}");
    assert!(
        s.log_tail(50).contains("past lock.max-ttl"),
        "{}",
        s.log_tail(50)
    );
}

/// Issue 38.1 on a load: an AOF of 10,000 readers' effects (one
/// `LOCK.SYNC` each, as a master writes them: deadlines apart, each token
/// above the ones before), one renewed and re-entered and one dropped after
/// them, loads to exactly that state (each effect applied in one walk of
/// the key's holders), nothing fixed on the way.
#[test]
fn an_aof_of_ten_thousand_readers_effects_loads_to_their_state() {
    let n = 10_000u64;
    let mut s = Server::builder()
        .config("lock.max-holders 20000")
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        // The load applies 10,000 effects to one key: each walks its holders
        // once, seconds in this debug build on a loaded machine.
        .startup_deadline(Duration::from_secs(180))
        .start();
    let mut c = s.conn();
    let t = token(c.cmd(&["LOCK.ACQUIRE", "plain", "o", "600000"])) as u64;
    s.shutdown_save();
    let path = std::fs::read_dir(s.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("the incremental AOF");
    let mut text = std::fs::read(&path).expect("read the AOF");
    let now = now_ms() as u64;
    // One command as the AOF spells it.
    let line = |args: &[&str]| {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        out.into_bytes()
    };
    let effect = |owner: &str, holds: u64, token: u64, deadline: u64| {
        let numbers = format!("shared:{holds}:{token}:{deadline}");
        line(&["LOCK.SYNC", "big", &numbers, owner])
    };
    let deadline = |i: u64| now + 600_000 + (i * 7_919) % 1_000;
    for i in 0..n {
        text.extend(effect(&format!("reader-{i}"), 1, t + 1 + i, deadline(i)));
    }
    text.extend(effect("reader-5", 2, t + 6, now + 900_000));
    text.extend(line(&["LOCK.SYNC", "big", "DROP", "reader-7"]));
    std::fs::write(&path, &text).expect("write the AOF");
    s.restart();
    let mut c = s.conn();
    let loaded_at = now_ms() as u64;
    let info = c.lock_info("big").expect("big loaded");
    assert_eq!(info.mode, "shared");
    assert_eq!(info.holders.len() as u64, n - 1);
    for i in (0..n).filter(|&i| i != 7) {
        let h = info.holder(format!("reader-{i}"));
        let (holds, end) = match i {
            5 => (2, now + 900_000),
            _ => (1, deadline(i)),
        };
        assert_eq!(
            (h.holds, h.token),
            (holds, (t + 1 + i) as i64),
            "reader-{i}"
        );
        let ttl = end as i64 - loaded_at as i64;
        assert!(
            (h.ttl - ttl).abs() <= 5_000,
            "reader-{i}: ttl {} for {ttl}",
            h.ttl
        );
    }
    let latest = (0..n).map(deadline).max().unwrap_or(0).max(now + 900_000);
    let pttl = c.pttl("big");
    // (Read after the checks above, which take seconds on a loaded
    // machine: the time since the load is slack, not an error.)
    let read_at = now_ms() as u64;
    let (most, least) = (
        latest as i64 - loaded_at as i64,
        latest as i64 - read_at as i64,
    );
    assert!(
        least - 5_000 <= pttl && pttl <= most + 5_000,
        "PTTL {pttl}, from {least} to {most}"
    );
    assert_eq!(c.info_field("lock", "lock_loaded_state_fixed").trim(), "0");
}
