//! Locks bound to their connection (`BIND`) and `LOCK.KEEPALIVE`
//! (shared/CONTRACT.md, "Locks bound to their connection").

use std::time::{Duration, Instant};

use crate::common::*;

fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn stat(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .unwrap_or_else(|_| panic!("lock_{field} is an integer"))
}

/// Waits until `key` is free (LOCK.INFO nil), within a generous bound.
fn freed(c: &mut Conn, key: &str, what: &str) -> Duration {
    let start = Instant::now();
    wait_until(Duration::from_secs(5), what, || c.lock_info(key).is_none());
    start.elapsed()
}

#[test]
fn a_bound_holder_ends_when_its_connection_closes_and_the_waiter_gets_the_lock() {
    let s = Server::start();
    let mut holder = s.conn();
    token(holder.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]));
    assert_eq!(stat(&mut holder, "bound_holders"), 1);
    let mut w = s.conn();
    w.send(&["LOCK.ACQUIRE", "k", "b", "60000", "WAIT", "5000"])
        .unwrap();
    let mut obs = s.conn();
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        stat(&mut obs, "waiters") == 1
    });
    let start = Instant::now();
    drop(holder);
    w.set_timeout(Duration::from_secs(5));
    let r = w.read_reply().expect("the waiter is answered");
    token(r);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "granted on disconnect, not at the lease ({:?})",
        start.elapsed()
    );
    assert_eq!(obs.lock_info("k").unwrap().holders[0].owner, b"b");
    assert_eq!(stat(&mut obs, "releases_on_disconnect"), 1);
    assert_eq!(stat(&mut obs, "bound_holders"), 0);
}

#[test]
fn client_kill_releases_every_hold_and_the_release_is_replicated() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut a = master.conn();
    let id = a.cmd(&["CLIENT", "ID"]).int();
    for _ in 0..3 {
        token(a.cmd(&["LOCK.RACQUIRE", "k", "a", "60000", "BIND"]));
    }
    token(a.cmd(&["LOCK.READ", "r", "a", "60000", "BIND"]));
    let mut c = master.conn();
    assert_eq!(c.lock_info("k").unwrap().holders[0].holds, 3);
    c.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]).int();
    freed(&mut c, "k", "k freed by CLIENT KILL");
    freed(&mut c, "r", "r freed by CLIENT KILL");
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    assert!(r.lock_info("k").is_none() && r.lock_info("r").is_none());
    assert_eq!(stat(&mut c, "releases_on_disconnect"), 2);
}

#[test]
fn without_bind_a_lock_outlives_its_connection_and_the_lease_still_applies_with_it() {
    let s = Server::start();
    let mut a = s.conn();
    token(a.acquire("plain", "a", 60_000));
    token(a.cmd(&["LOCK.ACQUIRE", "short", "a", "200", "BIND"]));
    let mut c = s.conn();
    sleep_ms(400);
    assert!(c.lock_info("short").is_none(), "the lease ended first");
    drop(a);
    sleep_ms(200);
    assert!(
        c.lock_info("plain").is_some(),
        "unbound: only the lease ends it"
    );
    assert_eq!(stat(&mut c, "releases_on_disconnect"), 0);
}

#[test]
fn a_repeat_with_bind_moves_the_binding_and_one_without_leaves_it() {
    let s = Server::start();
    let mut a = s.conn();
    let mut b = s.conn();
    let t = token(a.cmd(&["LOCK.ACQUIRE", "k", "o", "60000", "BIND"]));
    // Without BIND, from another connection: the binding stays with `a`.
    assert_eq!(token(b.acquire("k", "o", 60_000)), t);
    // With BIND from `b`: it moves to `b`.
    assert_eq!(
        token(b.cmd(&["LOCK.ACQUIRE", "k", "o", "60000", "BIND"])),
        t
    );
    drop(a);
    let mut c = s.conn();
    sleep_ms(300);
    assert!(c.lock_info("k").is_some(), "a's close no longer ends it");
    drop(b);
    freed(&mut c, "k", "b's close ends it");
}

#[test]
fn a_waiter_with_bind_is_bound_when_granted() {
    let s = Server::start();
    let mut a = s.conn();
    token(a.acquire("k", "a", 60_000));
    let mut w = s.conn();
    w.send(&["LOCK.READ", "k", "r", "60000", "BIND", "WAIT", "0"])
        .unwrap();
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        stat(&mut a, "waiters") == 1
    });
    assert_eq!(a.release("k", "a").int(), 1);
    token(w.read_reply().unwrap());
    assert_eq!(stat(&mut a, "bound_holders"), 1);
    drop(w);
    freed(&mut a, "k", "the bound reader's close");
}

#[test]
fn keepalive_renews_the_holders_bound_to_this_connection_only() {
    let s = Server::start();
    let mut a = s.conn();
    // (Leases of 5 s: a loaded machine can hold the test between commands.)
    token(a.cmd(&["LOCK.ACQUIRE", "x", "a", "5000", "BIND"]));
    token(a.cmd(&["LOCK.READ", "y", "a", "5000", "BIND"]));
    a.cmd(&["SELECT", "2"]).ok();
    token(a.cmd(&["LOCK.RACQUIRE", "z", "a", "5000", "BIND"]));
    token(a.cmd(&["LOCK.ACQUIRE", "unbound", "a", "5000"]));
    let mut b = s.conn();
    token(b.cmd(&["LOCK.ACQUIRE", "other", "b", "5000", "BIND"]));
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 3);
    // The caller's database is unchanged.
    assert!(a.lock_info("z").is_some());
    let ttl = |c: &mut Conn, db: &str, key: &str| {
        c.cmd(&["SELECT", db]).ok();
        c.lock_info(key).map_or(-1, |i| i.holders[0].ttl)
    };
    assert!(ttl(&mut b, "0", "x") > 50_000);
    assert!(ttl(&mut b, "0", "y") > 50_000);
    assert!(ttl(&mut b, "2", "z") > 50_000);
    assert!(ttl(&mut b, "2", "unbound") <= 5_000);
    assert!(ttl(&mut b, "0", "other") <= 5_000);
    // A released holder is no longer renewed.
    a.cmd(&["SELECT", "0"]).ok();
    assert_eq!(a.release("x", "a").int(), 1);
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 2);
    // A deleted one neither (its binding is found stale and dropped).
    a.cmd(&["DEL", "y"]).int();
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 1);
    assert_eq!(stat(&mut a, "bound_holders"), 2);
    assert_eq!(s.conn().cmd(&["LOCK.KEEPALIVE", "1000"]).int(), 0);
    // Bad input.
    for bad in [
        vec!["LOCK.KEEPALIVE"],
        vec!["LOCK.KEEPALIVE", "0"],
        vec!["LOCK.KEEPALIVE", "x"],
        vec!["LOCK.KEEPALIVE", "1", "2"],
    ] {
        assert!(a.cmd(&bad).is_err(), "{bad:?}");
    }
}

#[test]
fn bind_inside_a_script_is_an_error_and_inside_multi_binds_the_connection() {
    let s = Server::start();
    let mut a = s.conn();
    let r = a.cmd(&[
        "EVAL",
        "return redis.call('LOCK.ACQUIRE', KEYS[1], 'a', 1000, 'BIND')",
        "1",
        "k",
    ]);
    assert!(r.is_err(), "{r:?}");
    assert!(a.lock_info("k").is_none(), "nothing granted");
    a.cmd(&["MULTI"]).ok();
    a.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]);
    let r = a.cmd(&["EXEC"]);
    token(r.array()[0].clone());
    // A connection that bound outside a script is still refused inside
    // one (the script runs as its own client), a function too.
    let r = a.cmd(&[
        "EVAL",
        "return redis.call('LOCK.ACQUIRE', KEYS[1], 'a', 1000, 'BIND')",
        "1",
        "k2",
    ]);
    assert!(format!("{r:?}").contains("BIND is not allowed"), "{r:?}");
    let lib = "#!lua name=bindlib\nredis.register_function('bindit', function(keys) return redis.call('LOCK.ACQUIRE', keys[1], 'a', 1000, 'BIND') end)";
    assert_eq!(a.cmd(&["FUNCTION", "LOAD", lib]).bulk(), b"bindlib");
    let r = a.cmd(&["FCALL", "bindit", "1", "k3"]);
    assert!(format!("{r:?}").contains("BIND is not allowed"), "{r:?}");
    assert!(a.lock_info("k2").is_none() && a.lock_info("k3").is_none());
    let mut c = s.conn();
    drop(a);
    freed(&mut c, "k", "the transaction's connection closed");
}

#[test]
fn bind_is_an_option_in_any_order_once() {
    let s = Server::start();
    let mut a = s.conn();
    token(a.cmd(&["LOCK.ACQUIRE", "k1", "a", "1000", "bind", "wait", "10"]));
    token(a.cmd(&["LOCK.ACQUIRE", "k2", "a", "1000", "WAIT", "10", "BIND"]));
    for bad in [
        vec!["LOCK.ACQUIRE", "k3", "a", "1000", "BIND", "BIND"],
        vec!["LOCK.ACQUIRE", "k3", "a", "1000", "BINDX"],
    ] {
        let r = a.cmd(&bad);
        assert!(r.is_err(), "{bad:?}: {r:?}");
    }
    assert!(a.lock_info("k3").is_none());
}

#[test]
fn rename_and_swapdb_carry_the_binding() {
    let s = Server::start();
    let mut a = s.conn();
    token(a.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]));
    token(a.cmd(&["LOCK.ACQUIRE", "m", "a", "60000", "BIND"]));
    let mut c = s.conn();
    c.cmd(&["RENAME", "k", "k2"]).ok();
    c.cmd(&["SWAPDB", "0", "1"]).ok();
    drop(a);
    c.cmd(&["SELECT", "1"]).ok();
    freed(&mut c, "k2", "the renamed lock");
    freed(&mut c, "m", "the swapped lock");
}

#[test]
fn move_rename_over_a_bound_lock_and_a_repeated_token_keep_each_binding_with_its_grant() {
    let s = Server::start();
    let mut a = s.conn();
    let mut c = s.conn();
    // MOVE carries the binding to the other database.
    token(a.cmd(&["LOCK.ACQUIRE", "mv", "a", "60000", "BIND"]));
    assert_eq!(c.cmd(&["MOVE", "mv", "2"]).int(), 1);
    // RENAME over another bound lock: the moved grant stays bound; the
    // replaced one's binding is stale (as after a DEL) and ends at the close.
    token(a.cmd(&["LOCK.ACQUIRE", "src", "a", "60000", "BIND"]));
    token(a.cmd(&["LOCK.ACQUIRE", "dst", "other", "60000", "BIND"]));
    c.cmd(&["RENAME", "src", "dst"]).ok();
    // A forged state: a lock restored elsewhere with the same owner and
    // token, bound by another connection (a repeat), is a binding apart.
    let t = token(a.cmd(&["LOCK.ACQUIRE", "orig", "a", "60000", "BIND"]));
    let dump = c.cmd(&["DUMP", "orig"]).bulk().to_vec();
    let restored = c.cmdv(&[b"RESTORE".to_vec(), b"copy".to_vec(), b"0".to_vec(), dump]);
    restored.ok();
    let mut b = s.conn();
    assert_eq!(
        token(b.cmd(&["LOCK.ACQUIRE", "copy", "a", "60000", "BIND"])),
        t,
        "a repeat by the holder keeps its token"
    );
    drop(a);
    freed(&mut c, "dst", "the renamed lock");
    freed(&mut c, "orig", "the original lock");
    c.cmd(&["SELECT", "2"]).ok();
    freed(&mut c, "mv", "the moved lock");
    c.cmd(&["SELECT", "0"]).ok();
    assert!(
        c.lock_info("copy").is_some(),
        "the copy is bound to the connection still open"
    );
    wait_until(
        Duration::from_secs(5),
        "the closed connection's bindings to end",
        || stat(&mut c, "bound_holders") == 1,
    );
    drop(b);
    freed(&mut c, "copy", "the copy");
    wait_until(Duration::from_secs(5), "every binding to end", || {
        stat(&mut c, "bound_holders") == 0 && stat(&mut c, "bindings_memory") == 0
    });
}

#[test]
fn keepalive_pages_through_a_list_with_most_bindings_ended() {
    let s = Server::start();
    let mut a = s.conn();
    // (Leases a loaded machine keeps through the test: 1 s ran out once
    // before the releases were done.)
    for i in 0..500 {
        token(a.cmd(&["LOCK.ACQUIRE", &format!("k{i}"), "a", "30000", "BIND"]));
    }
    // Most end, in no particular order: the list keeps holes, then is
    // compacted; each remaining binding is renewed once.
    for k in (0..500).map(|j| (j * 37) % 500).filter(|k| k % 7 != 0) {
        assert_eq!(a.release(&format!("k{k}"), "a").int(), 1);
    }
    let left = (0..500).filter(|i| i % 7 == 0).count();
    assert_eq!(stat(&mut a, "bound_holders"), left as i64);
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "120000"]).int(), left as i64);
    for i in (0..500).filter(|i| i % 7 == 0) {
        assert!(a.lock_info(format!("k{i}")).unwrap().holders[0].ttl > 100_000);
    }
}

#[test]
fn the_servers_idle_timeout_releases_a_bound_lock() {
    // (3 s: a loaded machine can hold the test's thread for over a second
    // between `a`'s connection and its grant, and `timeout 1` then closed
    // `a` before the grant.)
    let s = Server::builder().config("timeout 3").start();
    let mut a = s.conn();
    token(a.cmd(&["LOCK.ACQUIRE", "k", "a", "60000", "BIND"]));
    let mut c = s.conn();
    // `c` keeps talking; `a` stays idle and is closed by the server.
    let start = Instant::now();
    while c.lock_info("k").is_some() {
        assert!(start.elapsed() < Duration::from_secs(30), "never released");
        sleep_ms(100);
    }
}

#[test]
fn memory_usage_and_info_count_the_bindings() {
    let s = Server::start();
    let mut a = s.conn();
    // A bound lock's key has no Redis TTL (its holder follows its
    // connection's lease), and in Valkey's key objects a TTL takes bytes:
    // the unbound lock compared with is a session holder's, whose key has
    // none either.
    let id = a.cmd(&["LOCK.SESSION", "OPEN", "600000"]).int().to_string();
    token(a.cmd(&["LOCK.ACQUIRE", "sessn", "owner-1", "60000", "SESSION", &id]));
    token(a.cmd(&["LOCK.ACQUIRE", "bound", "owner-1", "60000", "BIND"]));
    let plain = a.cmd(&["MEMORY", "USAGE", "sessn"]).int();
    let bound = a.cmd(&["MEMORY", "USAGE", "bound"]).int();
    let per_binding = stat(&mut a, "bindings_memory");
    assert!(per_binding > 0);
    assert_eq!(
        bound - plain,
        per_binding,
        "MEMORY USAGE includes the binding"
    );
    assert_eq!(a.release("bound", "owner-1").int(), 1);
    assert_eq!(stat(&mut a, "bindings_memory"), 0);
}

/// Issue 38.3: inside a script or a function, `LOCK.KEEPALIVE` renews the
/// holders bound to the connection running it (inside MULTI too: the
/// script runs at EXEC); another connection's script renews none. Redis 7.0
/// cannot name that connection to a module: there it is an error reply, not
/// a silent 0.
#[test]
fn keepalive_in_a_script_renews_the_callers_bound_holders() {
    let s = Server::start();
    let mut a = s.conn();
    let mut b = s.conn();
    let script = "return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    // Nothing bound anywhere: 0 on every server.
    assert_eq!(b.cmd(&["EVAL", script, "0", "1000"]).int(), 0);
    assert!(a.cmd(&["LOCK.ACQUIRE", "s", "o", "5000", "BIND"]).int() > 0);
    let left = |b: &mut Conn| b.lock_info("s").unwrap().holder("o").ttl;
    assert_eq!(a.cmd(&["EVAL", script, "0", "600000"]).int(), 1);
    assert!(left(&mut b) > 500_000);
    assert_eq!(b.cmd(&["EVAL", script, "0", "900000"]).int(), 0);
    assert!(left(&mut b) <= 600_000);
    a.cmd(&["MULTI"]).ok();
    a.cmd(&["EVAL", script, "0", "700000"]);
    let exec = a.cmd(&["EXEC"]);
    assert_eq!(exec.array()[0].clone().int(), 1, "{exec:?}");
    assert!(left(&mut b) > 600_000);
    let lib = "#!lua name=ka\nredis.register_function('ka', function(keys, args) return redis.call('LOCK.KEEPALIVE', args[1]) end)";
    b.cmd(&["FUNCTION", "LOAD", lib]);
    assert_eq!(a.cmd(&["FCALL", "ka", "0", "800000"]).int(), 1);
    assert!(left(&mut b) > 700_000);
}

/// Issue 39.3: the server keeps the connection a script runs for; the
/// module learns where from a connection's own binding command, whichever
/// comes first on a new server: one inside MULTI/EXEC, one through
/// `LOCK.GUARD` (whose called command runs as a temporary client), or one
/// sent directly. After each, a script renews its caller's holders and
/// only those, in a function and inside MULTI too.
#[test]
fn keepalive_in_a_script_knows_its_caller_whatever_bound_first() {
    let script = "return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    for first in ["multi", "guard", "direct"] {
        let s = Server::start();
        let mut a = s.conn();
        let mut b = s.conn();
        let mut c = s.conn();
        match first {
            "multi" => {
                a.cmd(&["MULTI"]).ok();
                a.cmd(&["LOCK.ACQUIRE", "k", "o", "5000", "BIND"]);
                let exec = a.cmd(&["EXEC"]);
                token(exec.array()[0].clone());
            }
            "guard" => {
                token(c.acquire("g", "x", 60_000));
                token(a.cmd(&[
                    "LOCK.GUARD",
                    "g",
                    "x",
                    "CALL",
                    "LOCK.ACQUIRE",
                    "k",
                    "o",
                    "5000",
                    "BIND",
                ]));
            }
            _ => {
                token(a.cmd(&["LOCK.ACQUIRE", "k", "o", "5000", "BIND"]));
            }
        }
        let left = |c: &mut Conn| c.lock_info("k").unwrap().holder("o").ttl;
        assert_eq!(b.cmd(&["EVAL", script, "0", "600000"]).int(), 0, "{first}");
        assert!(left(&mut c) <= 5_000, "{first}");
        assert_eq!(a.cmd(&["EVAL", script, "0", "600000"]).int(), 1, "{first}");
        assert!(left(&mut c) > 500_000, "{first}");
        token(b.cmd(&["LOCK.ACQUIRE", "kb", "o", "5000", "BIND"]));
        b.cmd(&["MULTI"]).ok();
        b.cmd(&["EVAL", script, "0", "700000"]);
        let exec = b.cmd(&["EXEC"]);
        assert_eq!(exec.array()[0].clone().int(), 1, "{first}: {exec:?}");
        assert!(
            c.lock_info("kb").unwrap().holder("o").ttl > 600_000,
            "{first}"
        );
        assert!(
            left(&mut c) <= 600_000,
            "{first}: b's script renewed a's holder"
        );
    }
}

/// Issue 39.3: a script's `LOCK.KEEPALIVE` stays exact across the last
/// release and a new binding, apart or in one transaction (until issue
/// 39.3's end a command filter named the caller, there only while some
/// holder was bound), and a waiter bound by a grant inside another
/// connection's script is not that script's caller's.
#[test]
fn keepalive_in_a_script_stays_exact_as_the_last_binding_goes_and_comes() {
    let s = Server::start();
    let mut a = s.conn();
    let mut b = s.conn();
    let script = "return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    for round in 0..3 {
        assert!(a.cmd(&["LOCK.ACQUIRE", "k", "o", "5000", "BIND"]).int() > 0);
        assert_eq!(b.cmd(&["EVAL", script, "0", "600000"]).int(), 0, "{round}");
        assert_eq!(a.cmd(&["EVAL", script, "0", "600000"]).int(), 1, "{round}");
        assert_eq!(a.release("k", "o").int(), 1);
        assert_eq!(a.cmd(&["EVAL", script, "0", "600000"]).int(), 0, "{round}");
        assert_eq!(b.cmd(&["PING"]), Reply::Status("PONG".into()));
    }
    // The last holder released and another bound in one transaction,
    // then the script: the caller's new holder is renewed.
    assert!(a.cmd(&["LOCK.ACQUIRE", "k", "o", "5000", "BIND"]).int() > 0);
    a.cmd(&["MULTI"]).ok();
    a.cmd(&["LOCK.RELEASE", "k", "o"]);
    a.cmd(&["LOCK.ACQUIRE", "k2", "o", "5000", "BIND"]);
    a.cmd(&["EVAL", script, "0", "600000"]);
    let exec = a.cmd(&["EXEC"]);
    assert_eq!(exec.array()[2].clone().int(), 1, "{exec:?}");
    assert!(b.lock_info("k2").unwrap().holder("o").ttl > 500_000);
    assert_eq!(a.release("k2", "o").int(), 1);
    // Nothing bound; a waiter with BIND granted by a release inside b's
    // script: b's KEEPALIVE renews nothing of the waiter's.
    assert!(b.cmd(&["LOCK.ACQUIRE", "w", "b", "60000"]).int() > 0);
    let mut d = s.conn();
    d.push(&[b"LOCK.ACQUIRE", b"w", b"d", b"5000", b"WAIT", b"0", b"BIND"]);
    d.flush().unwrap();
    let mut c = s.conn();
    while stat(&mut c, "waiters") < 1 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let release_then_keepalive = "redis.call('LOCK.RELEASE', KEYS[1], ARGV[1]); return redis.call('LOCK.KEEPALIVE', ARGV[2])";
    let r = b.cmd(&["EVAL", release_then_keepalive, "1", "w", "b", "600000"]);
    assert_eq!(r.int(), 0);
    assert!(d.read_reply().unwrap().int() > 0);
    assert!(c.lock_info("w").unwrap().holder("d").ttl <= 5_000);
    assert_eq!(d.cmd(&["EVAL", script, "0", "600000"]).int(), 1);
    assert!(c.lock_info("w").unwrap().holder("d").ttl > 500_000);
}

/// Issue 39.3: a script's `LOCK.KEEPALIVE` names its caller whatever
/// other connections (bound or not) sent meanwhile: between the caller's
/// `MULTI` and `EXEC`, the script's own commands first, in a function, a
/// caller with nothing bound right after bound connections' commands; a
/// script call postponed by `CLIENT PAUSE` (it runs after another
/// connection's read and the `UNPAUSE`); and a script past
/// `busy-reply-threshold`, while other connections' commands are answered
/// `BUSY`. The last two are where a guess from the commands the server
/// received (a command filter's: the last sender of a script call, or of
/// any command) goes wrong; the server's current client, which the module
/// reads (script_caller.rs), is set when the script's call runs.
#[test]
fn keepalive_in_a_script_names_its_caller_whatever_others_sent_meanwhile() {
    let s = Server::start();
    let mut a = s.conn();
    let mut b = s.conn();
    let mut c = s.conn();
    token(a.cmd(&["LOCK.ACQUIRE", "a1", "o", "5000", "BIND"]));
    token(b.cmd(&["LOCK.ACQUIRE", "b1", "o", "5000", "BIND"]));
    token(b.cmd(&["LOCK.READ", "b2", "o", "5000", "BIND"]));
    let script = "return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    // Others' commands between MULTI and EXEC.
    a.cmd(&["MULTI"]).ok();
    a.cmd(&["EVAL", script, "0", "600000"]);
    assert_eq!(b.cmd(&["PING"]), Reply::Status("PONG".into()));
    c.cmd(&["SET", "x", "1"]).ok();
    b.cmd(&["GET", "x"]);
    let exec = a.cmd(&["EXEC"]);
    assert_eq!(exec.array()[0].clone().int(), 1, "{exec:?}");
    // The script's own commands first.
    let busy = "redis.call('SET', KEYS[1], 'v'); redis.call('GET', KEYS[1]); redis.call('PING'); return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    assert_eq!(a.cmd(&["EVAL", busy, "1", "y", "600000"]).int(), 1);
    assert_eq!(b.cmd(&["EVAL", busy, "1", "y", "600000"]).int(), 2);
    // A caller with nothing bound, right after bound connections' commands.
    a.cmd(&["GET", "x"]);
    b.cmd(&["GET", "x"]);
    assert_eq!(c.cmd(&["EVAL", busy, "1", "y", "600000"]).int(), 0);
    assert_eq!(c.cmd(&["EVAL", script, "0", "600000"]).int(), 0);
    // A function.
    let lib = "#!lua name=ka2\nredis.register_function('ka2', function(keys, args) redis.call('PING'); return redis.call('LOCK.KEEPALIVE', args[1]) end)";
    c.cmd(&["FUNCTION", "LOAD", lib]);
    a.cmd(&["PING"]);
    assert_eq!(b.cmd(&["FCALL", "ka2", "0", "600000"]).int(), 2);
    assert_eq!(a.cmd(&["FCALL", "ka2", "0", "600000"]).int(), 1);
    assert_eq!(c.cmd(&["FCALL", "ka2", "0", "600000"]).int(), 0);
    // A script call postponed by CLIENT PAUSE.
    c.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]).ok();
    a.push(&[b"EVAL", script.as_bytes(), b"0", b"600000"]);
    a.flush().unwrap();
    wait_until(Duration::from_secs(10), "a's EVAL to be postponed", || {
        c.info_field("clients", "blocked_clients") == "1"
    });
    b.cmd(&["GET", "x"]);
    c.cmd(&["CLIENT", "UNPAUSE"]).ok();
    assert_eq!(a.read_reply().unwrap().int(), 1);
    // A script past busy-reply-threshold: b's PINGs, answered BUSY while
    // it runs, are filtered in the middle of it.
    c.cmd(&["CONFIG", "SET", "busy-reply-threshold", "50"]).ok();
    let slow = "local t = redis.call('TIME'); local start = t[1] * 1000000 + t[2]; \
        while true do local n = redis.call('TIME'); \
        if n[1] * 1000000 + n[2] - start > tonumber(ARGV[2]) then break end end; \
        return redis.call('LOCK.KEEPALIVE', ARGV[1])";
    a.set_timeout(Duration::from_secs(60));
    a.push(&[b"EVAL", slow.as_bytes(), b"0", b"600000", b"3000000"]);
    a.flush().unwrap();
    let mut busy_seen = false;
    for _ in 0..2_000 {
        match b.cmd(&["PING"]) {
            Reply::Error(e) if e.starts_with("BUSY") => {
                busy_seen = true;
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    assert_eq!(a.read_reply().unwrap().int(), 1);
    assert!(busy_seen, "b's PING never met the busy script");
}

/// `DEBUG RELOAD` (and `DEBUG LOADAOF`) load the server's own data back
/// while every connection stays open: the bindings stay too (KEEPALIVE
/// renews them, the close frees them). A `FLUSHALL` drops them, even when a
/// reload follows at once.
#[test]
fn bindings_survive_debug_reload_and_loadaof_and_go_with_flushall() {
    let s = Server::builder().config("appendonly yes").start();
    let mut a = s.conn();
    let t1 = token(a.cmd(&["LOCK.ACQUIRE", "k1", "a", "60000", "BIND"]));
    token(a.cmd(&["LOCK.READ", "k2", "a", "60000", "BIND"]));
    let mut c = s.conn();
    for reload in [["DEBUG", "RELOAD"], ["DEBUG", "LOADAOF"]] {
        assert!(c.cmd(&reload).is("OK"), "{reload:?}");
        assert_eq!(stat(&mut c, "bound_holders"), 2, "after {reload:?}");
        assert_eq!(c.lock_info("k1").unwrap().holders[0].token, t1);
        assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "50000"]).int(), 2, "{reload:?}");
    }
    // A closed connection's holders are still ended after a reload.
    let mut b = s.conn();
    token(b.cmd(&["LOCK.ACQUIRE", "k3", "b", "60000", "BIND"]));
    let id = b.cmd(&["CLIENT", "ID"]).int();
    let mut pipe = s.conn();
    pipe.push(&[b"CLIENT", b"KILL", b"ID", id.to_string().as_bytes()]);
    pipe.push(&[b"DEBUG", b"RELOAD"]);
    pipe.flush().unwrap();
    assert_eq!(pipe.read_reply().unwrap().int(), 1);
    assert!(pipe.read_reply().unwrap().is("OK"));
    freed(
        &mut c,
        "k3",
        "k3 freed by its connection's close across DEBUG RELOAD",
    );
    drop(a);
    freed(
        &mut c,
        "k1",
        "k1 freed by its connection's close after DEBUG RELOAD",
    );
    freed(
        &mut c,
        "k2",
        "k2 freed by its connection's close after DEBUG RELOAD",
    );
    assert_eq!(stat(&mut c, "releases_on_disconnect"), 3);
    assert_eq!(stat(&mut c, "bound_holders"), 0);

    // FLUSHALL, then at once a reload: the flushed bindings stay gone.
    let mut d = s.conn();
    token(d.cmd(&["LOCK.ACQUIRE", "k4", "d", "60000", "BIND"]));
    d.push(&[b"FLUSHALL"]);
    d.push(&[b"LOCK.ACQUIRE", b"k4", b"d", b"60000"]);
    d.push(&[b"DEBUG", b"RELOAD"]);
    d.flush().unwrap();
    assert!(d.read_reply().unwrap().is("OK"));
    let t4 = token(d.read_reply().unwrap());
    assert!(d.read_reply().unwrap().is("OK"));
    assert_eq!(stat(&mut c, "bound_holders"), 0);
    assert_eq!(d.cmd(&["LOCK.KEEPALIVE", "50000"]).int(), 0);
    let id = d.cmd(&["CLIENT", "ID"]).int();
    assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]).int(), 1);
    let info = c
        .lock_info("k4")
        .expect("an unbound grant outlives its connection");
    assert_eq!(info.holders[0].token, t4);
}
