//! Refused input is logged at most once a second per kind, with a count
//! (contract v4, "Limits and forged state"; issue 38 item 4): 1,000 refused
//! `RESTORE` payloads, or an AOF of 1,000 effects a load refuses or clamps,
//! give a few lines whose counts add up to what was refused, never a line
//! each. (Redis itself logs nothing for a bad payload.)

use std::time::{Duration, Instant};

use crate::common::*;

const DAY_MS: i64 = 24 * 3600 * 1000;
const COUNT: &str = "(count since the last such line: ";

/// The server log's lines of one kind (their text contains `kind`), and the
/// sum of their counts.
fn lines_of(s: &Server, kind: &str) -> (usize, u64) {
    let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(kind)).collect();
    let counted = lines
        .iter()
        .map(|l| {
            let at = l.find(COUNT).unwrap_or_else(|| panic!("no count: {l}"));
            let rest = &l[at + COUNT.len()..];
            let end = rest.find(|ch: char| !ch.is_ascii_digit()).unwrap_or(0);
            rest[..end].parse::<u64>().expect("a count")
        })
        .sum();
    (lines.len(), counted)
}

/// Waits until the lines of `kind` count `n` in all (the cron writes what
/// was counted once a second has passed), then checks they are at most
/// one a second since `start`.
#[track_caller]
fn assert_throttled(s: &Server, kind: &str, n: u64, start: Instant) {
    wait_until(
        Duration::from_secs(20),
        "every refusal counted in the log",
        || lines_of(s, kind).1 >= n,
    );
    let (lines, counted) = lines_of(s, kind);
    let seconds = start.elapsed().as_secs() as usize;
    assert_eq!(counted, n, "{kind}: the counts add up to what was refused");
    assert!(
        lines <= seconds + 1,
        "{kind}: {lines} lines in {seconds} s, more than one a second"
    );
}

#[test]
fn a_thousand_refused_restores_log_a_few_lines_with_their_count() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "rdbcompression", "no"]).ok();
    c.acquire("x", "a", 100_000).int();
    let deadline = c.cmd(&["PEXPIRETIME", "x"]).int();
    let payload = c.cmd(&["DUMP", "x"]).bulk().to_vec();
    // A lease no server grants (past lock.max-ttl; the top bit clear: set,
    // it would name a session).
    let forged = with_bytes_replaced(
        &payload,
        &(deadline as u64).to_le_bytes(),
        &(u64::MAX >> 1).to_le_bytes(),
    );
    let start = Instant::now();
    for chunk in 0..10 {
        for i in 0..100 {
            let key = format!("t{chunk}:{i}");
            c.push(&[b"RESTORE".as_slice(), key.as_bytes(), b"0", &forged]);
        }
        c.flush().expect("flush");
        for _ in 0..100 {
            let r = c.read_reply().expect("a reply");
            assert!(r.is_err(), "a forged payload restored: {r:?}");
        }
    }
    assert_eq!(c.cmd(&["DBSIZE"]).int(), 1, "nothing restored");
    assert_throttled(&s, "refused a RESTORE payload", 1_000, start);
    // The next after a quiet second is logged at once, with its count of 1.
    sleep_ms(1_100);
    let (before, _) = lines_of(&s, "refused a RESTORE payload");
    let r = c.cmd(&[b"RESTORE".as_slice(), b"one", b"0", &forged]);
    assert!(r.is_err(), "{r:?}");
    let log = std::fs::read_to_string(s.log_path()).unwrap_or_default();
    let last = log.lines().rfind(|l| l.contains("refused a RESTORE"));
    assert_eq!(lines_of(&s, "refused a RESTORE payload").0, before + 1);
    assert!(
        last.is_some_and(|l| l.contains(&format!("{COUNT}1;")) && l.contains("lock.max-ttl")),
        "{last:?}"
    );
}

#[test]
fn an_aof_of_a_thousand_impossible_effects_logs_a_few_lines_with_their_count() {
    let mut s = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        .start();
    let mut c = s.conn();
    let t = c.acquire("k", "a", 100_000).int();
    s.shutdown_save();
    let aof = std::fs::read_dir(s.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("the incremental AOF");
    let mut text = std::fs::read(&aof).expect("read the AOF");
    let sync = |key: &str, token: i64, deadline: i64| {
        let state = format!("exclusive:1:{token}:{deadline}");
        format!(
            "*4\r\n$9\r\nLOCK.SYNC\r\n${}\r\n{key}\r\n${}\r\n{state}\r\n$1\r\no\r\n",
            key.len(),
            state.len()
        )
    };
    let century = now_ms() + 100 * 365 * DAY_MS;
    for i in 0..500 {
        let bad = sync(&format!("bad{i}"), i64::MAX - 1, now_ms() + 100_000);
        text.extend_from_slice(bad.as_bytes());
        let long = sync(&format!("long{i}"), t + 1 + i, century);
        text.extend_from_slice(long.as_bytes());
    }
    std::fs::write(&aof, text).expect("write the AOF");
    let start = Instant::now();
    s.restart();
    let mut c = s.conn();
    assert!(c.lock_info("bad0").is_none());
    assert!(c.lock_info("long499").is_some());
    assert_throttled(&s, "dropped an AOF effect", 500, start);
    assert_throttled(&s, "an AOF lease ended past lock.max-ttl", 500, start);
    let fixed: i64 = c
        .info_field("lock", "lock_loaded_state_fixed")
        .parse()
        .expect("int");
    assert_eq!(fixed, 1_000, "every one counted in INFO lock");
}
