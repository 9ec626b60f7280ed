//! Replication: a replica's LOCK.INFO and PTTL equal the master's after every
//! kind of change; refused and bad requests replicate nothing; a replica refuses
//! writes; a promoted replica issues tokens above everything it received.

use crate::common::*;
use std::time::Duration;

/// ttl-ms-left on the master and the replica may differ by this, beyond the
/// time the reads took (measured: `assert_replicated`).
const SLACK_MS: i64 = 100;

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

/// A master whose replication offset moves only with what it replicates (no
/// periodic PING to replicas during a test).
fn quiet_master() -> Server {
    Server::builder()
        .config("repl-ping-replica-period 3600")
        .start()
}

/// Asserts LOCK.INFO and PTTL of `keys` are the same on both servers.
#[track_caller]
fn assert_replicated(master: &Server, replica: &Server, keys: &[&[u8]], what: &str) {
    wait_for_sync(master, replica);
    let mut m = master.conn();
    let mut r = replica.conn();
    for k in keys {
        // The two sides are read one after the other: their ttls may be
        // apart by the time between the reads too (a loaded machine's
        // LOCK.INFO of thousands of holders takes a while).
        let started = std::time::Instant::now();
        let mi = m.lock_info(k);
        let ri = r.lock_info(k);
        let mp = m.pttl(k);
        let rp = r.pttl(k);
        let between = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let slack = SLACK_MS.saturating_add(between);
        let what_k = format!("{what}: key {}", show(k));
        assert_same_lock(&mi, &ri, slack, &what_k);
        if mp < 0 || rp < 0 {
            // -2: no key (or expired), -1: no TTL. An expired key may still be
            // listed by one side before its expiry reaches the other.
            if mi.is_some() {
                assert_eq!(mp, rp, "{what_k}: PTTL on master and replica");
            }
        } else {
            assert!(
                (mp - rp).abs() <= slack,
                "{what_k}: PTTL {mp} (master) vs {rp} (replica)"
            );
        }
    }
}

#[test]
fn the_replicas_lock_info_equals_the_masters() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let keys: &[&[u8]] = &[b"x", b"r", b"s", b"e", b"bin\0"];

    let t = token(m.acquire("x", "a", 60_000));
    assert_replicated(&master, &replica, keys, "ACQUIRE");
    // Idempotent retry: deadline reset.
    sleep_ms(50);
    assert_eq!(token(m.acquire("x", "a", 90_000)), t);
    assert_replicated(&master, &replica, keys, "ACQUIRE retry");
    // Reentrant holds.
    for _ in 0..3 {
        token(m.racquire("r", "a", 50_000));
    }
    assert_replicated(&master, &replica, keys, "RACQUIRE x3");
    assert_eq!(
        replica.conn().lock_info("r").expect("r").holder("a").holds,
        3
    );
    assert_eq!(m.release("r", "a").int(), 0);
    assert_replicated(&master, &replica, keys, "RELEASE (0)");
    assert_eq!(
        replica.conn().lock_info("r").expect("r").holder("a").holds,
        2
    );
    // Readers.
    token(m.read("s", "r1", 40_000));
    token(m.read("s", "r2", 70_000));
    token(m.read("s", "r1", 45_000));
    assert_replicated(&master, &replica, keys, "READ");
    assert_eq!(m.release("s", "r2").int(), 1);
    assert_replicated(&master, &replica, keys, "RELEASE of a reader");
    // RENEW.
    assert_eq!(m.renew("x", "a", 120_000).int(), 1);
    assert_eq!(m.renew("s", "r1", 10_000).int(), 1);
    assert_replicated(&master, &replica, keys, "RENEW");
    // Binary owner.
    token(m.cmd(&[b"LOCK.ACQUIRE".as_slice(), b"bin\0", b"o\0\xff", b"30000"]));
    assert_replicated(&master, &replica, keys, "binary owner");
    // Release to free.
    assert_eq!(m.release("r", "a").int(), 0);
    assert_eq!(m.release("r", "a").int(), 1);
    assert_replicated(&master, &replica, keys, "RELEASE (1)");
    assert!(replica.conn().lock_info("r").is_none());
    assert_eq!(replica.conn().cmd(&["EXISTS", "r"]).int(), 0);
    // Expiry.
    token(m.acquire("e", "a", 400));
    assert_replicated(&master, &replica, keys, "short lease");
    sleep_ms(600);
    assert!(
        replica.conn().lock_info("e").is_none(),
        "expired on the replica"
    );
    assert!(m.lock_info("e").is_none(), "expired on the master");
    // A new grant after the expiry.
    let t2 = token(m.acquire("e", "b", 30_000));
    assert_replicated(&master, &replica, keys, "grant after expiry");
    assert_eq!(
        replica.conn().lock_info("e").expect("e").holder("b").token,
        t2
    );
    // DEL frees on both.
    m.cmd(&["DEL", "x"]).int();
    assert_replicated(&master, &replica, keys, "DEL");
    assert!(replica.conn().lock_info("x").is_none());
}

#[test]
fn expiry_on_the_replica_needs_no_delete_from_the_master() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    m.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).ok();
    let start = std::time::Instant::now();
    token(m.acquire("k", "a", 500));
    // No Redis TTL: the master never deletes the key, so the replica must judge
    // the deadline itself.
    assert_eq!(m.cmd(&["PERSIST", "k"]).int(), 1);
    token(m.read("s", "r1", 500));
    let t2 = token(m.read("s", "r2", 60_000));
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    let listed = r.lock_info("k").is_some();
    assert!(
        listed || start.elapsed().as_millis() >= 500,
        "the replica got the lock"
    );
    sleep_ms(700);
    assert!(
        r.lock_info("k").is_none(),
        "the replica still lists an expired holder"
    );
    let s = r.lock_info("s").expect("r2 still reads");
    assert_eq!(s.holders.len(), 1, "{s:?}");
    assert_eq!(s.holder("r2").token, t2);
}

#[test]
fn a_replica_that_syncs_late_gets_the_same_state() {
    // Full sync (RDB transfer) rather than the command stream.
    let master = Server::start();
    let mut m = master.conn();
    let mut max = 0;
    max = max.max(token(m.racquire("r", "a", 60_000)));
    token(m.racquire("r", "a", 60_000));
    max = max.max(token(m.read("s", "r1", 50_000)));
    max = max.max(token(m.read("s", "r2", 80_000)));
    max = max.max(token(m.acquire("x", "a", 70_000)));
    assert_eq!(m.cmd(&["PERSIST", "x"]).int(), 1);
    for i in 0..5 {
        max = max.max(token(m.acquire(&format!("gone{i}"), "a", 60_000)));
        assert_eq!(m.release(&format!("gone{i}"), "a").int(), 1);
    }
    let replica = Server::start();
    replica.replicaof(&master);
    assert_replicated(
        &master,
        &replica,
        &[b"r", b"s", b"x", b"gone0"],
        "full sync",
    );
    replica.promote();
    let mut r = replica.conn();
    let t = token(r.acquire("new", "b", 10_000));
    assert!(
        t > max,
        "promoted replica issued {t}, master had issued up to {max}"
    );
}

#[test]
fn a_refused_or_bad_request_replicates_nothing() {
    let master = quiet_master();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    m.cmd(&["SET", "str", "v"]).ok();
    token(m.racquire("k", "o", 100_000));
    token(m.racquire("k", "o", 100_000));
    token(m.read("sh", "o", 100_000));
    token(m.read("sh", "r2", 100_000));
    wait_for_sync(&master, &replica);
    let offset = master.repl_offset();

    // Refusals.
    assert!(m.acquire("k", "b", 10_000).is_nil());
    assert!(m.racquire("k", "b", 10_000).is_nil());
    assert!(m.read("k", "b", 10_000).is_nil());
    assert!(m.acquire("sh", "w", 10_000).is_nil());
    assert_eq!(
        master.repl_offset(),
        offset,
        "a refused grant was replicated"
    );
    // Nothing held: RELEASE nil, RENEW 0.
    assert!(m.release("k", "b").is_nil());
    assert!(m.release("free", "b").is_nil());
    assert_eq!(m.renew("k", "b", 10_000).int(), 0);
    assert_eq!(m.renew("free", "b", 10_000).int(), 0);
    assert_eq!(
        master.repl_offset(),
        offset,
        "a RELEASE/RENEW of nothing was replicated"
    );
    // Mode-change errors.
    assert!(m.acquire("sh", "o", 10_000).is_err());
    assert!(m.read("k", "o", 10_000).is_err());
    // LOCK.INFO.
    m.lock_info("k");
    m.lock_info("free");
    assert_eq!(
        master.repl_offset(),
        offset,
        "an error or LOCK.INFO was replicated"
    );
    // Every bad input, on a held, a shared and a free key.
    for (key, holder) in [("k", "o"), ("sh", "o"), ("free", "o")] {
        for (args, expect) in bad_inputs(key, holder, "str") {
            let r = m.cmdv(&args);
            expect.check(&args, &r);
            let now = master.repl_offset();
            assert_eq!(
                now,
                offset,
                "{:?} was replicated",
                args.iter().map(|a| show(a)).collect::<Vec<_>>()
            );
        }
    }
    // The replica agrees, and a real change does move the offset.
    assert_replicated(
        &master,
        &replica,
        &[b"k", b"sh", b"free"],
        "after bad input",
    );
    assert_eq!(m.release("k", "o").int(), 0);
    assert!(
        master.repl_offset() > offset,
        "a RELEASE was not replicated"
    );
    assert_replicated(&master, &replica, &[b"k"], "after a RELEASE");
    m.ping();
    replica.conn().ping();
}

#[test]
fn a_replica_refuses_writes_and_answers_lock_info() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let t = token(m.acquire("k", "a", 60_000));
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    for args in [
        vec!["LOCK.ACQUIRE", "k", "a", "1000"],
        vec!["LOCK.ACQUIRE", "free", "a", "1000"],
        vec!["LOCK.RACQUIRE", "free", "a", "1000"],
        vec!["LOCK.READ", "free", "a", "1000"],
        vec!["LOCK.ACQUIRE", "free", "a", "1000", "WAIT", "0"],
        vec!["LOCK.RELEASE", "k", "a"],
        vec!["LOCK.RENEW", "k", "a", "1000"],
    ] {
        let reply = r.cmd(&args);
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("READONLY")),
            "{args:?} on a replica: {reply:?}"
        );
    }
    let i = r.lock_info("k").expect("LOCK.INFO on the replica");
    assert_eq!(i.holder("a").token, t);
    assert!(r.lock_info("free").is_none());
    assert_replicated(&master, &replica, &[b"k", b"free"], "after refused writes");
    // In RESP3 too.
    let mut r3 = replica.conn();
    r3.hello3();
    assert!(matches!(r3.cmd(&["LOCK.INFO", "k"]), Reply::Map(_)));
}

#[test]
fn a_promoted_replica_issues_tokens_above_every_token_it_received() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let mut max = 0;
    for i in 0..10 {
        let key = format!("k{i}");
        max = max.max(token(m.acquire(&key, "a", 60_000)));
        if i % 2 == 0 {
            assert_eq!(m.release(&key, "a").int(), 1);
        }
    }
    max = max.max(token(m.read("s", "r1", 60_000)));
    max = max.max(token(m.read("s", "r2", 60_000)));
    assert_eq!(m.release("s", "r2").int(), 1);
    // The last tokens issued are released ones.
    for i in 0..5 {
        max = max.max(token(m.acquire("last", &format!("o{i}"), 60_000)));
        assert_eq!(m.release("last", &format!("o{i}")).int(), 1);
    }
    max = max.max(token(m.acquire("short", "a", 100)));
    wait_for_sync(&master, &replica);
    let keys: &[&[u8]] = &[b"k1", b"k3", b"s", b"last"];
    let mut r = replica.conn();
    let read_before = std::time::Instant::now();
    let before: Vec<_> = keys.iter().map(|k| r.lock_info(k)).collect();
    master.kill9();
    replica.promote();
    sleep_ms(200); // "short" expires
    let mut r = replica.conn();
    // The locks it received still hold (their ttls less the time between
    // the two reads, however long a loaded machine made it).
    for (k, b) in keys.iter().zip(&before) {
        let a = r.lock_info(k);
        let slack = 100 + i64::try_from(read_before.elapsed().as_millis()).unwrap_or(i64::MAX);
        assert_same_lock(b, &a, slack, &format!("key {} after promotion", show(k)));
    }
    assert!(r.acquire("k1", "b", 10_000).is_nil());
    assert!(r.lock_info("short").is_none());
    let t1 = token(r.acquire("short", "b", 10_000));
    let t2 = token(r.acquire("k0", "b", 10_000));
    let t3 = token(r.read("s", "r3", 10_000));
    assert!(
        t1 > max && t2 > t1 && t3 > t2,
        "{t1}, {t2}, {t3} after {max}"
    );
}

/// `replica-read-only no` makes Redis accept writes on a replica; a lock
/// granted there would issue the master's tokens to other owners.
#[test]
fn a_writable_replica_still_refuses_every_lock_write() {
    let master = Server::start();
    let replica = Server::builder().config("replica-read-only no").start();
    replica.replicaof(&master);
    let mut m = master.conn();
    token(m.acquire("k", "a", 60_000));
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    for args in [
        vec!["LOCK.ACQUIRE", "free", "a", "1000"],
        vec!["LOCK.RACQUIRE", "free", "a", "1000"],
        vec!["LOCK.READ", "free", "a", "1000"],
        vec!["LOCK.ACQUIRE", "k", "a", "1000", "WAIT", "100"],
        vec!["LOCK.RELEASE", "k", "a"],
        vec!["LOCK.RENEW", "k", "a", "1000"],
    ] {
        let reply = r.cmd(&args);
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("READONLY")),
            "{args:?} on a writable replica: {reply:?}"
        );
    }
    // Plain writes are still the user's choice.
    r.cmd(&["SET", "plain", "1"]).ok();
    assert!(r.lock_info("free").is_none());
    assert_replicated(&master, &replica, &[b"k", b"free"], "after refused writes");
}

/// The master's stream is authoritative: an effect sets the state it carries
/// whatever stale state the replica had (here: a lock Redis 7.0's DEBUG
/// RELOAD dropped on the master without telling the replica).
#[test]
fn the_masters_effect_overrides_stale_state_on_the_replica() {
    let master = quiet_master();
    let replica = Server::builder().config("replica-read-only no").start();
    replica.replicaof(&master);
    let mut m = master.conn();
    m.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "0"]).ok();
    token(m.acquire("x", "A", 100));
    // Stale state written on the replica itself (writable replica), which the
    // master never hears of: another type, and a lock in the other mode.
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    r.cmd(&["SET", "y", "stale"]).ok();
    sleep_ms(200);
    m.cmd(&["DEBUG", "RELOAD"]).ok();
    m.cmd(&["DEBUG", "SET-ACTIVE-EXPIRE", "1"]).ok();
    let tb = token(m.acquire("x", "B", 100_000));
    token(m.read("y", "R", 100_000));
    assert_eq!(m.cmd(&["WAIT", "1", "2000"]).int(), 1);
    wait_for_sync(&master, &replica);
    let i = r.lock_info("x").expect("the replica has B's lock");
    assert_eq!(i.holders.len(), 1);
    assert_eq!(i.holder("B").token, tb);
    assert_replicated(&master, &replica, &[b"x", b"y"], "after stale state");
    assert!(!replica.log_tail(200).contains("invalid lock state"));
}

/// With nobody to receive them (no replica, no backlog, no AOF) effects are
/// not built (`replication::QUIET`); whatever can give them a listener
/// stops that before the next write. A replica that attaches later ends with
/// the master's state, whether the master forks its snapshot at once (a
/// disk-based sync: the writes right after the fork must be sent) or after
/// a diskless sync's delay (the writes during the delay are in the
/// snapshot).
#[test]
fn a_replica_attaching_to_a_server_that_had_none_gets_every_change() {
    for (diskless, delay) in [("no", "0"), ("yes", "1")] {
        let master = Server::builder()
            .config(&format!("repl-diskless-sync {diskless}"))
            .config(&format!("repl-diskless-sync-delay {delay}"))
            .start();
        let mut m = master.conn();
        // The module's first look finds nobody listening (the cron, each
        // second); its next look is a second away after that.
        sleep_ms(1_200);
        token(m.acquire("before", "a", 60_000));
        token(m.read("shared", "r1", 60_000));
        let replica = Server::start();
        let mut r = replica.conn();
        r.cmd(&["REPLICAOF", "127.0.0.1", &master.port.to_string()])
            .ok();
        let what = format!("diskless {diskless}, delay {delay}");
        let mut keys: Vec<String> = vec!["before".into(), "shared".into()];
        for i in 0..40 {
            let k = format!("during{i}");
            token(m.acquire(&k, "a", 60_000));
            if i % 3 == 0 {
                assert_eq!(m.release(&k, "a").int(), 1, "{what}");
            }
            token(m.read("shared", &format!("r{}", i + 2), 60_000));
            keys.push(k);
            sleep_ms(5);
        }
        wait_for_sync(&master, &replica);
        token(m.acquire("after", "b", 60_000));
        assert_eq!(m.release("before", "a").int(), 1);
        keys.push("after".into());
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        assert_replicated(&master, &replica, &keys, &what);
    }
}

/// The same for an AOF turned on while the server runs: every grant made
/// from then on (during its first rewrite too) is in the file, and a kill -9
/// loses none of them.
#[test]
fn an_aof_turned_on_at_run_time_gets_every_change() {
    let mut s = Server::builder().config("appendfsync always").start();
    let mut c = s.conn();
    // Enough data for the first rewrite to take a while.
    c.cmd(&["DEBUG", "POPULATE", "300000", "filler", "64"]).ok();
    sleep_ms(1_200);
    let mut held = vec![(
        "before".to_string(),
        token(c.acquire("before", "a", 60_000)),
    )];
    c.cmd(&["CONFIG", "SET", "appendonly", "yes"]).ok();
    let mut during = 0;
    for i in 0..200 {
        let k = format!("k{i}");
        held.push((k.clone(), token(c.acquire(&k, "a", 60_000))));
        if c.info_field("persistence", "aof_rewrite_in_progress") == "1" {
            during += 1;
        }
    }
    wait_until(Duration::from_secs(20), "the AOF rewrite", || {
        c.info_field("persistence", "aof_rewrite_in_progress") == "0"
            && c.info_field("persistence", "aof_rewrite_scheduled") == "0"
    });
    held.push(("after".into(), token(c.acquire("after", "a", 60_000))));
    assert!(during > 0, "no grant was made while the rewrite ran");
    drop(c);
    s.add_config("appendonly yes");
    s.kill9();
    s.restart();
    let mut c = s.conn();
    for (k, t) in held {
        let info = c.lock_info(&k).map(|i| i.holders[0].token);
        assert_eq!(info, Some(t), "{k} after a kill -9");
    }
}

/// Issue 38.1 on a replica: readers granted one by one on a master (each
/// grant one `LOCK.SYNC` of its holder, applied in one walk of the key's
/// holders), one re-entered, one released: the replica holds the same
/// readers, holds, tokens and deadlines. (2,000 here: the master's own
/// grants walk its holders too, which in this debug build takes minutes
/// for 10,000; the AOF test below and the bench's stalls section apply
/// 10,000.)
#[test]
fn readers_granted_on_a_master_one_by_one_are_the_replicas() {
    let n = 2_000;
    let master = Server::builder()
        .config("lock.max-holders 20000")
        .config("repl-ping-replica-period 3600")
        .start();
    let replica = Server::builder().config("lock.max-holders 20000").start();
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    let mut m = master.conn();
    // Deadlines apart (the replica's sweep and expiry follow them), pipelined.
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        for i in chunk {
            let (owner, ttl) = (format!("reader-{i}"), (600_000 + i % 1_000).to_string());
            m.push(&[b"LOCK.READ", b"big", owner.as_bytes(), ttl.as_bytes()]);
        }
        m.flush().expect("flush");
        for i in chunk {
            let r = m.read_reply().expect("reply");
            assert!(matches!(r, Reply::Int(t) if t > 0), "grant {i}: {r:?}");
        }
    }
    token(m.cmd(&["LOCK.READ", "big", "reader-5", "900000"]));
    assert_eq!(m.cmd(&["LOCK.RELEASE", "big", "reader-7"]).int(), 1);
    assert_replicated(&master, &replica, &[b"big"], "readers one by one");
    let info = m.lock_info("big").expect("the master holds big");
    assert_eq!(info.holders.len(), n - 1);
    assert_eq!(info.holder("reader-5").holds, 2);
    let stats = replica.conn().info("commandstats");
    let applied = info_get(&stats, "cmdstat_lock.sync")
        .and_then(|v| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls=")?.parse::<usize>().ok())
        })
        .expect("the replica counts LOCK.SYNC");
    assert!(applied > n, "each grant applied as one effect: {applied}");
}

/// `calls` of `cmdstat_<name>` on `c` (0 when never called).
fn calls(c: &mut Conn, name: &str) -> i64 {
    let text = c.info("commandstats");
    let prefix = format!("cmdstat_{name}:calls=");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count of calls"))
}

/// Issue 38: a bound `LOCK.MACQUIRE`, granted at once or after waiting,
/// replicates each holder once (its effect carries the connection's
/// lease): once it took a step a key after its grants and replicated each
/// holder twice. The replica's state is the master's, and the holders
/// follow the connection's lease (KEEPALIVE renews them).
#[test]
fn a_bound_macquire_replicates_each_holder_once() {
    let master = quiet_master();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut r = replica.conn();
    let mut b = master.conn();
    // At once: three keys, three effects.
    r.cmd(&["CONFIG", "RESETSTAT"]).ok();
    let got = b.cmd(&["LOCK.MACQUIRE", "3", "a", "b", "c", "O", "60000", "BIND"]);
    assert!(matches!(&got, Reply::Array(t) if t.len() == 3), "{got:?}");
    assert_replicated(&master, &replica, &[b"a", b"b", b"c"], "a bound MACQUIRE");
    assert_eq!(
        calls(&mut r, "lock.sync"),
        3,
        "one effect a holder\n{}",
        r.info("commandstats")
    );
    // After waiting: the release that frees `z`, then three grants.
    let mut h = master.conn();
    token(h.acquire("z", "H", 60_000));
    let mut w = master.conn();
    w.send(&[
        "LOCK.MACQUIRE",
        "3",
        "x",
        "y",
        "z",
        "W",
        "60000",
        "WAIT",
        "20000",
        "BIND",
    ])
    .expect("send");
    wait_until(Duration::from_secs(5), "the request to wait", || {
        h.info_field("lock", "lock_waiters") == "1"
    });
    wait_for_sync(&master, &replica);
    r.cmd(&["CONFIG", "RESETSTAT"]).ok();
    assert_eq!(h.release("z", "H").int(), 1);
    w.set_timeout(Duration::from_secs(10));
    let got = w.read_reply().expect("the grant");
    assert!(matches!(&got, Reply::Array(t) if t.len() == 3), "{got:?}");
    assert_replicated(
        &master,
        &replica,
        &[b"x", b"y", b"z"],
        "a bound MACQUIRE after waiting",
    );
    assert_eq!(
        calls(&mut r, "lock.sync"),
        4,
        "the release and one effect a holder\n{}",
        r.info("commandstats")
    );
    // Both connections' holders follow their leases.
    assert_eq!(b.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 3);
    w.set_timeout(Duration::from_secs(5));
    assert_eq!(w.cmd(&["LOCK.KEEPALIVE", "60000"]).int(), 3);
}
