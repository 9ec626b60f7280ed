//! Redis Cluster: 3 masters, 3 replicas on 127.0.0.1, created by
//! `redis-cli --cluster create` (`common/cluster.rs`), used through a small
//! cluster client (slot routing, MOVED, ASK).
//!
//! - Locks on keys over all slots: routing (key specs), hash tags, `MOVED`
//!   from a wrong node, replicas' `LOCK.INFO`.
//! - A slot holding locks migrated to another master (`CLUSTER SETSLOT`,
//!   `MIGRATE`) while clients use other keys of that slot (ASK): holders,
//!   holds, tokens and absolute deadlines move with the keys; the target's
//!   counter observes the migrated tokens when it loads them (RESTORE), so its
//!   new tokens are above them, on its replica too; then `CLUSTER FAILOVER` of
//!   the target keeps them.
//! - `CLUSTER FAILOVER` under load: every acknowledged grant is on the new
//!   master (a manual failover waits for the replica), new tokens are above
//!   the old master's.
//! - Leases with waiters ending during the write pause of `CLUSTER FAILOVER`.
//! - A client waiting on the source for a lock that `MIGRATE` moves away.
//!
//! Tokens are per server: a migrated key's tokens are comparable on the target
//! because the target observes them; tokens of different masters are not.

use crate::common::cluster::*;
use crate::common::load::*;
use crate::common::*;
use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

fn last_token(s: &Server) -> i64 {
    s.info_field("lock", "lock_last_token")
        .parse()
        .expect("lock_last_token is an integer")
}

/// A connection to a replica that answers reads of its master's slots.
fn readonly(s: &Server) -> Conn {
    let mut c = s.conn();
    c.cmd(&["READONLY"]).ok();
    c
}

/// A hash tag `{<prefix><n>}` whose slot the node `owner` serves.
fn tag_on(cl: &Cluster, owner: usize, prefix: &str) -> (String, u16) {
    let map = slot_ranges(&mut cl.nodes[0].conn()).expect("CLUSTER SLOTS");
    let port = cl.nodes[owner].port;
    for n in 0..10_000 {
        let tag = format!("{{{prefix}{n}}}");
        let slot = key_slot(tag.as_bytes());
        if map
            .iter()
            .any(|(a, b, p)| *a <= slot && slot <= *b && *p == port)
        {
            return (tag, slot);
        }
    }
    panic!("no hash tag for node {port}");
}

/// Moves `slot` from `source` to `target`: IMPORTING / MIGRATING, then MIGRATE
/// of every key (one at a time, so clients see a half-moved slot), then NODE
/// on every master. Returns how many keys moved.
fn migrate_slot(cl: &Cluster, slot: u16, source: usize, target: usize) -> usize {
    let src_id = cl.id(source);
    let tgt_id = cl.id(target);
    let s = slot.to_string();
    let mut src = cl.nodes[source].conn();
    let mut tgt = cl.nodes[target].conn();
    tgt.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id])
        .ok();
    src.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &tgt_id])
        .ok();
    let mut moved = 0;
    for _ in 0..200 {
        let keys = src.cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "1"]);
        let keys = keys.array();
        if keys.is_empty() {
            break;
        }
        let mut args: Vec<Vec<u8>> = vec![
            b"MIGRATE".to_vec(),
            b"127.0.0.1".to_vec(),
            cl.nodes[target].port.to_string().into_bytes(),
            Vec::new(),
            b"0".to_vec(),
            b"5000".to_vec(),
            b"KEYS".to_vec(),
        ];
        args.extend(keys.iter().map(|k| k.bulk().to_vec()));
        let r = src.cmdv(&args);
        assert!(
            matches!(&r, Reply::Status(s) if s == "OK" || s == "NOKEY"),
            "MIGRATE {:?}: {r:?}",
            keys
        );
        moved += keys.len();
        sleep_ms(15);
    }
    assert_eq!(
        src.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s]).int(),
        0,
        "the source still has keys in slot {slot}"
    );
    tgt.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &tgt_id]).ok();
    src.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &tgt_id]).ok();
    for m in cl.masters() {
        if m != source && m != target {
            cl.nodes[m]
                .conn()
                .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &tgt_id])
                .ok();
        }
    }
    cl.wait_slot_owner(slot, cl.nodes[target].port, Duration::from_secs(20));
    moved
}

/// LOCK.INFO of `key` through the cluster client with when it was read.
fn observe_one(cc: &mut ClusterClient, key: &str) -> Observed {
    observe(cc, &[key.as_bytes().to_vec()]).remove(0)
}

/// Same holders, holds, tokens, and the same absolute deadlines (each
/// deadline's bounds from the two reads overlap). A lock whose leases had
/// all run out by the second read may be gone.
#[track_caller]
fn assert_same_deadlines(before: &Observed, after: &Observed, what: &str) {
    let (b, a) = match (&before.info, &after.info) {
        (Some(b), Some(a)) => (b, a),
        (None, None) => return,
        (Some(b), None) => {
            for h in &b.holders {
                let (lo, _) = before.deadline(h);
                assert!(
                    lo <= after.acked_ms + 3,
                    "{what}: gone, but {} held until at least {lo} (read at {})",
                    show(&h.owner),
                    after.acked_ms
                );
            }
            return;
        }
        _ => panic!("{what}: {:?} -> {:?}", before.info, after.info),
    };
    assert_eq!(b.stable(), a.stable(), "{what}: holders, holds, tokens");
    for (x, y) in b.holders.iter().zip(&a.holders) {
        let (blo, bhi) = before.deadline(x);
        let (alo, ahi) = after.deadline(y);
        assert!(
            alo <= bhi + 3 && blo <= ahi + 3,
            "{what}: owner {}: deadline in [{blo}, {bhi}] before, [{alo}, {ahi}] after",
            show(&x.owner)
        );
    }
    // The key's TTL is still its latest deadline.
    let latest = a.holders.iter().map(|h| h.ttl).max().unwrap_or(0);
    assert!(
        after.pttl <= latest + 5 && after.pttl >= latest - 200,
        "{what}: PTTL {} vs latest deadline {latest} ms away",
        after.pttl
    );
}

/// `assert_same_lock` on the holders with more than a second left on both
/// sides (a lease may run out between two reads).
#[track_caller]
fn assert_same_live_lock(a: &Option<LockInfo>, b: &Option<LockInfo>, slack: i64, what: &str) {
    let live = |i: &Option<LockInfo>| -> Option<LockInfo> {
        let mut i = i.clone()?;
        i.holders.retain(|h| h.ttl > 1_000);
        (!i.holders.is_empty()).then_some(i)
    };
    let (mut la, mut lb) = (live(a), live(b));
    // Keep only owners live on both sides; the others may be expiring.
    if let (Some(x), Some(y)) = (&mut la, &mut lb) {
        let xo: Vec<Vec<u8>> = x.holders.iter().map(|h| h.owner.clone()).collect();
        let yo: Vec<Vec<u8>> = y.holders.iter().map(|h| h.owner.clone()).collect();
        x.holders.retain(|h| yo.contains(&h.owner));
        y.holders.retain(|h| xo.contains(&h.owner));
    }
    let near_expiry = |i: &Option<LockInfo>| {
        i.as_ref()
            .is_some_and(|i| i.holders.iter().any(|h| h.ttl <= 1_500))
    };
    if la.is_some() != lb.is_some() && (near_expiry(a) || near_expiry(b)) {
        return;
    }
    assert_same_lock(&la, &lb, slack, what);
}

/// A key, its mode and its holders' `(owner, holds, token)`.
type Expected = (String, String, Vec<(String, i64, i64)>);

#[test]
fn locks_over_all_slots_and_a_migrated_slot_keep_holders_deadlines_and_tokens() {
    let seed = test_seed("cluster_slots_and_migration");
    let cl = Cluster::start();
    let ports = cl.ports();
    let mut cc = ClusterClient::new(&ports);

    // --- The client's slot function is the server's.
    assert_eq!(crc16(b"123456789"), 0x31c3);
    let mut c0 = cl.nodes[0].conn();
    for k in [
        "",
        "a",
        "lock:1",
        "{user1}.a",
        "{user1}.b",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "{}x",
        "a{b",
    ] {
        let server = c0.cmd(&["CLUSTER", "KEYSLOT", k]).int();
        assert_eq!(key_slot(k.as_bytes()) as i64, server, "slot of {k:?}");
    }

    // --- Locks on keys over all slots, every kind.
    let n = 300;
    let mut expect: Vec<Expected> = Vec::new();
    let mut per_port: BTreeMap<u16, Vec<i64>> = BTreeMap::new();
    let mut issue = |cc: &mut ClusterClient, args: &[&str]| -> i64 {
        let t = token(cc.cmd(args));
        per_port.entry(cc.last_port()).or_default().push(t);
        t
    };
    for i in 0..n {
        let key = format!("lock:{i}");
        let slot = key_slot(key.as_bytes());
        match i % 3 {
            0 => {
                let t = issue(&mut cc, &["LOCK.ACQUIRE", &key, "a", "60000"]);
                expect.push((key.clone(), "exclusive".into(), vec![("a".into(), 1, t)]));
            }
            1 => {
                let t = issue(&mut cc, &["LOCK.RACQUIRE", &key, "a", "60000"]);
                assert_eq!(cc.cmd(&["LOCK.RACQUIRE", &key, "a", "60000"]).int(), t);
                expect.push((key.clone(), "exclusive".into(), vec![("a".into(), 2, t)]));
            }
            _ => {
                let t1 = issue(&mut cc, &["LOCK.READ", &key, "r1", "60000"]);
                let t2 = issue(&mut cc, &["LOCK.READ", &key, "r2", "60000"]);
                expect.push((
                    key.clone(),
                    "shared".into(),
                    vec![("r1".into(), 1, t1), ("r2".into(), 1, t2)],
                ));
            }
        }
        assert_eq!(
            cc.last_port(),
            cc.node_for(key.as_bytes()),
            "{key} (slot {slot}) was served by its slot's master"
        );
    }
    // Each master served some, with tokens strictly increasing in issue order.
    assert_eq!(per_port.len(), 3, "keys on every master: {per_port:?}");
    for (port, tokens) in &per_port {
        assert!(
            tokens.len() >= 50,
            "master {port} served {} grants",
            tokens.len()
        );
        assert!(
            tokens.windows(2).all(|w| w[1] > w[0]),
            "tokens of master {port} increase"
        );
    }
    for (key, mode, holders) in &expect {
        let info = cc.lock_info(key).unwrap_or_else(|| panic!("{key} is held"));
        let got: Vec<(String, i64, i64)> = info
            .holders
            .iter()
            .map(|h| {
                (
                    String::from_utf8_lossy(&h.owner).into_owned(),
                    h.holds,
                    h.token,
                )
            })
            .collect();
        assert_eq!((&info.mode, &got), (mode, holders), "LOCK.INFO {key}");
    }
    // Hash tags: one slot, one node.
    let ta = token(cc.cmd(&["LOCK.ACQUIRE", "{user1}.a", "a", "60000"]));
    let pa = cc.last_port();
    let tb = token(cc.cmd(&["LOCK.ACQUIRE", "{user1}.b", "a", "60000"]));
    assert_eq!(cc.last_port(), pa, "hash-tagged keys on one node");
    assert!(tb > ta);
    // A wrong node answers MOVED to the right one, for every command.
    let masters = cl.masters();
    let key = "lock:0";
    let slot = key_slot(key.as_bytes());
    let owner = cl.index_of(cc.node_for(key.as_bytes()));
    let wrong = *masters
        .iter()
        .find(|&&m| m != owner)
        .expect("another master");
    let mut w = cl.nodes[wrong].conn();
    for args in [
        vec!["LOCK.ACQUIRE", key, "z", "1000"],
        vec!["LOCK.RELEASE", key, "a"],
        vec!["LOCK.INFO", key],
    ] {
        let r = w.cmd(&args);
        assert_eq!(
            r,
            Reply::Error(format!("MOVED {slot} 127.0.0.1:{}", cl.nodes[owner].port)),
            "{args:?} on a node that does not serve slot {slot}"
        );
    }
    // Every key lives on its master only; replicas show the same locks.
    let mut total = 0;
    for &m in &masters {
        total += cl.nodes[m].conn().cmd(&["DBSIZE"]).int();
        let r = cl.replica_of(m);
        wait_for_sync(&cl.nodes[m], &cl.nodes[r]);
        let mut mc = cl.nodes[m].conn();
        let mut rc = readonly(&cl.nodes[r]);
        for (key, _, _) in expect
            .iter()
            .filter(|(k, _, _)| cc.node_for(k.as_bytes()) == cl.nodes[m].port)
        {
            assert_same_lock(
                &mc.lock_info(key),
                &rc.lock_info(key),
                200,
                &format!("{key} on master {} and its replica", cl.nodes[m].port),
            );
        }
    }
    assert_eq!(total, n as i64 + 2, "keys over the masters");

    // --- Migration of a slot holding locks, while clients use the slot.
    // From the master with the highest counter to the one with the lowest,
    // so the migrated tokens are above the target's counter (checked below).
    let by_counter = cl.masters_by_counter();
    let target = by_counter[0];
    let source = by_counter[2];
    let (tag, slot) = tag_on(&cl, source, "mig");
    let k = |s: &str| format!("{tag}:{s}");
    let mut mig = Vec::new();
    mig.push(token(cc.cmd(&["LOCK.ACQUIRE", &k("x"), "holder", "30000"])));
    assert_eq!(cc.last_port(), cl.nodes[source].port);
    for _ in 0..3 {
        mig.push(token(cc.cmd(&[
            "LOCK.RACQUIRE",
            &k("r"),
            "holder",
            "30000",
        ])));
    }
    assert_eq!(cc.cmd(&["LOCK.RELEASE", &k("r"), "holder"]).int(), 0);
    mig.push(token(cc.cmd(&["LOCK.READ", &k("s"), "r1", "30000"])));
    mig.push(token(cc.cmd(&["LOCK.READ", &k("s"), "r1", "30000"])));
    mig.push(token(cc.cmd(&["LOCK.READ", &k("s"), "r2", "20000"])));
    mig.push(token(cc.cmd(&["LOCK.ACQUIRE", &k("short"), "a", "3000"])));
    mig.push(token(cc.cmd(&["LOCK.ACQUIRE", &k("gone"), "a", "30000"])));
    assert_eq!(cc.cmd(&["LOCK.RELEASE", &k("gone"), "a"]).int(), 1);
    let max_mig = *mig.iter().max().expect("tokens");
    let target_before = last_token(&cl.nodes[target]);
    assert!(
        max_mig > target_before,
        "precondition: the migrated tokens ({max_mig}) are above the target's counter \
         ({target_before}), so that only observing them can keep the target's tokens above"
    );
    let held = ["x", "r", "s", "short"].map(k);
    let before: Vec<Observed> = held.iter().map(|key| observe_one(&mut cc, key)).collect();

    // Two clients use other keys of the slot meanwhile (no WAIT: see the
    // waiter test below).
    let mut cfg = LoadCfg::new((0..6).map(|i| k(&format!("bg{i}")).into_bytes()).collect());
    cfg.blocking_pct = 0;
    cfg.pace_ms = (1, 5);
    let run = Running::start(Ledger::fresh(2, cfg.keys.len(), "bg"), &cfg, seed, {
        let ports = ports.clone();
        move |_| ClusterClient::new(&ports)
    });
    run.wait_answered(40, Duration::from_secs(10));
    let t_mig = Instant::now();
    let moved = migrate_slot(&cl, slot, source, target);
    eprintln!(
        "migrated slot {slot}: {moved} keys in {:?}",
        t_mig.elapsed()
    );
    sleep_ms(200);
    run.stop();
    let (bg, _) = run.join();
    let s = totals(&bg);
    assert!(s.grants >= 10, "the clients of the slot were busy: {s:?}");
    let mut cc = ClusterClient::new(&ports);
    let obs = observe(&mut cc, &cfg.keys);
    assert_no_problems(&check(
        &bg,
        &obs,
        Window::everything(),
        "keys of the slot used during its migration",
    ));

    // Holders, holds, tokens and absolute deadlines moved with the keys.
    for (key, b) in held.iter().zip(&before) {
        let a = observe_one(&mut cc, key);
        assert_eq!(
            cc.last_port(),
            cl.nodes[target].port,
            "{key} is on the target"
        );
        assert_same_deadlines(b, &a, &format!("{key} migrated"));
    }
    let mut src = cl.nodes[source].conn();
    assert_eq!(
        src.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .int(),
        0
    );
    assert!(
        cc.lock_info(&k("gone")).is_none(),
        "a released lock stays free"
    );
    // The target observed the migrated tokens (RESTORE loads the value), and
    // so did its replica (it gets the RESTORE).
    let tl = last_token(&cl.nodes[target]);
    assert!(
        tl >= max_mig,
        "the target's lock_last_token {tl} < migrated token {max_mig}"
    );
    let tr = cl.replica_of(target);
    wait_for_sync(&cl.nodes[target], &cl.nodes[tr]);
    let rl = last_token(&cl.nodes[tr]);
    assert!(
        rl >= max_mig,
        "the target's replica's lock_last_token {rl} < migrated token {max_mig}"
    );
    let mut rc = readonly(&cl.nodes[tr]);
    for key in &held {
        assert_same_live_lock(
            &cc.lock_info(key),
            &rc.lock_info(key),
            300,
            &format!("{key} on the target and its replica"),
        );
    }
    // The source's replica dropped the moved keys too.
    let sr = cl.replica_of(source);
    wait_for_sync(&cl.nodes[source], &cl.nodes[sr]);
    assert_eq!(
        readonly(&cl.nodes[sr])
            .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .int(),
        0,
        "the source's replica has no key left in slot {slot}"
    );
    // New tokens on the target are above the migrated ones, in the slot and
    // in its other slots.
    let t1 = token(cc.cmd(&["LOCK.ACQUIRE", &k("gone"), "b", "30000"]));
    let (other_tag, _) = tag_on(&cl, target, "own");
    let t2 = token(cc.cmd(&["LOCK.ACQUIRE", &format!("{other_tag}:k"), "b", "30000"]));
    assert!(
        t1 > max_mig && t2 > t1,
        "tokens on the target after the migration: {t1}, {t2}; migrated up to {max_mig}"
    );
    // The migrated holders still hold, and only they.
    assert!(cc.cmd(&["LOCK.ACQUIRE", &k("x"), "other", "1000"]).is_nil());
    assert_eq!(
        cc.cmd(&["LOCK.ACQUIRE", &k("x"), "holder", "30000"]).int(),
        mig[0]
    );
    assert!(cc.cmd(&["LOCK.READ", &k("s"), "r3", "1000"]).int() > t2);
    assert!(cc.cmd(&["LOCK.ACQUIRE", &k("s"), "w", "1000"]).is_nil());
    assert_eq!(cc.cmd(&["LOCK.RELEASE", &k("r"), "holder"]).int(), 0);
    // The short lease ends at its deadline, not later.
    let short = &before[3];
    let h = &short.info.as_ref().expect("short is held").holders[0];
    let (_, dl_hi) = short.deadline(h);
    let wait = (dl_hi - now_ms() + 20).max(0) as u64;
    sleep_ms(wait);
    assert!(
        cc.lock_info(&k("short")).is_none(),
        "the short lease ended at its deadline"
    );

    // --- CLUSTER FAILOVER of the target: the migrated locks stay, and new
    // tokens are above everything the old target issued or received.
    let before: Vec<Observed> = held[..3]
        .iter()
        .map(|key| observe_one(&mut cc, key))
        .collect();
    let target_last = last_token(&cl.nodes[target]);
    let mut trc = cl.nodes[tr].conn();
    trc.cmd(&["CLUSTER", "FAILOVER"]).ok();
    wait_until(
        Duration::from_secs(20),
        "the target's replica to take over",
        || cl.role(tr) == "master" && cl.role(target) == "slave",
    );
    cl.wait_ready(Duration::from_secs(30));
    for (key, b) in held[..3].iter().zip(&before) {
        let a = observe_one(&mut cc, key);
        assert_eq!(
            cc.last_port(),
            cl.nodes[tr].port,
            "{key} is on the new master"
        );
        assert_same_deadlines(b, &a, &format!("{key} after CLUSTER FAILOVER"));
    }
    let t3 = token(cc.cmd(&["LOCK.ACQUIRE", &k("after"), "c", "30000"]));
    assert_eq!(cc.last_port(), cl.nodes[tr].port);
    assert!(
        t3 > target_last && t3 > max_mig,
        "first token of the new master {t3}; the old one had issued or seen up to {target_last}"
    );
}

#[test]
fn cluster_failover_under_load_keeps_every_acknowledged_grant() {
    let seed = test_seed("cluster_failover_under_load");
    let mut rng = Rng::new(seed);
    let cl = Cluster::start();
    let ports = cl.ports();
    let mut cfg = LoadCfg::new(LoadCfg::numbered("f:", 48));
    cfg.short_keys = 4;
    let what = "CLUSTER FAILOVER under load";
    let t0 = Instant::now();
    let run = Running::start(Ledger::fresh(4, cfg.keys.len(), "o"), &cfg, seed, {
        let ports = ports.clone();
        move |_| ClusterClient::new(&ports)
    });
    run.wait_answered(150, Duration::from_secs(15));
    sleep_ms(rng.range(200, 800) as u64);
    let masters = cl.masters();
    let m = masters[rng.below(3) as usize];
    let r = cl.replica_of(m);
    eprintln!(
        "{what}: before: lock_last_token {} on the master, {} on its replica",
        last_token(&cl.nodes[m]),
        last_token(&cl.nodes[r])
    );
    let t_fail = Instant::now();
    cl.nodes[r].conn().cmd(&["CLUSTER", "FAILOVER"]).ok();
    wait_until(Duration::from_secs(20), "the replica to take over", || {
        cl.role(r) == "master" && cl.role(m) == "slave"
    });
    eprintln!(
        "{what}: {} -> {} in {:?}",
        cl.nodes[m].port,
        cl.nodes[r].port,
        t_fail.elapsed()
    );
    sleep_ms(rng.range(300, 700) as u64);
    run.stop();
    let (ledgers, _) = run.join();
    let s = totals(&ledgers);
    eprintln!(
        "{what}: {s:?} in {:?}; tokens per port {:?}",
        t0.elapsed(),
        token_summary(&ledgers)
    );
    assert!(s.grants >= 30, "{what}: too little load: {s:?}");
    cl.wait_ready(Duration::from_secs(30));
    // A manual failover waits for the replica: nothing acknowledged is lost.
    let mut cc = ClusterClient::new(&ports);
    let obs = observe(&mut cc, &cfg.keys);
    assert_no_problems(&check(&ledgers, &obs, Window::everything(), what));
    // The new master's tokens are above every token the old one issued.
    let grants = all_grants(&ledgers);
    let old_max = grants
        .iter()
        .filter(|g| g.port == cl.nodes[m].port)
        .map(|g| g.token)
        .max()
        .unwrap_or(0);
    let new: Vec<i64> = grants
        .iter()
        .filter(|g| g.port == cl.nodes[r].port)
        .map(|g| g.token)
        .collect();
    assert!(!new.is_empty(), "{what}: the new master granted nothing");
    let new_min = *new.iter().min().expect("non-empty");
    assert!(
        new_min > old_max,
        "{what}: the new master issued {new_min}, the old one had issued up to {old_max}"
    );
    // The old master, now its replica, has the same locks.
    wait_for_sync(&cl.nodes[r], &cl.nodes[m]);
    let mut oc = readonly(&cl.nodes[m]);
    let mut nc = cl.nodes[r].conn();
    for key in cfg
        .keys
        .iter()
        .filter(|k| cc.node_for(k) == cl.nodes[r].port)
    {
        assert_same_live_lock(
            &nc.lock_info(key),
            &oc.lock_info(key),
            300,
            &format!("{what}: {} on the new master and the old one", show(key)),
        );
    }
}

/// `CLUSTER FAILOVER` pauses writes on the master until its replica has
/// caught up and taken over (tens of ms here). Leases with waiters end during
/// that pause (twenty of them, 10 ms apart, from just after the failover
/// starts). The old master
/// must survive: the module must not write or replicate while writes are
/// paused. Each waiter is granted before the pause (and then the new master
/// has the grant), or answered nil or `-UNBLOCKED` when its node becomes a
/// replica (waiting queues live in memory only).
#[test]
fn leases_ending_with_waiters_during_cluster_failover_do_not_crash_the_old_master() {
    let cl = Cluster::start();
    let masters = cl.masters();
    let m = masters[0];
    let r = cl.replica_of(m);
    let (tag, _) = tag_on(&cl, m, "pause");
    let keys: Vec<String> = (0..20).map(|i| format!("{tag}:{i}")).collect();
    let mut c = cl.nodes[m].conn();
    let t0 = Instant::now();
    for (i, k) in keys.iter().enumerate() {
        token(c.acquire(k, "holder", 3_000 + 10 * i as i64));
    }
    let port = cl.nodes[m].port;
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let k = k.clone();
            thread::spawn(move || {
                let mut c = Conn::connect(port);
                c.try_cmd(&["LOCK.ACQUIRE", &k, "waiter", "30000", "WAIT", "6000"])
            })
        })
        .collect();
    wait_until(Duration::from_secs(5), "the waiters to queue", || {
        keys.iter()
            .all(|k| c.lock_info(k).is_some_and(|i| i.waiters == 1))
    });
    let elapsed = t0.elapsed().as_millis() as u64;
    assert!(
        elapsed < 2_900,
        "setting up took {elapsed} ms: the leases would end first"
    );
    sleep_ms(2_990 - elapsed);
    cl.nodes[r].conn().cmd(&["CLUSTER", "FAILOVER"]).ok();
    wait_until(Duration::from_secs(20), "the replica to take over", || {
        cl.role(r) == "master" && cl.role(m) == "slave"
    });
    let replies: Vec<_> = waiters
        .into_iter()
        .map(|w| w.join().expect("a waiter thread"))
        .collect();
    eprintln!("waiters got {replies:?}");
    cl.wait_ready(Duration::from_secs(30));
    let mut cc = ClusterClient::new(&cl.ports());
    for (k, reply) in keys.iter().zip(&replies) {
        let info = cc.lock_info(k);
        assert_eq!(cc.last_port(), cl.nodes[r].port);
        match reply {
            Ok(Reply::Int(t)) => assert_eq!(
                info.as_ref().map(|i| i.holder("waiter").token),
                Some(*t),
                "{k}: the waiter was granted {t}: the new master must have it"
            ),
            Ok(Reply::Nil) => {}
            // Redis unblocks waiters of a demoted master (UNBLOCKED); Valkey
            // keeps them blocked and the module answers READONLY.
            Ok(Reply::Error(e)) if e.starts_with("UNBLOCKED") || e.starts_with("READONLY") => {}
            other => panic!("{k}: the waiter got {other:?}"),
        }
    }
}

/// Tokens are per server; the target observes the tokens of the locks that
/// move with a slot. A lock released before its slot moved leaves no trace:
/// only the clock floor (`now_ms * 1000` on every server) orders the target's
/// next token above the source's last. That holds between servers whose
/// skew-margin jumps are behind them: a node that started, loaded a file or
/// was promoted less than `lock.clock-skew-ms` ago runs that far ahead of the
/// clock (docs/design.md, "Clocks that step"), so a slot it gives away in
/// that window can see lower tokens on the target (not a contract
/// violation: tokens are per server). This test checks the floor, with the
/// margin at 0 so that no jump is in the way.
#[test]
fn a_lock_released_before_its_slot_moved_gets_higher_tokens_on_the_target() {
    let cl = Cluster::start_with(&["lock.clock-skew-ms 0"]);
    let by_counter = cl.masters_by_counter();
    let (target, source) = (by_counter[0], by_counter[2]);
    let (tag, slot) = tag_on(&cl, source, "rel");
    let key = format!("{tag}:k");
    let mut cc = ClusterClient::new(&cl.ports());
    let on_source = token(cc.cmd(&["LOCK.ACQUIRE", &key, "a", "30000"]));
    assert_eq!(cc.cmd(&["LOCK.RELEASE", &key, "a"]).int(), 1);
    assert_eq!(migrate_slot(&cl, slot, source, target), 0);
    let on_target = token(cc.cmd(&["LOCK.ACQUIRE", &key, "b", "30000"]));
    assert_eq!(cc.last_port(), cl.nodes[target].port);
    assert!(
        on_target > on_source,
        "{key}: token {on_source} from the source, then {on_target} from the target after \
         its slot moved"
    );
}

/// A client waits on the source for a lock; `MIGRATE` moves the held lock to
/// the target. The lock is still held (by its holder, on the target): the
/// waiter must not be granted it on the source. Native blocking commands are
/// left blocked while the slot migrates and redirected (`-MOVED`) once the
/// slot belongs to the target.
#[test]
fn a_waiter_on_the_source_is_not_granted_a_lock_that_migrate_moved_away() {
    let cl = Cluster::start();
    let ports = cl.ports();
    let mut cc = ClusterClient::new(&ports);
    let by_counter = cl.masters_by_counter();
    let target = by_counter[0];
    let source = by_counter[2];
    let (tag, slot) = tag_on(&cl, source, "w");
    let key = format!("{tag}:k");
    let t0 = token(cc.cmd(&["LOCK.ACQUIRE", &key, "holder", "30000"]));
    let port = cl.nodes[source].port;
    let waiter = {
        let key = key.clone();
        thread::spawn(move || {
            let mut c = Conn::connect(port);
            c.cmd(&["LOCK.ACQUIRE", &key, "waiter", "30000", "WAIT", "3000"])
        })
    };
    let mut src = cl.nodes[source].conn();
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        src.lock_info(&key).is_some_and(|i| i.waiters == 1)
    });
    // Move the key, not yet the slot.
    let s = slot.to_string();
    let mut tgt = cl.nodes[target].conn();
    tgt.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &cl.id(source)])
        .ok();
    src.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &cl.id(target)])
        .ok();
    let r = src.cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &cl.nodes[target].port.to_string(),
        "",
        "0",
        "5000",
        "KEYS",
        &key,
    ]);
    assert_eq!(r, Reply::Status("OK".into()), "MIGRATE");
    let reply = waiter.join().expect("the waiter thread");
    let left_on_source = src.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s]).int();
    let source_view = src.cmd(&["LOCK.INFO", &key]);
    tgt.cmd(&["ASKING"]).ok();
    let target_view = LockInfo::parse(&tgt.cmd(&["LOCK.INFO", &key]));
    // Finish the migration (whatever the outcome above), so the cluster is sane.
    let on_target = tgt.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &cl.id(target)]);
    let on_source = src.cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &cl.id(target)]);
    let left_after = src.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &s]).int();
    eprintln!(
        "waiter got {reply:?}; source then had {left_on_source} key(s) in slot {slot} \
         (LOCK.INFO {source_view:?}); target: {target_view:?}; SETSLOT NODE: target \
         {on_target:?}, source {on_source:?}; keys left on the source after it: {left_after}"
    );
    assert_eq!(
        target_view.as_ref().map(|i| i.holder("holder").token),
        Some(t0),
        "the holder's lock moved to the target"
    );
    assert!(
        !matches!(reply, Reply::Int(_)),
        "the waiter was granted {key} on the source ({reply:?}) while `holder` holds it \
         (token {t0}) on the target: two exclusive holders. The source then had \
         {left_on_source} key(s) in slot {slot}: {source_view:?}; after SETSLOT NODE \
         ({on_source:?}) it had {left_after}: the grant vanished without a release"
    );
    assert_eq!(
        reply,
        Reply::Error(LockError::Migrating.message()),
        "the waiter is told to retry where the lock went (docs/commands.md, errors)"
    );
    assert_eq!(
        left_on_source, 0,
        "MIGRATE left the slot empty on the source"
    );
}

/// LOCK.MACQUIRE's keys come from numkeys (its key spec): a cluster routes
/// it by them and refuses keys of several slots with CROSSSLOT.
#[test]
fn macquire_needs_its_keys_in_one_slot() {
    let cl = Cluster::start();
    let owner = cl.masters()[0];
    let (tag, _) = tag_on(&cl, owner, "m");
    let mut c = cl.nodes[owner].conn();
    let (a, b) = (format!("{tag}:a"), format!("{tag}:b"));
    let r = c.cmd(&["LOCK.MACQUIRE", "2", &a, &b, "o", "30000"]);
    assert_eq!(r.array().len(), 2, "{r:?}");
    let r = c.cmd(&["LOCK.MACQUIRE", "2", "plain-a", "plain-b", "o", "30000"]);
    assert!(
        r.err().starts_with("CROSSSLOT") || r.err().starts_with("MOVED"),
        "{r:?}"
    );
    let other = cl.masters()[1];
    let (far, _) = tag_on(&cl, other, "f");
    let r = c.cmd(&[
        "LOCK.MACQUIRE",
        "2",
        &format!("{far}:a"),
        &format!("{far}:b"),
        "o",
        "30000",
    ]);
    assert!(r.err().starts_with("MOVED"), "routed by its keys: {r:?}");
    let r = c.cmd(&["LOCK.MACQUIRE", "2", &a, &format!("{far}:b"), "p", "30000"]);
    assert!(r.err().starts_with("CROSSSLOT"), "{r:?}");
}

/// `COMMAND GETKEYS` of a `LOCK.GUARD` call, as strings.
fn getkeys(c: &mut Conn, guard: &[&str]) -> Vec<String> {
    let mut args = vec!["COMMAND", "GETKEYS"];
    args.extend_from_slice(guard);
    let r = c.cmd(&args);
    r.array().iter().map(Reply::str).collect()
}

/// How many keys of `slot` each of the six nodes has.
fn keys_in_slot_everywhere(cl: &Cluster, slot: u16) -> Vec<i64> {
    cl.nodes
        .iter()
        .map(|n| {
            n.conn()
                .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
                .int()
        })
        .collect()
}

/// LOCK.GUARD's keys are the lock key and the called command's keys
/// (getkeys-api): a cluster routes the guard by them, answers MOVED from a
/// node that does not serve their slot, and CROSSSLOT when the called
/// command names a key of another slot than the lock's (even one served by
/// the same node), whether or not the owner holds the lock; nothing runs
/// then. `COMMAND GETKEYS` lists every key.
#[test]
fn guard_runs_on_the_lock_keys_node_and_needs_every_key_in_its_slot() {
    let cl = Cluster::start();
    let masters = cl.masters();
    let owner = masters[0];
    let owner_port = cl.nodes[owner].port;
    let (tag, slot) = tag_on(&cl, owner, "job");
    let (far_tag, far_slot) = tag_on(&cl, masters[1], "far");
    // Another slot of the same node.
    let (near_tag, near_slot) = (0..)
        .map(|n| tag_on(&cl, owner, &format!("near{n}-")))
        .find(|(_, s)| *s != slot)
        .expect("a second slot on the owner");
    let lock = format!("{tag}:lock");
    let data = format!("{tag}:data");
    let far = format!("{far_tag}:data");
    let near = format!("{near_tag}:data");
    let mut cc = ClusterClient::new(&cl.ports());
    let t = token(cc.cmd(&["LOCK.ACQUIRE", &lock, "o", "600000"]));
    assert_eq!(cc.last_port(), owner_port);
    let ts = t.to_string();

    // --- Same slot: routed to the owner, runs there.
    let r = cc.cmd(&["LOCK.GUARD", &lock, "o", "CALL", "SET", &data, "v1"]);
    assert_eq!(r, Reply::Status("OK".into()), "guarded SET");
    assert_eq!(
        cc.last_port(),
        owner_port,
        "the guard went to the lock's node"
    );
    let r = cc.cmd(&[
        "LOCK.GUARD",
        &lock,
        "o",
        "TOKEN",
        &ts,
        "CALL",
        "HSET",
        &format!("{tag}:h"),
        "f",
        "1",
    ]);
    assert_eq!(r, Reply::Int(1), "guarded HSET under the token");
    let r = cc.cmd(&[
        "LOCK.GUARD",
        &lock,
        "o",
        "CALL",
        "MSET",
        &format!("{tag}:a"),
        "1",
        &format!("{tag}:b"),
        "2",
    ]);
    assert_eq!(r, Reply::Status("OK".into()), "guarded MSET in one slot");
    // A lock command on another key of the slot.
    let t2 = token(cc.cmd(&[
        "LOCK.GUARD",
        &lock,
        "o",
        "CALL",
        "LOCK.ACQUIRE",
        &format!("{tag}:other"),
        "o",
        "600000",
    ]));
    assert!(t2 > t, "a guarded grant on the owner: {t2} after {t}");
    let mut oc = cl.nodes[owner].conn();
    assert_eq!(oc.cmd(&["GET", &data]).str(), "v1");
    assert_eq!(oc.cmd(&["HGET", &format!("{tag}:h"), "f"]).str(), "1");
    assert_eq!(oc.cmd(&["GET", &format!("{tag}:a")]).str(), "1");
    assert_eq!(oc.cmd(&["GET", &format!("{tag}:b")]).str(), "2");
    assert_eq!(
        oc.lock_info(format!("{tag}:other"))
            .map(|i| i.holder("o").token),
        Some(t2)
    );
    // Its replica got the called commands.
    let replica = cl.replica_of(owner);
    wait_for_sync(&cl.nodes[owner], &cl.nodes[replica]);
    assert_eq!(
        readonly(&cl.nodes[replica]).cmd(&["GET", &data]).str(),
        "v1"
    );
    // Not held, wrong token: NOTHELD on the right node, nothing run.
    for who in [
        vec!["LOCK.GUARD", &lock, "x", "CALL", "SET", &data, "no"],
        vec![
            "LOCK.GUARD",
            &lock,
            "o",
            "TOKEN",
            "1",
            "CALL",
            "SET",
            &data,
            "no",
        ],
    ] {
        let r = cc.cmd(&who);
        assert!(r.err().starts_with("NOTHELD"), "{who:?}: {r:?}");
        assert_eq!(cc.last_port(), owner_port);
    }
    assert_eq!(oc.cmd(&["GET", &data]).str(), "v1", "nothing ran");

    // --- MOVED from any other master, for a guard that would run; the
    // redirection leads to the owner, where it runs.
    for &m in masters.iter().filter(|&&m| m != owner) {
        let r = cl.nodes[m]
            .conn()
            .cmd(&["LOCK.GUARD", &lock, "o", "CALL", "SET", &data, "moved"]);
        assert_eq!(
            r,
            Reply::Error(format!("MOVED {slot} 127.0.0.1:{owner_port}")),
            "a guard sent to node {}",
            cl.nodes[m].port
        );
    }
    assert_eq!(oc.cmd(&["GET", &data]).str(), "v1", "nothing ran on MOVED");
    let r = oc.cmd(&["LOCK.GUARD", &lock, "o", "CALL", "SET", &data, "moved"]);
    assert_eq!(r, Reply::Status("OK".into()), "at the MOVED target");
    assert_eq!(oc.cmd(&["GET", &data]).str(), "moved");

    // --- CROSSSLOT: a called key of another slot (another node's, or the
    // same node's), held or not, from every master; nothing runs.
    let mset_two = [
        "MSET",
        &format!("{tag}:c"),
        "1",
        &format!("{far_tag}:d"),
        "2",
    ];
    let mut crossing: Vec<Vec<String>> = Vec::new();
    for owner_name in ["o", "x"] {
        for called in [
            vec!["SET", &far, "v"],
            vec!["SET", &near, "v"],
            vec!["INCR", &far],
            vec!["LOCK.ACQUIRE", &far, "o", "1000"],
            mset_two.to_vec(),
        ] {
            let mut args = vec!["LOCK.GUARD", lock.as_str(), owner_name, "CALL"];
            args.extend(called);
            crossing.push(args.iter().map(|s| s.to_string()).collect());
        }
    }
    for args in &crossing {
        for &m in &masters {
            let r = cl.nodes[m].conn().cmd(args);
            assert!(
                r.is_err() && r.err().starts_with("CROSSSLOT"),
                "{args:?} on node {}: {r:?}",
                cl.nodes[m].port
            );
        }
    }
    for s in [far_slot, near_slot] {
        assert_eq!(
            keys_in_slot_everywhere(&cl, s),
            vec![0; 6],
            "no key of slot {s} on any node"
        );
    }
    assert!(oc.cmd(&["GET", &format!("{tag}:c")]).is_nil(), "MSET ran");
    assert_eq!(oc.cmd(&["GET", &data]).str(), "moved");

    // --- COMMAND GETKEYS lists the lock key, then the called command's.
    assert_eq!(
        getkeys(
            &mut oc,
            &["LOCK.GUARD", &lock, "o", "CALL", "SET", &data, "v"]
        ),
        vec![lock.clone(), data.clone()]
    );
    assert_eq!(
        getkeys(
            &mut oc,
            &[
                "LOCK.GUARD",
                &lock,
                "o",
                "TOKEN",
                &ts,
                "CALL",
                "SET",
                &far,
                "v"
            ]
        ),
        vec![lock.clone(), far.clone()]
    );
    assert_eq!(
        getkeys(
            &mut oc,
            &["LOCK.GUARD", &lock, "o", "CALL"]
                .iter()
                .chain(&mset_two)
                .copied()
                .collect::<Vec<_>>()
        ),
        vec![lock.clone(), format!("{tag}:c"), format!("{far_tag}:d")]
    );
    assert_eq!(
        getkeys(
            &mut oc,
            &[
                "LOCK.GUARD",
                &lock,
                "o",
                "CALL",
                "LOCK.MACQUIRE",
                "2",
                &data,
                &far,
                "o",
                "1"
            ]
        ),
        vec![lock.clone(), data.clone(), far.clone()]
    );
    assert_eq!(
        getkeys(&mut oc, &["LOCK.GUARD", &lock, "o", "CALL", "PING"]),
        vec![lock.clone()]
    );
}

/// A session lives on the node that opened it: a grant on another node
/// naming it is `NOSESSION` and changes nothing there, while the node that
/// opened it grants under it; each node's sessions are its own.
#[test]
fn a_session_is_the_opening_nodes_only() {
    let cl = Cluster::start();
    let (here, there) = (cl.masters()[0], cl.masters()[1]);
    let (near, _) = tag_on(&cl, here, "s");
    let (far, _) = tag_on(&cl, there, "t");
    let mut a = cl.nodes[here].conn();
    let mut b = cl.nodes[there].conn();
    let id = a.cmd(&["LOCK.SESSION", "OPEN", "60000"]).int().to_string();
    token(a.cmd(&[
        "LOCK.ACQUIRE",
        &format!("{near}:k"),
        "o",
        "1000",
        "SESSION",
        &id,
    ]));
    let r = b.cmd(&[
        "LOCK.ACQUIRE",
        &format!("{far}:k"),
        "o",
        "1000",
        "SESSION",
        &id,
    ]);
    assert!(r.err().starts_with("NOSESSION"), "{r:?}");
    assert!(
        b.lock_info(&format!("{far}:k")).is_none(),
        "nothing granted"
    );
    assert!(b.cmd(&["LOCK.SESSION", "INFO", &id]).is_nil());
    assert_eq!(b.cmd(&["LOCK.SESSION", "KEEPALIVE", &id, "60000"]).int(), 0);
    // The session there is that node's own, and both live side by side.
    let other = b.cmd(&["LOCK.SESSION", "OPEN", "60000"]).int().to_string();
    token(b.cmd(&[
        "LOCK.ACQUIRE",
        &format!("{far}:k"),
        "o",
        "1000",
        "SESSION",
        &other,
    ]));
    assert_eq!(a.cmd(&["LOCK.SESSION", "CLOSE", &id]).int(), 1);
    assert!(a.lock_info(&format!("{near}:k")).is_none(), "ended with it");
    assert!(
        b.lock_info(&format!("{far}:k")).is_some(),
        "the other node's holds"
    );
}
