//! Fencing tokens when clocks step and masters fail (shared/CONTRACT.md,
//! "Fencing tokens", "Clock steps"): no token repeats and none issued after a
//! restart or a promotion is lower than one issued before, even for grants
//! the file or the replica never received, as long as no clock is behind by
//! more than `lock.clock-skew-ms`. The servers' wall clocks are shifted for
//! real (`ShiftedClock`, an LD_PRELOAD shim).

use crate::common::*;

fn token(r: Reply) -> i64 {
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

/// Grants and releases `n` locks; returns the highest token.
fn churn(c: &mut Conn, prefix: &str, n: usize) -> i64 {
    let mut max = 0;
    for i in 0..n {
        let key = format!("{prefix}{}", i % 8);
        max = max.max(token(c.acquire(&key, "o", 60_000)));
        assert_eq!(c.release(&key, "o").int(), 1);
    }
    max
}

/// Steps `clock` to `offset_ms` and waits until the server sees it (Valkey
/// refreshes its cached time a few times a second).
fn step(c: &mut Conn, clock: &ShiftedClock, offset_ms: i64) {
    let before = server_ms(c);
    clock.set(offset_ms);
    wait_until(
        std::time::Duration::from_secs(5),
        "the server to see the step",
        || (server_ms(c) - before - offset_ms).abs() < 2_000,
    );
}

fn server_ms(c: &mut Conn) -> i64 {
    let t = c.cmd(&["TIME"]);
    let parts: Vec<i64> = t.array().iter().map(|p| p.str().parse().unwrap()).collect();
    parts[0] * 1000 + parts[1] / 1000
}

fn stat(c: &mut Conn, field: &str) -> i64 {
    c.info_field("lock", &format!("lock_{field}"))
        .parse()
        .unwrap()
}

/// Grants saved in an RDB, more granted after it, kill -9, a restart with the
/// clock 6.4 s behind: the first token after the restart, and the highest
/// token issued before. `margin_ms`: `lock.clock-skew-ms`, or the default.
fn restart_behind(margin_ms: Option<i64>) -> (i64, i64) {
    let clock = ShiftedClock::new(0);
    let mut b = Server::builder().clock(&clock);
    if let Some(m) = margin_ms {
        b = b.config(&format!("lock.clock-skew-ms {m}"));
    }
    let mut s = b.start();
    let mut c = s.conn();
    churn(&mut c, "saved", 64);
    c.cmd(&["SAVE"]).ok();
    // Granted after the save: the file never hears of these.
    let max = churn(&mut c, "lost", 128);
    s.kill9();
    clock.set(-6_400);
    s.restart();
    let mut c = s.conn();
    (token(c.acquire("after", "o", 60_000)), max)
}

#[test]
fn kill9_with_an_rdb_and_a_restart_6_4_s_behind_never_repeats_a_token() {
    for margin in [Some(60_000), None] {
        let (first, max) = restart_behind(margin);
        assert!(
            first > max,
            "margin {margin:?}: first token after the restart {first} <= {max}"
        );
    }
}

/// The control: with no margin, the same restart does issue tokens again
/// (the test above can fail).
#[test]
fn without_the_margin_a_clock_behind_repeats_tokens() {
    let (first, max) = restart_behind(Some(0));
    assert!(first <= max, "expected a repeated token: {first} > {max}");
}

#[test]
fn an_aof_without_preamble_and_a_restart_14_s_behind_never_repeats_a_token() {
    let clock = ShiftedClock::new(0);
    let mut s = Server::builder()
        .clock(&clock)
        .config("appendonly yes")
        .config("aof-use-rdb-preamble no")
        .start();
    let mut c = s.conn();
    churn(&mut c, "k", 24);
    c.cmd(&["BGREWRITEAOF"]);
    wait_until(std::time::Duration::from_secs(10), "the rewrite", || {
        c.info_field("persistence", "aof_rewrite_in_progress") == "0"
            && c.info_field("persistence", "aof_rewrite_scheduled") == "0"
    });
    let max = churn(&mut c, "k", 24);
    s.shutdown_save();
    clock.set(-14_000);
    s.restart();
    let mut c = s.conn();
    let first = token(c.acquire("after", "o", 60_000));
    assert!(
        first > max,
        "first token after the restart {first} <= {max}"
    );
}

#[test]
fn a_replica_10_s_behind_promoted_after_missing_grants_issues_higher_tokens() {
    let master_clock = ShiftedClock::new(0);
    let replica_clock = ShiftedClock::new(-10_000);
    let mut master = Server::builder().clock(&master_clock).start();
    let replica = Server::builder().clock(&replica_clock).start();
    replica.replicaof(&master);
    let mut m = master.conn();
    churn(&mut m, "seen", 16);
    wait_for_sync(&master, &replica);
    // The replica loses its master (it stays a replica, of nobody there).
    let dead = Server::start();
    let dead_port = dead.port.to_string();
    drop(dead);
    replica
        .conn()
        .cmd(&["REPLICAOF", "127.0.0.1", &dead_port])
        .ok();
    // The master's last grants, which the replica never receives.
    let max = churn(&mut m, "lost", 21);
    token(m.acquire("held", "a", 60_000));
    master.kill9();
    replica.promote();
    let mut r = replica.conn();
    let first = token(r.acquire("held", "b", 60_000));
    assert!(
        first > max,
        "first token of the new master {first} <= {max}"
    );
    let more = churn(&mut r, "lost", 21);
    assert!(more > first);
}

#[test]
fn a_clock_stepping_back_while_the_server_runs_never_lowers_a_token() {
    let clock = ShiftedClock::new(0);
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    let before = churn(&mut c, "k", 10);
    step(&mut c, &clock, -30_000);
    let after = churn(&mut c, "k", 10);
    assert!(after > before, "{after} <= {before}");
    // A lease is an absolute deadline: it is now 30 s longer; said in the log
    // and counted.
    assert_eq!(stat(&mut c, "clock_steps_back"), 1);
    assert!(s.log_tail(50).contains("wall clock stepped back"));
}

#[test]
fn a_clock_stepping_forward_a_day_ends_the_leases_it_passes_and_says_so() {
    let clock = ShiftedClock::new(0);
    let s = Server::builder().clock(&clock).start();
    let mut c = s.conn();
    let t1 = token(c.acquire("k", "a", 3_600_000));
    step(&mut c, &clock, 86_400_000);
    // The lease's deadline is behind the new clock: the lock is free, and
    // the next holder's token is above the old one.
    assert!(c.lock_info("k").is_none(), "the lease ended with the step");
    let t2 = token(c.acquire("k", "b", 60_000));
    assert!(t2 > t1);
    assert_eq!(stat(&mut c, "clock_steps_forward"), 1);
    assert!(s.log_tail(50).contains("wall clock stepped forward"));
}
