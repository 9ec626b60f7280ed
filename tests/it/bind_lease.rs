//! The connection lease that bound holders follow (issue 38 item 3,
//! docs/design.md "Sessions", connection leases): `LOCK.KEEPALIVE` is one
//! change whatever the bound holders, inside MULTI/EXEC and scripts too,
//! replicated as one effect with the absolute deadline; each bound holder
//! keeps its own lease until a KEEPALIVE covers it; restarts, reloads and
//! AOF rewrites keep each one's deadline.

use crate::common::*;
use std::time::Duration;

#[track_caller]
fn token(r: &Reply) -> i64 {
    let t = r.clone().int();
    assert!(t > 0, "a token is a positive integer, got {r:?}");
    t
}

/// `n` locks `b:<i>` bound to `c`, pipelined.
fn bind_many(c: &mut Conn, n: usize, ttl: &str) {
    const BATCH: usize = 5_000;
    let mut done = 0;
    while done < n {
        let upto = (done + BATCH).min(n);
        for i in done..upto {
            let key = format!("b:{i}");
            c.push(&[
                b"LOCK.ACQUIRE",
                key.as_bytes(),
                b"o",
                ttl.as_bytes(),
                b"BIND",
            ]);
        }
        c.flush().unwrap();
        for _ in done..upto {
            token(&c.read_reply().unwrap());
        }
        done = upto;
    }
}

fn ttl_of(c: &mut Conn, key: &str) -> i64 {
    c.lock_info(key).map_or(-1, |i| i.holders[0].ttl)
}

#[test]
fn keepalive_inside_multi_renews_20000_bound_holders_as_one_effect_the_replica_applies() {
    let master = Server::builder()
        .config("repl-ping-replica-period 3600")
        .start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut a = master.conn();
    a.set_timeout(Duration::from_secs(120));
    bind_many(&mut a, 20_000, "60000");
    wait_for_sync(&master, &replica);
    let before = master.repl_offset();
    a.cmd(&["MULTI"]).ok();
    a.cmd(&["LOCK.KEEPALIVE", "900000"]);
    let exec = a.cmd(&["EXEC"]);
    assert_eq!(exec.array()[0].clone().int(), 20_000, "{exec:?}");
    // One effect, not one per holder (each of those is tens of bytes).
    let sent = master.repl_offset() - before;
    assert!(sent < 2_000, "KEEPALIVE replicated {sent} bytes");
    wait_for_sync(&master, &replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    for key in ["b:0", "b:9999", "b:19999"] {
        let (on_master, on_replica) = (ttl_of(&mut m, key), ttl_of(&mut r, key));
        assert!(on_master > 800_000, "{key}: {on_master}");
        assert!(
            (on_master - on_replica).abs() < 30_000,
            "{key}: master {on_master}, replica {on_replica}"
        );
    }
    // A script renews them the same way (Redis 7.2 and later name its
    // caller to a module).
    if server_version(&mut a) >= (7, 2) {
        let script = "return redis.call('LOCK.KEEPALIVE', ARGV[1])";
        assert_eq!(a.cmd(&["EVAL", script, "0", "1200000"]).int(), 20_000);
        wait_for_sync(&master, &replica);
        assert!(ttl_of(&mut r, "b:12345") > 1_100_000);
    }
    // A promoted replica keeps their deadlines and nothing else: its
    // holders renew by RENEW, one by one, as any holder.
    replica.promote();
    let mut r = replica.conn();
    assert!(ttl_of(&mut r, "b:7") > 800_000);
    assert_eq!(r.cmd(&["LOCK.RENEW", "b:7", "o", "5000"]).int(), 1);
    assert!(ttl_of(&mut r, "b:7") <= 5_000);
    assert!(ttl_of(&mut r, "b:8") > 800_000);
}

#[test]
fn each_bound_holder_keeps_its_own_lease_until_a_keepalive_covers_it() {
    let s = Server::start();
    let mut a = s.conn();
    token(&a.cmd(&["LOCK.ACQUIRE", "short", "o", "100", "BIND"]));
    token(&a.cmd(&["LOCK.ACQUIRE", "long", "o", "60000", "BIND"]));
    token(&a.cmd(&["LOCK.READ", "r", "o", "60000", "BIND"]));
    let mut c = s.conn();
    assert!(ttl_of(&mut c, "long") <= 60_000);
    // The short lease ends by itself, and a KEEPALIVE after its end never
    // brings it back.
    wait_until(Duration::from_secs(10), "the short lease to end", || {
        c.lock_info("short").is_none()
    });
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 2);
    assert!(c.lock_info("short").is_none());
    assert!(ttl_of(&mut c, "long") > 500_000);
    // A RENEW after it is the holder's own again (shorter too), the
    // others keep the KEEPALIVE's.
    assert_eq!(a.cmd(&["LOCK.RENEW", "long", "o", "5000"]).int(), 1);
    assert!(ttl_of(&mut c, "long") <= 5_000);
    assert!(ttl_of(&mut c, "r") > 500_000);
    // A repeat grant likewise.
    token(&a.cmd(&["LOCK.READ", "r", "o", "4000"]));
    assert!(ttl_of(&mut c, "r") <= 4_000);
    // A waiter is granted at a bound holder's lease end (not at the end of
    // its own WAIT): the lease table's end visits the key.
    token(&a.cmd(&["LOCK.ACQUIRE", "w", "o", "300", "BIND"]));
    let started = std::time::Instant::now();
    token(&c.cmd(&["LOCK.ACQUIRE", "w", "waiter", "1000", "WAIT", "20000"]));
    assert!(started.elapsed() < Duration::from_secs(15));
    // A KEEPALIVE may shorten every one of them.
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "3000"]).int(), 2);
    assert!(ttl_of(&mut c, "long") <= 3_000);
    assert!(ttl_of(&mut c, "r") <= 3_000);
    // Another connection's KEEPALIVE renews none of them.
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 0);
    assert!(ttl_of(&mut c, "long") <= 3_000);
    // A repeat with BIND from another connection moves the holder to
    // that connection's lease.
    let mut b = s.conn();
    token(&b.cmd(&["LOCK.ACQUIRE", "long", "o", "5000", "BIND"]));
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 1);
    assert!(ttl_of(&mut c, "long") <= 5_000);
    assert_eq!(b.cmd(&["LOCK.KEEPALIVE", "700000"]).int(), 1);
    assert!(ttl_of(&mut c, "long") > 600_000);
    // The lease's end ends every holder it covers, at once.
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "200"]).int(), 1);
    wait_until(Duration::from_secs(10), "the covered holder to end", || {
        c.lock_info("r").is_none()
    });
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 0);
    assert!(c.lock_info("r").is_none());
}

#[test]
fn restarts_reloads_and_aof_rewrites_keep_each_bound_holders_deadline() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("aof-use-rdb-preamble no")
        .start();
    let mut a = s.conn();
    token(&a.cmd(&["LOCK.ACQUIRE", "covered", "o", "5000", "BIND"]));
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 1);
    token(&a.cmd(&["LOCK.ACQUIRE", "own", "o", "300000", "BIND"]));
    // DEBUG RELOAD: the connection stays open, and so does its lease.
    assert!(a.cmd(&["DEBUG", "RELOAD"]).is("OK"));
    assert!(ttl_of(&mut a, "covered") > 500_000);
    let own = ttl_of(&mut a, "own");
    assert!(own > 200_000 && own <= 300_000, "{own}");
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "700000"]).int(), 2);
    assert!(ttl_of(&mut a, "own") > 600_000);
    // An AOF rewrite without the RDB preamble, then a restart: the holders
    // keep their deadlines (and nothing else: nobody holds the lease).
    a.cmd(&["BGREWRITEAOF"]);
    wait_until(Duration::from_secs(10), "the rewrite", || {
        a.info_field("persistence", "aof_rewrite_in_progress") == "0"
            && a.info_field("persistence", "aof_rewrite_scheduled") == "0"
    });
    // (The connection stays open until the server stops: its close would
    // free its holders. SHUTDOWN flushes the AOF: a kill could lose its
    // last second.)
    s.shutdown_save();
    drop(a);
    s.restart();
    let mut c = s.conn();
    assert!(ttl_of(&mut c, "covered") > 600_000);
    assert!(ttl_of(&mut c, "own") > 600_000);
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "1000"]).int(), 0);
    assert_eq!(c.cmd(&["LOCK.RENEW", "own", "o", "5000"]).int(), 1);
    assert!(ttl_of(&mut c, "own") <= 5_000);
    // A repeat with BIND binds it again, to this connection's lease.
    token(&c.cmd(&["LOCK.ACQUIRE", "covered", "o", "4000", "BIND"]));
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "800000"]).int(), 1);
    assert!(ttl_of(&mut c, "covered") > 700_000);
    assert_eq!(info_field_of(&mut c, "loaded_state_fixed"), 0);
}

fn info_field_of(c: &mut Conn, field: &str) -> i64 {
    let v = c.info_field("lock", &format!("lock_{field}"));
    v.trim()
        .parse()
        .unwrap_or_else(|_| panic!("lock_{field} is a number: {v:?}"))
}

/// The incremental AOF's text (the effects as the master sent them).
fn incr_aof(s: &Server) -> (std::path::PathBuf, String) {
    let path = std::fs::read_dir(s.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("the incremental AOF");
    let text = String::from_utf8_lossy(&std::fs::read(&path).expect("read the AOF")).into_owned();
    (path, text)
}

/// One command as the AOF spells it.
fn resp(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for a in args {
        out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    out
}

/// Issue 38.3's price: a bound grant is one effect (its holder's, which
/// carries the lease it follows and its own deadline), whichever way it is
/// granted; a replica and a replay of the AOF apply it to the master's
/// state, and the lease's KEEPALIVE then renews it there too.
#[test]
fn a_bound_grant_is_one_effect_the_replica_and_the_aof_apply_as_the_master_holds_it() {
    let mut master = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        .start();
    let replica = Server::start();
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    let mut a = master.conn();
    let mut other = master.conn();
    // On a free key (the one-step grant), beside another's hold (the
    // general transition), several keys at once, and a waiter granted.
    token(&a.cmd(&["LOCK.ACQUIRE", "free", "o", "60000", "BIND"]));
    token(&other.cmd(&["LOCK.READ", "shared", "x", "60000"]));
    token(&a.cmd(&["LOCK.READ", "shared", "o", "50000", "BIND"]));
    let tokens = a.cmd(&["LOCK.MACQUIRE", "2", "m1", "m2", "o", "40000", "BIND"]);
    assert_eq!(tokens.array().len(), 2, "{tokens:?}");
    token(&other.cmd(&["LOCK.ACQUIRE", "queued", "x", "60000"]));
    a.push(&[
        b"LOCK.ACQUIRE",
        b"queued",
        b"o",
        b"30000",
        b"WAIT",
        b"20000",
        b"BIND",
    ]);
    a.flush().unwrap();
    wait_until(Duration::from_secs(10), "the waiter to queue", || {
        other.lock_info("queued").is_some_and(|i| i.waiters == 1)
    });
    assert_eq!(other.cmd(&["LOCK.RELEASE", "queued", "x"]).int(), 1);
    token(&a.read_reply().unwrap());
    let keys = ["free", "shared", "m1", "m2", "queued"];
    // One effect each: no LOCK.LEASESYNC beside the holders' own.
    let (_, aof) = incr_aof(&master);
    assert!(!aof.contains("LOCK.LEASESYNC"), "{aof}");
    assert_eq!(aof.matches(":F").count(), keys.len(), "{aof}");
    wait_for_sync(&master, &replica);
    let (mut m, mut r) = (master.conn(), replica.conn());
    for key in keys {
        let on_master = m.lock_info(key);
        assert_same_lock(&on_master, &r.lock_info(key), 2_000, key);
        // A follower's key has no TTL of its own, on both.
        assert_eq!(m.cmd(&["PTTL", key]).int(), -1, "{key}");
        assert_eq!(r.cmd(&["PTTL", key]).int(), -1, "{key}");
    }
    // The lease's KEEPALIVE renews every one of them, on the replica too.
    assert_eq!(a.cmd(&["LOCK.KEEPALIVE", "900000"]).int(), 5);
    wait_for_sync(&master, &replica);
    for key in keys {
        let ttl = ttl_of(&mut r, key);
        assert!(ttl > 800_000, "{key} on the replica: {ttl}");
        assert_same_lock(&m.lock_info(key), &r.lock_info(key), 2_000, key);
    }
    // A RENEW of one is its own effect again.
    assert_eq!(a.cmd(&["LOCK.RENEW", "m1", "o", "20000"]).int(), 1);
    wait_for_sync(&master, &replica);
    assert!(ttl_of(&mut r, "m1") <= 20_000);
    // The AOF replayed alone gives the same holders and deadlines (the
    // connection is kept open until the server stops).
    let before: Vec<_> = keys.iter().map(|k| m.lock_info(k)).collect();
    master.shutdown_save();
    drop(a);
    master.restart();
    let mut c = master.conn();
    for (key, was) in keys.iter().zip(&before) {
        assert_same_lock(was, &c.lock_info(key), 5_000, key);
    }
    assert_eq!(info_field_of(&mut c, "loaded_state_fixed"), 0);
}

/// What main's build wrote before the one effect (two: `LOCK.LEASESYNC OWN
/// token lease deadline`, then the holder, its deadline naming its token)
/// still loads, beside the one effect's form, and a KEEPALIVE of the
/// lease as that build wrote it covers both.
#[test]
fn an_aof_of_the_two_effect_form_still_loads() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        .start();
    let mut c = s.conn();
    let t = token(&c.cmd(&["LOCK.ACQUIRE", "plain", "o", "600000"]));
    s.shutdown_save();
    let (path, mut text) = incr_aof(&s);
    let now = now_ms();
    let (old, new, lease) = (t + 1, t + 2, t + 3);
    let marker = (1u64 << 63) | old as u64;
    text.push_str(&resp(&[
        "LOCK.LEASESYNC",
        "OWN",
        &old.to_string(),
        &lease.to_string(),
        &(now + 300_000).to_string(),
    ]));
    text.push_str(&resp(&[
        "LOCK.SYNC",
        "old",
        &format!("exclusive:1:{old}:{marker}"),
        "o",
    ]));
    text.push_str(&resp(&[
        "LOCK.SYNC",
        "new",
        &format!("shared:2:{new}:{}:F{lease}", now + 200_000),
        "o",
    ]));
    std::fs::write(&path, &text).expect("write the AOF");
    s.restart();
    let mut c = s.conn();
    let ttl = |c: &mut Conn, key: &str| ttl_of(c, key);
    let old_ttl = ttl(&mut c, "old");
    assert!(old_ttl > 200_000 && old_ttl <= 300_000, "{old_ttl}");
    let info = c.lock_info("new").expect("new");
    assert_eq!((info.holders[0].holds, info.holders[0].token), (2, new));
    assert!(info.holders[0].ttl > 100_000 && info.holders[0].ttl <= 200_000);
    assert_eq!(c.cmd(&["PTTL", "old"]).int(), -1);
    // The old form's KEEPALIVE of that lease covers both.
    s.shutdown_save();
    let (path, mut text) = incr_aof(&s);
    let now = now_ms();
    text.push_str(&resp(&[
        "LOCK.LEASESYNC",
        "KEEP",
        &lease.to_string(),
        &now.to_string(),
        &(now + 900_000).to_string(),
    ]));
    std::fs::write(&path, &text).expect("write the AOF");
    s.restart();
    let mut c = s.conn();
    for key in ["old", "new"] {
        let ttl = ttl_of(&mut c, key);
        assert!(ttl > 800_000, "{key}: {ttl}");
    }
    assert_eq!(c.lock_info("plain").expect("plain").holders[0].token, t);
    assert_eq!(info_field_of(&mut c, "loaded_state_fixed"), 0);
    // A follower's effect naming a lease no server can have drawn is
    // refused, and the rest loads.
    s.shutdown_save();
    let (path, mut text) = incr_aof(&s);
    text.push_str(&resp(&[
        "LOCK.SYNC",
        "forged",
        &format!("exclusive:1:{}:{}:F{}", t + 4, now_ms() + 100_000, i64::MAX),
        "o",
    ]));
    std::fs::write(&path, &text).expect("write the AOF");
    s.restart();
    let mut c = s.conn();
    assert!(c.lock_info("forged").is_none());
    assert!(ttl_of(&mut c, "old") > 700_000);
}

/// RENAME and MOVE of a key whose readers are bound to many connections:
/// every holder goes along, each still follows its own connection's lease
/// (its KEEPALIVE renews it, its close releases it and no other). Before,
/// the first follower brought back let go of the key's others still to
/// come: one RENAME dropped every bound reader but one.
#[test]
fn rename_and_move_carry_every_bound_reader_of_many_connections() {
    const CONNS: usize = 10;
    const EACH: usize = 300;
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "10000"]).ok();
    let mut conns: Vec<Conn> = (0..CONNS).map(|_| s.conn()).collect();
    for (n, conn) in conns.iter_mut().enumerate() {
        for i in 0..EACH {
            let owner = format!("c{n}-r{i}");
            conn.push(&[
                b"LOCK.READ".as_slice(),
                b"k",
                owner.as_bytes(),
                b"60000",
                b"BIND",
            ]);
        }
        conn.flush().unwrap();
        for _ in 0..EACH {
            token(&conn.read_reply().unwrap());
        }
    }
    let all = (CONNS * EACH) as i64;
    let holders = |c: &mut Conn, key: &str| c.lock_info(key).map_or(0, |i| i.holders.len());
    assert_eq!(holders(&mut c, "k"), CONNS * EACH);
    c.cmd(&["RENAME", "k", "k2"]).ok();
    assert_eq!(
        holders(&mut c, "k2"),
        CONNS * EACH,
        "RENAME carried them all"
    );
    assert_eq!(info_field_of(&mut c, "bound_holders"), all);
    c.cmd(&["MOVE", "k2", "3"]).int();
    c.cmd(&["SELECT", "3"]).ok();
    assert_eq!(holders(&mut c, "k2"), CONNS * EACH, "MOVE carried them all");
    assert_eq!(info_field_of(&mut c, "bound_holders"), all);
    // Each connection renews its own, and only those.
    for conn in conns.iter_mut() {
        assert_eq!(conn.cmd(&["LOCK.KEEPALIVE", "90000"]).int(), EACH as i64);
    }
    let info = c.lock_info("k2").unwrap();
    assert!(info.holders.iter().all(|h| h.ttl > 60_000), "all renewed");
    // A close releases its own readers, no other.
    drop(conns.pop());
    wait_until(
        Duration::from_secs(30),
        "the closed one's readers released",
        || holders(&mut c, "k2") == (CONNS - 1) * EACH,
    );
    let info = c.lock_info("k2").unwrap();
    let gone = format!("c{}-", CONNS - 1);
    assert!(info
        .holders
        .iter()
        .all(|h| !h.owner.starts_with(gone.as_bytes())));
    assert_eq!(info_field_of(&mut c, "bound_holders"), all - EACH as i64);
}

/// A connection that binds and renews one holder at a time leaves its
/// lease's generation with as many batches as holders: a KEEPALIVE after
/// most of them were released still renews exactly the rest (the batches
/// gone are pruned a few at a time), and the generation's end ends every
/// holder still following it.
#[test]
fn a_generation_of_20000_batches_renews_exactly_the_live_and_ends_them_all() {
    const N: usize = 20_000;
    let s = Server::start();
    let mut c = s.conn();
    c.set_timeout(Duration::from_secs(120));
    let mut other = s.conn();
    for i in 0..N {
        let key = format!("g:{i}");
        c.push(&[
            b"LOCK.ACQUIRE".as_slice(),
            key.as_bytes(),
            b"O",
            b"1000",
            b"BIND",
        ]);
        c.push(&[b"LOCK.KEEPALIVE".as_slice(), b"600000"]);
    }
    c.flush().unwrap();
    for i in 0..N {
        token(&c.read_reply().unwrap());
        assert_eq!(c.read_reply().unwrap().int(), i as i64 + 1);
    }
    // Every other one released: their batches are gone.
    for i in (1..N).step_by(2) {
        let key = format!("g:{i}");
        c.push(&[b"LOCK.RELEASE".as_slice(), key.as_bytes(), b"O"]);
    }
    c.flush().unwrap();
    for _ in (1..N).step_by(2) {
        assert_eq!(c.read_reply().unwrap().int(), 1);
    }
    let live = (N / 2) as i64;
    for _ in 0..2_000 {
        c.push(&[b"LOCK.KEEPALIVE".as_slice(), b"600000"]);
    }
    c.flush().unwrap();
    for _ in 0..2_000 {
        assert_eq!(c.read_reply().unwrap().int(), live);
    }
    assert_eq!(info_field_of(&mut other, "bound_holders"), live);
    // The generation's end (a short KEEPALIVE) ends them all.
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "1500"]).int(), live);
    wait_until(
        Duration::from_secs(60),
        "the generation's holders ended",
        || info_field_of(&mut other, "keys") == 0,
    );
    assert_eq!(info_field_of(&mut other, "holders_exclusive"), 0);
    assert_eq!(info_field_of(&mut other, "bound_holders"), 0);
    assert_eq!(info_field_of(&mut other, "expired_leases"), live);
    assert_eq!(c.cmd(&["LOCK.KEEPALIVE", "600000"]).int(), 0);
}
