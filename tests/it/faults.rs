//! Faults under load: SIGKILL with the AOF (`appendfsync always`), with an
//! RDB, during and after BGREWRITEAOF; promotion of a replica after the
//! master died, and while it is still taking requests; leases running out
//! while writes are paused for a failover.
//!
//! Six client threads acquire, re-enter, renew and release short leases on 32
//! keys (some grants block with `WAIT ms`), each recording what it was told
//! (`common/load.rs`). At a random moment the server is killed; after the
//! restart (or promotion) every key's `LOCK.INFO` is checked against the
//! records: every acknowledged grant the file or the replica must have is
//! there with its token, hold count and deadline; nothing is there that no
//! client could have been granted; new tokens are above every token the
//! server could have seen.
//!
//! The seed is printed; `FAULTS_SEED=<n>` replays a run's choices (not its
//! timing).

use crate::common::load::*;
use crate::common::*;
use std::time::{Duration, Instant};

const THREADS: usize = 6;
const NKEYS: usize = 32;

/// 32 keys; on the first 4 leases are 150-400 ms, so they run out under load
/// and the module's timer grants them to waiters.
/// These tests load the machine (client threads, a server, kills and
/// restarts); on a 2-core machine two at once starve each other's deadlines.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cfg() -> LoadCfg {
    let mut cfg = LoadCfg::new(LoadCfg::numbered("k", NKEYS));
    cfg.short_keys = 4;
    cfg
}

fn start_load(port: u16, ledgers: Vec<Ledger>, cfg: &LoadCfg, seed: u64) -> Running {
    Running::start(ledgers, cfg, seed, move |_| Single(Conn::connect(port)))
}

fn aof_server(preamble: &str) -> Server {
    Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config(&format!("aof-use-rdb-preamble {preamble}"))
        .start()
}

#[track_caller]
fn token(r: Reply) -> i64 {
    let t = r.int();
    assert!(t > 0, "a token is a positive integer, got {t}");
    t
}

fn last_token(c: &mut Conn) -> i64 {
    c.info_field("lock", "lock_last_token")
        .parse()
        .expect("lock_last_token is an integer")
}

/// Every key in the database: only the load's keys (and `extra`) may exist.
fn assert_only_load_keys(c: &mut Conn, cfg: &LoadCfg, extra: &[&str], what: &str) {
    let mut cursor = "0".to_string();
    for _ in 0..1_000 {
        let r = c.cmd(&["SCAN", &cursor, "COUNT", "1000"]);
        let parts = r.array();
        cursor = parts[0].str();
        for k in parts[1].array() {
            let k = k.bulk().to_vec();
            assert!(
                cfg.keys.contains(&k) || extra.iter().any(|e| e.as_bytes() == k.as_slice()),
                "{what}: unexpected key {}",
                show(&k)
            );
            // A lease may end between SCAN and TYPE ("none": the key
            // expired by itself); anything else is a lock or a bug.
            let t = c.type_of(&k);
            assert!(
                t == TYPE_NAME || t == "none",
                "{what}: TYPE {} is {t}",
                show(&k)
            );
        }
        if cursor == "0" {
            return;
        }
    }
    panic!("{what}: SCAN did not finish");
}

/// Reads the server, checks it against the ledgers, and checks that new
/// tokens are above `floor` and everything the server shows. Returns what it
/// read.
fn check_server(
    s: &Server,
    ledgers: &[Ledger],
    cfg: &LoadCfg,
    w: Window,
    floor: i64,
    fresh_key: &str,
    what: &str,
) -> Vec<Observed> {
    let mut c = s.conn();
    let obs = observe(&mut Single(s.conn()), &cfg.keys);
    assert_no_problems(&check(ledgers, &obs, w, what));
    assert_only_load_keys(&mut c, cfg, &[], what);
    let shown_max = observed_tokens(&obs).into_iter().max().unwrap_or(0);
    let last = last_token(&mut c);
    assert!(
        last >= shown_max,
        "{what}: lock_last_token {last} is below a token the server holds ({shown_max})"
    );
    let t1 = token(c.acquire(fresh_key, "fresh", 5_000));
    let t2 = token(c.read(&format!("{fresh_key}:r"), "fresh", 5_000));
    assert!(
        t1 > floor && t1 > shown_max && t1 > last && t2 > t1,
        "{what}: new tokens {t1}, {t2}; floor {floor}, largest token held {shown_max}, \
         lock_last_token {last}"
    );
    assert_eq!(c.release(fresh_key, "fresh").int(), 1);
    assert_eq!(c.release(&format!("{fresh_key}:r"), "fresh").int(), 1);
    obs
}

fn max_acked(ledgers: &[Ledger]) -> i64 {
    all_grants(ledgers)
        .iter()
        .map(|g| g.token)
        .max()
        .unwrap_or(0)
}

fn report(what: &str, ledgers: &[Ledger], t0: Instant) {
    let s = totals(ledgers);
    eprintln!(
        "{what}: {} requests ({} grants, {} refusals, {} re-entries, {} renewals, {} releases, \
         {} blocking, {} confirmed by WAIT 1, {} not) in {:?}; tokens per port {:?}",
        s.requests,
        s.grants,
        s.refusals,
        s.reentries,
        s.renewals,
        s.releases,
        s.blocking,
        s.confirmations,
        s.unconfirmed,
        t0.elapsed(),
        token_summary(ledgers)
    );
}

/// Enough load for a meaningful check: the threads did change things.
#[track_caller]
fn assert_busy(ledgers: &[Ledger], what: &str) {
    let s = totals(ledgers);
    assert!(
        s.grants >= 30 && s.releases >= 5,
        "{what}: too little load to mean anything: {s:?}"
    );
}

// ---------------------------------------------------------------------------
// Crash
// ---------------------------------------------------------------------------

#[test]
fn aof_always_sigkill_under_load_keeps_every_acknowledged_grant() {
    let _one_at_a_time = serial();
    let seed = test_seed("aof_always_sigkill");
    let mut rng = Rng::new(seed);
    let cfg = cfg();
    let mut s = aof_server("yes");
    let mut ledgers = Ledger::fresh(THREADS, NKEYS, "o");
    let mut floor = 0;
    for round in 0..3 {
        let what = format!("AOF appendfsync always, SIGKILL under load, round {round}");
        let t0 = Instant::now();
        let run = start_load(s.port, ledgers, &cfg, seed.wrapping_add(round));
        run.wait_answered(400, Duration::from_secs(20));
        sleep_ms(rng.range(200, 1_800) as u64);
        let killed = Instant::now();
        s.kill9();
        let (l, _) = run.join();
        ledgers = l;
        report(&what, &ledgers, t0);
        assert_busy(&ledgers, &what);
        // Tokens of this round are above every earlier round's (same port).
        let round_min = all_grants(&ledgers)
            .iter()
            .filter(|g| g.sent >= t0)
            .map(|g| g.token)
            .min()
            .unwrap_or(i64::MAX);
        assert!(
            round_min > floor,
            "{what}: a token of this round ({round_min}) is not above every token before \
             the restart ({floor})"
        );
        s.restart();
        let w = Window {
            guaranteed_before: Some(killed),
            own_confirmations: false,
            possible_until: None,
        };
        floor = floor.max(max_acked(&ledgers));
        let obs = check_server(
            &s,
            &ledgers,
            &cfg,
            w,
            floor,
            &format!("fresh{round}"),
            &what,
        );
        floor = floor.max(observed_tokens(&obs).into_iter().max().unwrap_or(0));
        for l in &mut ledgers {
            l.rebase(&obs);
        }
    }
}

#[test]
fn rdb_sigkill_under_load_brings_back_what_save_wrote() {
    let _one_at_a_time = serial();
    let seed = test_seed("rdb_sigkill");
    let mut rng = Rng::new(seed);
    let cfg = cfg();
    let mut s = Server::start();
    let ledgers = Ledger::fresh(THREADS, NKEYS, "o");
    let what = "SAVE under load, more grants, SIGKILL";
    let t0 = Instant::now();
    let run = start_load(s.port, ledgers, &cfg, seed);
    run.wait_answered(400, Duration::from_secs(20));
    sleep_ms(rng.range(0, 600) as u64);
    let mut c = s.conn();
    // A lower bound of the counter the SAVE writes (the load goes on, and
    // lock_last_token moves only with grants; SAVE cannot run in MULTI).
    let saved_counter = last_token(&mut c);
    let save_sent = Instant::now();
    c.cmd(&["SAVE"]).ok();
    let save_acked = Instant::now();
    // More grants the file will not have.
    let n = run
        .shared
        .answered
        .load(std::sync::atomic::Ordering::SeqCst);
    run.wait_answered(n + 100, Duration::from_secs(10));
    sleep_ms(rng.range(0, 600) as u64);
    s.kill9();
    let (ledgers, _) = run.join();
    report(what, &ledgers, t0);
    assert_busy(&ledgers, what);
    let after_save = all_grants(&ledgers)
        .iter()
        .filter(|g| g.sent > save_acked)
        .count();
    assert!(after_save > 0, "{what}: no grant after the SAVE");
    s.restart();
    let w = Window {
        guaranteed_before: Some(save_sent),
        own_confirmations: false,
        possible_until: Some(save_acked),
    };
    // The saved counter (aux data) is back, and the wall-clock seed keeps new
    // tokens above the grants the file lost.
    let mut c = s.conn();
    let restored_counter = last_token(&mut c);
    assert!(
        restored_counter >= saved_counter,
        "{what}: lock_last_token {restored_counter} after the restart, {saved_counter} when saved"
    );
    check_server(&s, &ledgers, &cfg, w, max_acked(&ledgers), "fresh", what);
}

/// Waits until no AOF rewrite is running or scheduled.
fn wait_rewrite_done(c: &mut Conn) {
    wait_until(Duration::from_secs(20), "the AOF rewrite to finish", || {
        let info = c.info("persistence");
        info_get(&info, "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_get(&info, "aof_rewrite_scheduled").as_deref() == Some("0")
    });
}

#[test]
fn bgrewriteaof_under_load_then_sigkill_keeps_every_acknowledged_grant() {
    let _one_at_a_time = serial();
    let seed = test_seed("bgrewriteaof_sigkill");
    let mut rng = Rng::new(seed);
    let cfg = cfg();
    let mut s = aof_server("yes");
    let mut ledgers = Ledger::fresh(THREADS, NKEYS, "o");
    let mut floor = 0;
    // Round 0: killed while the rewrite may still run. Round 1: after it
    // finished, with the RDB preamble. Round 2: after a rewrite without it.
    for round in 0..3u64 {
        let what = format!("BGREWRITEAOF under load then SIGKILL, round {round}");
        let t0 = Instant::now();
        let run = start_load(s.port, ledgers, &cfg, seed.wrapping_add(round));
        run.wait_answered(100, Duration::from_secs(10));
        let mut c = s.conn();
        if round == 2 {
            c.cmd(&["CONFIG", "SET", "aof-use-rdb-preamble", "no"]).ok();
        }
        wait_rewrite_done(&mut c);
        let r = c.cmd(&["BGREWRITEAOF"]);
        assert!(matches!(r, Reply::Status(_)), "{what}: BGREWRITEAOF: {r:?}");
        if round == 0 {
            sleep_ms(rng.range(0, 50) as u64);
        } else {
            wait_rewrite_done(&mut c);
            let status = c.info_field("persistence", "aof_last_bgrewrite_status");
            assert_eq!(status, "ok", "{what}: the AOF rewrite failed");
            let n = run
                .shared
                .answered
                .load(std::sync::atomic::Ordering::SeqCst);
            run.wait_answered(n + 100, Duration::from_secs(10));
            sleep_ms(rng.range(0, 800) as u64);
        }
        let killed = Instant::now();
        s.kill9();
        let (l, _) = run.join();
        ledgers = l;
        report(&what, &ledgers, t0);
        s.restart();
        let w = Window {
            guaranteed_before: Some(killed),
            own_confirmations: false,
            possible_until: None,
        };
        floor = floor.max(max_acked(&ledgers));
        let obs = check_server(
            &s,
            &ledgers,
            &cfg,
            w,
            floor,
            &format!("fresh{round}"),
            &what,
        );
        floor = floor.max(observed_tokens(&obs).into_iter().max().unwrap_or(0));
        for l in &mut ledgers {
            l.rebase(&obs);
        }
    }
    assert_busy(&ledgers, "BGREWRITEAOF rounds");
}

// ---------------------------------------------------------------------------
// Failover
// ---------------------------------------------------------------------------

/// A replica's view: its state and counter, read twice around the promotion.
struct Promotion {
    before: Vec<Observed>,
    after: Vec<Observed>,
    last_token_before: i64,
}

/// Reads the replica, promotes it, reads it again: the promotion itself
/// changes nothing.
fn promote_and_compare(replica: &Server, cfg: &LoadCfg, what: &str) -> Promotion {
    let mut r = replica.conn();
    let t = Instant::now();
    let last_token_before = last_token(&mut r);
    let before = observe(&mut Single(replica.conn()), &cfg.keys);
    replica.promote();
    wait_until(
        Duration::from_secs(10),
        "the replica to become a master",
        || r.info_field("replication", "role") == "master",
    );
    let after = observe(&mut Single(replica.conn()), &cfg.keys);
    let slack = t.elapsed().as_millis() as i64 + 200;
    for (b, a) in before.iter().zip(&after) {
        // A lease that can end between the two looks is not a lost grant.
        let ending = b
            .info
            .as_ref()
            .is_some_and(|i| i.holders.iter().any(|h| h.ttl <= slack));
        if ending {
            continue;
        }
        assert_same_lock(
            &b.info,
            &a.info,
            slack,
            &format!(
                "{what}: key {} before and after REPLICAOF NO ONE",
                show(&b.key)
            ),
        );
    }
    Promotion {
        before,
        after,
        last_token_before,
    }
}

/// Tokens the replica surely received: every grant acknowledged before the
/// latest confirmed request was sent, and every grant a `WAIT 1` confirmed.
fn confirmed_max(ledgers: &[Ledger], confirmed_before: Option<Instant>) -> i64 {
    let mut m = 0;
    for l in ledgers {
        for g in &l.grants {
            if confirmed_before.is_some_and(|c| g.acked < c) {
                m = m.max(g.token);
            }
        }
        for (k, &i) in l.confirmed.iter().enumerate() {
            if let Some(Held { token: Some(t), .. }) = &l.keys[k][i].state {
                m = m.max(*t);
            }
        }
    }
    m
}

#[test]
fn replica_promoted_after_master_sigkill_keeps_what_it_received() {
    let _one_at_a_time = serial();
    let seed = test_seed("failover_after_sigkill");
    let mut rng = Rng::new(seed);
    let mut cfg = cfg();
    cfg.confirm_pct = 30;
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let what = "master SIGKILLed under load, replica promoted";
    let t0 = Instant::now();
    let run = start_load(master.port, Ledger::fresh(THREADS, NKEYS, "o"), &cfg, seed);
    run.wait_answered(400, Duration::from_secs(20));
    sleep_ms(rng.range(200, 1_800) as u64);
    master.kill9();
    let (ledgers, confirmed_before) = run.join();
    report(what, &ledgers, t0);
    assert_busy(&ledgers, what);
    let p = promote_and_compare(&replica, &cfg, what);
    // What it shows is what the clients were told, at least up to what WAIT 1
    // confirmed (a grant followed by WAIT 1 >= 1 is safely held).
    let w = Window {
        guaranteed_before: confirmed_before,
        own_confirmations: true,
        possible_until: None,
    };
    assert_no_problems(&check(&ledgers, &p.before, w, what));
    let lost = count_differences(&ledgers, &p.before);
    eprintln!(
        "{what}: {lost} of the clients' last acknowledged states are not on the promoted \
         replica (async replication; WAIT 1 confirmed {} of them)",
        totals(&ledgers).confirmations
    );
    // New tokens above everything it received.
    let received = p
        .last_token_before
        .max(confirmed_max(&ledgers, confirmed_before))
        .max(observed_tokens(&p.after).into_iter().max().unwrap_or(0));
    check_server(&replica, &ledgers, &cfg, w, received, "fresh", what);
}

#[test]
fn replica_promoted_while_the_master_takes_requests_keeps_what_it_received() {
    let _one_at_a_time = serial();
    let seed = test_seed("promotion_under_load");
    let mut rng = Rng::new(seed);
    let mut cfg = cfg();
    cfg.confirm_pct = 30;
    cfg.confirm_ms = 300;
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let what = "replica promoted while the master takes requests";
    let t0 = Instant::now();
    let run = start_load(master.port, Ledger::fresh(THREADS, NKEYS, "o"), &cfg, seed);
    run.wait_answered(400, Duration::from_secs(20));
    sleep_ms(rng.range(0, 800) as u64);
    let mut r = replica.conn();
    let promote_sent = Instant::now();
    r.cmd(&["REPLICAOF", "NO", "ONE"]).ok();
    let promote_acked = Instant::now();
    let last_before = last_token(&mut r);
    let shown = observe(&mut Single(replica.conn()), &cfg.keys);
    // The old master goes on for a while: none of that reaches the replica
    // (and its WAIT 1 now times out).
    sleep_ms(300);
    run.stop();
    let (ledgers, confirmed_before) = run.join();
    report(what, &ledgers, t0);
    assert_busy(&ledgers, what);
    let info = master.conn().info("lock");
    eprintln!(
        "{what}: old master: lock_grants_after_wait {:?}, lock_expired_leases {:?}",
        info_get(&info, "lock_grants_after_wait"),
        info_get(&info, "lock_expired_leases")
    );
    let confirmed_before = confirmed_before.filter(|c| *c < promote_sent);
    let w = Window {
        guaranteed_before: confirmed_before,
        own_confirmations: true,
        possible_until: Some(promote_acked),
    };
    // Ledger confirmations after the promotion cannot exist (no replica).
    assert_no_problems(&check(&ledgers, &shown, w, what));
    let received = last_before
        .max(confirmed_max(&ledgers, confirmed_before))
        .max(observed_tokens(&shown).into_iter().max().unwrap_or(0));
    check_server(&replica, &ledgers, &cfg, w, received, "fresh", what);
}

/// Without the clock floor and the skew margin, a promoted replica issues the
/// very numbers its old master issued in its last moments (grants it never
/// received), and a resource that refuses only *smaller* tokens
/// (commands.md) accepts two holders of one lock with one token. The
/// contract (v2, "Clock steps") forbids it; this test checks it.
///
/// The plainest setup: a master and a replica started together; the master
/// grants one last lock the replica never receives. Without the clock floor
/// and the skew margin the promoted replica would issue the very next number
/// the master issued.
#[test]
fn a_promoted_replica_does_not_reissue_a_token_the_old_master_granted() {
    let _one_at_a_time = serial();
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    let mut r = replica.conn();
    let t0 = token(m.acquire("x", "old", 60_000));
    wait_for_sync(&master, &replica);
    assert!(
        last_token(&mut r) >= t0,
        "the replica's counter is at least the last token it received"
    );
    // The link breaks (the replica cannot authenticate any more) ...
    m.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]).ok();
    m.cmd(&["AUTH", "s3cret"]).ok();
    m.cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
    wait_until(
        Duration::from_secs(10),
        "the replica link to go down",
        || r.info_field("replication", "master_link_status") == "down",
    );
    // ... and the master grants a lock in its last moments: acknowledged,
    // never replicated.
    let lost = token(m.acquire("y", "victim", 60_000));
    master.kill9();
    replica.promote();
    let mut r = replica.conn();
    assert!(
        r.lock_info("y").is_none(),
        "the grant of y never reached the replica"
    );
    let reissued = token(r.acquire("y", "rescuer", 60_000));
    assert!(
        reissued > lost,
        "the promoted replica granted y to another owner with token {reissued}; the old \
         master had granted y with token {lost} (received up to {t0})"
    );
}

/// Whether the server answers PING (within 2 s).
fn answers_ping(s: &Server) -> bool {
    let Ok(mut c) = Conn::try_connect(s.port) else {
        return false;
    };
    c.set_timeout(Duration::from_secs(2));
    matches!(c.try_cmd(&["PING"]), Ok(Reply::Status(p)) if p == "PONG")
}

/// The assertion redis-server logged before it aborted, if any (after
/// giving a dying server time to finish its crash report).
fn assertion(s: &mut Server) -> String {
    let start = Instant::now();
    while s.is_running() && start.elapsed() < Duration::from_secs(5) {
        sleep_ms(20);
    }
    s.log_tail(5_000)
        .lines()
        .filter(|l| l.contains("==>") || l.contains("ASSERTION FAILED ="))
        .map(|l| l.trim().to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A failover pauses writes on the master (`CLUSTER FAILOVER`, `FAILOVER`,
/// or an operator's `CLIENT PAUSE ... WRITE` before promoting a replica) so
/// the replica catches up with a dataset that no longer changes. Leases keep
/// running out meanwhile. The server must survive it: the module must not
/// write or replicate while writes are paused (Redis's own expiry and
/// eviction stop), and once writes resume the waiter is granted.
///
/// Here a lease ends with a waiter queued, on a server with an AOF. (Without
/// an AOF or replica it aborts too, in `dbAdd` when the deadline's millisecond
/// has passed: Redis does not delete the expired key while paused, the
/// module sees no lock and creates the key again.)
#[test]
fn a_lease_ending_with_a_waiter_while_writes_are_paused_does_not_crash_the_server() {
    let _one_at_a_time = serial();
    let mut s = aof_server("yes");
    let mut c = s.conn();
    token(c.acquire("k", "a", 300));
    let port = s.port;
    let waiter = std::thread::spawn(move || {
        let mut c = Conn::connect(port);
        let sent = Instant::now();
        let r = c.try_cmd(&["LOCK.ACQUIRE", "k", "b", "10000", "WAIT", "5000"]);
        (r, sent.elapsed())
    });
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        c.lock_info("k").is_some_and(|i| i.waiters == 1)
    });
    c.cmd(&["CLIENT", "PAUSE", "1000", "WRITE"]).ok();
    // The lease runs out while writes are paused.
    sleep_ms(600);
    let alive = answers_ping(&s);
    let (reply, waited) = waiter.join().expect("the waiter thread");
    assert!(
        alive,
        "redis-server aborted while writes were paused and a lease with a waiter ran out \
         (the module's timer granted the waiter and wrote the key during the pause): {}; \
         the waiter got {reply:?}",
        assertion(&mut s)
    );
    let t = token(reply.expect("the waiter's reply"));
    assert!(
        waited >= Duration::from_millis(250),
        "granted after {waited:?}, before the lease ended"
    );
    let mut c = s.conn();
    assert_eq!(c.lock_info("k").expect("k is held").holder("b").token, t);
}

/// As above, with a shared lock whose first reader's lease ends during the
/// pause, on a master with an AOF and a replica (the module's timer drops
/// the reader and replicates the drop).
#[test]
fn a_reader_expiring_while_writes_are_paused_does_not_crash_a_master_with_aof_and_replica() {
    let _one_at_a_time = serial();
    let mut master = aof_server("yes");
    let replica = Server::start();
    replica.replicaof(&master);
    let mut m = master.conn();
    token(m.read("s", "r1", 300));
    let t2 = token(m.read("s", "r2", 10_000));
    m.cmd(&["CLIENT", "PAUSE", "1000", "WRITE"]).ok();
    sleep_ms(600);
    let alive = answers_ping(&master);
    assert!(
        alive,
        "redis-server aborted while writes were paused and a reader's lease ran out (the \
         module's timer dropped it and replicated the drop during the pause): {}",
        assertion(&mut master)
    );
    // Once writes resume, r1 is dropped everywhere.
    sleep_ms(600);
    let mut m = master.conn();
    let s = m.lock_info("s").expect("s is held by r2");
    assert_eq!(s.holders.len(), 1, "{s:?}");
    assert_eq!(s.holder("r2").token, t2);
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    assert_same_lock(
        &m.lock_info("s"),
        &r.lock_info("s"),
        200,
        "s on the replica",
    );
}
