//! A lock's holder limit (`lock.max-holders`) and what it buys: a grant past
//! it is refused with an error and changes nothing (with `WAIT` it waits:
//! `holder_wait`), and with the limit's worth of holders (readers, a
//! semaphore's permits) the key is PERSISTed, PEXPIREd, RENAMEd, MOVEd and
//! RESTOREd whole, and every lease ending together grants the writer behind
//! them, while another connection's PINGs are answered. The longest PING is
//! printed, not asserted (a loaded machine moves it): the figures are the
//! bench's (docs/benchmarks.md, "Stalls", 20,000 holders). Work on a key
//! used to be quadratic in its holders (0.58 s at 32,000 readers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

/// How many times each step runs (RENAME and MOVE go back and forth).
const ATTEMPTS: usize = 3;

fn max_holders(c: &mut Conn) -> usize {
    let r = c.cmd(&["CONFIG", "GET", "lock.max-holders"]);
    r.array()[1].str().parse().expect("an integer")
}

/// `n` grants of one kind on `key`, pipelined: owners `<prefix><i>`.
fn fill(c: &mut Conn, key: &str, prefix: &str, n: usize, args: &[&str]) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        for i in chunk {
            let owner = format!("{prefix}{i}");
            let mut cmd: Vec<&[u8]> = vec![args[0].as_bytes(), key.as_bytes()];
            cmd.extend(args[1..args.len() - 1].iter().map(|a| a.as_bytes()));
            cmd.push(owner.as_bytes());
            cmd.push(args[args.len() - 1].as_bytes());
            c.push(&cmd);
        }
        c.flush().expect("flush");
        for i in chunk {
            let r = c.read_reply().expect("reply");
            assert!(matches!(r, Reply::Int(_)), "grant {i}: {r:?}");
        }
    }
}

/// The longest PING round trip on another connection while `op` runs on
/// `c` and for `settle` after it (the module's visits run on its timer).
fn stall_of(s: &Server, c: &mut Conn, settle: Duration, op: impl FnOnce(&mut Conn)) -> Duration {
    let stop = Arc::new(AtomicBool::new(false));
    let mut p = s.conn();
    let stop2 = stop.clone();
    let pinger = thread::spawn(move || {
        let mut worst = Duration::ZERO;
        while !stop2.load(Ordering::Relaxed) {
            let t = Instant::now();
            p.cmd(&["PING"]);
            worst = worst.max(t.elapsed());
        }
        worst
    });
    thread::sleep(Duration::from_millis(20));
    op(c);
    thread::sleep(settle);
    stop.store(true, Ordering::Relaxed);
    pinger.join().expect("pinger")
}

/// [`ATTEMPTS`] runs of `attempt` (which asserts what it did and returns
/// the longest PING meanwhile), printed: a figure, not a verdict.
fn report_stall(what: &str, mut attempt: impl FnMut(usize) -> Duration) {
    let stalls: Vec<Duration> = (0..ATTEMPTS).map(&mut attempt).collect();
    eprintln!("{what}: longest PING per attempt {stalls:?}");
}

/// Restores `key` with `n` readers (tokens after `first_token`, the
/// payload's header from `dump`, any lock's `DUMP`) whose leases all end
/// together 10 s from now (far enough for a loaded machine to build and
/// send the payload first) but the last reader's, an hour out; every
/// holder restored, when read before that deadline (after it the ended
/// leases are absent already). Returns the common deadline.
fn restore_ending_together(
    c: &mut Conn,
    key: &str,
    n: usize,
    dump: &[u8],
    first_token: u64,
) -> u64 {
    let (head, version) = dump_parts(dump);
    let deadline = now_ms() + 10_000;
    let holders: Vec<OldHolder> = (0..n)
        .map(|i| OldHolder {
            owner: format!("reader-{i}").into_bytes(),
            holds: 1,
            token: first_token + i as u64 + 1,
            deadline: if i == n - 1 {
                now_ms() + 3_600_000
            } else {
                deadline
            },
        })
        .collect();
    let body = old_lock_body(head, 2, 1, None, &holders);
    c.cmdv(&[
        b"RESTORE".to_vec(),
        key.as_bytes().to_vec(),
        b"0".to_vec(),
        dump_with_footer(&body, version),
    ])
    .ok();
    let restored = holders_of(c, key);
    if now_ms() < deadline {
        assert_eq!(restored, n);
    }
    deadline
}

/// A master and its replica, both at `lock.max-holders` `n`, the master's
/// key `mass` restored with `n` readers whose leases end together at
/// `deadline` but the last one's ([`restore_ending_together`]; reader `t`
/// of key `t` lent its DUMP's header), and the master's count of ended
/// leases before the restore (read first: on a loaded machine the leases
/// may end, and be counted, before the restore returns).
struct MassExpiry {
    master: Server,
    replica: Server,
    c: Conn,
    r: Conn,
    deadline: u64,
    expired_before: usize,
}

fn mass_expiry(n: usize) -> MassExpiry {
    let master = Server::start();
    let replica = Server::start();
    let mut c = master.conn();
    let mut r = replica.conn();
    for conn in [&mut c, &mut r] {
        conn.cmd(&["CONFIG", "SET", "lock.max-holders", &n.to_string()])
            .ok();
    }
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    // Restored with one deadline for all but the last (grants would
    // spread theirs); the payload's header from any lock's DUMP.
    let first_token = c.read("t", "t", 3_600_000).int() as u64;
    let like = c.cmd(&["DUMP", "t"]).bulk().to_vec();
    let expired_before = expired_leases(&mut c);
    let deadline = restore_ending_together(&mut c, "mass", n, &like, first_token);
    MassExpiry {
        master,
        replica,
        c,
        r,
        deadline,
        expired_before,
    }
}

/// Waits (two minutes at most) until `ended` more leases than
/// `expired_before` are counted ended, and asserts none is counted twice
/// (a purge in slices counts its ends as it drops them).
fn each_ended_lease_counted_once(c: &mut Conn, expired_before: usize, ended: usize) {
    wait_until(
        Duration::from_secs(120),
        "every ended lease counted",
        || expired_leases(c) - expired_before >= ended,
    );
    assert_eq!(
        expired_leases(c) - expired_before,
        ended,
        "each ended lease counted once"
    );
}

/// `INFO lock`'s count of leases that ended.
fn expired_leases(c: &mut Conn) -> usize {
    c.info_field("lock", "lock_expired_leases")
        .parse()
        .unwrap_or(0)
}

fn holders_of(c: &mut Conn, key: &str) -> usize {
    c.lock_info(key).map_or(0, |i| i.holders.len())
}

/// Every keyspace command that makes the module rewrite a whole lock, on a
/// lock of `key` with the limit's worth of holders.
fn no_stall_on_keyspace_commands(s: &Server, c: &mut Conn, key: &str, what: &str) {
    let settle = Duration::from_millis(60);
    let whole = holders_of(c, key);
    report_stall(&format!("{what}: PERSIST"), |_| {
        stall_of(s, c, settle, |c| {
            assert_eq!(c.cmd(&["PERSIST", key]).int(), 1);
            assert_eq!(holders_of(c, key), whole, "PERSIST kept them");
        })
    });
    report_stall(&format!("{what}: PEXPIRE"), |_| {
        stall_of(s, c, settle, |c| {
            assert_eq!(c.cmd(&["PEXPIRE", key, "5000"]).int(), 1);
            assert_eq!(holders_of(c, key), whole, "PEXPIRE kept them");
        })
    });
    let other = format!("{key}-renamed");
    report_stall(&format!("{what}: RENAME"), |i| {
        let (from, to) = if i % 2 == 0 {
            (key, &*other)
        } else {
            (&*other, key)
        };
        stall_of(s, c, settle, |c| {
            c.cmd(&["RENAME", from, to]).ok();
            assert_eq!(holders_of(c, to), whole, "RENAME moved them all");
            assert_eq!(holders_of(c, from), 0);
        })
    });
    if ATTEMPTS % 2 == 1 {
        c.cmd(&["RENAME", &other, key]).ok();
    }
    report_stall(&format!("{what}: MOVE"), |i| {
        let (db, to) = if i % 2 == 0 { ("0", "1") } else { ("1", "0") };
        c.cmd(&["SELECT", db]).ok();
        stall_of(s, c, settle, |c| {
            assert_eq!(c.cmd(&["MOVE", key, to]).int(), 1);
            assert_eq!(holders_of(c, key), 0, "MOVEd out of db {db}");
            c.cmd(&["SELECT", to]).ok();
            assert_eq!(holders_of(c, key), whole, "MOVEd whole to db {to}");
            c.cmd(&["SELECT", db]).ok();
        })
    });
    if ATTEMPTS % 2 == 1 {
        c.cmd(&["SELECT", "1"]).ok();
        assert_eq!(c.cmd(&["MOVE", key, "0"]).int(), 1);
    }
    c.cmd(&["SELECT", "0"]).ok();
    let payload = c.cmd(&["DUMP", key]).bulk().to_vec();
    report_stall(&format!("{what}: RESTORE"), |i| {
        let copy = format!("{key}-restored{i}");
        let stall = stall_of(s, c, settle, |c| {
            c.cmdv(&[
                b"RESTORE".to_vec(),
                copy.clone().into_bytes(),
                b"0".to_vec(),
                payload.clone(),
            ])
            .ok();
        });
        assert_eq!(holders_of(c, &copy), holders_of(c, key), "restored whole");
        c.cmd(&["DEL", &copy]).int();
        stall
    });
    assert!(
        c.pttl(key) > 3_000_000,
        "the key's TTL is its leases' again"
    );
}

#[test]
fn a_grant_past_the_holder_limit_is_an_error_and_changes_nothing() {
    let s = Server::builder().config("lock.max-holders 50").start();
    let mut c = s.conn();
    assert_eq!(max_holders(&mut c), 50);
    fill(&mut c, "r", "r", 50, &["LOCK.READ", "60000"]);
    fill(&mut c, "s", "s", 50, &["LOCK.SEMAPHORE", "1000", "60000"]);
    let offset = s.repl_offset();
    for (key, cmd) in [
        ("r", vec!["LOCK.READ", "r", "new", "60000"]),
        ("s", vec!["LOCK.SEMAPHORE", "s", "1000", "new", "60000"]),
    ] {
        let r = c.cmd(&cmd);
        assert!(r.is_err(), "{cmd:?}: {r:?}");
        assert!(r.err().starts_with("ERR "), "{cmd:?}: {r:?}");
        assert!(r.err().contains("lock.max-holders is 50"), "{r:?}");
        assert_eq!(holders_of(&mut c, key), 50, "nothing changed");
    }
    assert_eq!(s.repl_offset(), offset, "a refusal replicates nothing");
    // A holder's repeat is not a new holder.
    assert!(matches!(c.read("r", "r7", 60000), Reply::Int(_)));
    let repeat = c.cmd(&["LOCK.SEMAPHORE", "s", "1000", "s7", "60000"]);
    assert!(matches!(repeat, Reply::Int(_)), "{repeat:?}");
    // One leaves, one more may come; the limit moves with CONFIG SET.
    assert_eq!(c.release("r", "r0").int(), 1);
    assert!(matches!(c.read("r", "new", 60000), Reply::Int(_)));
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "51"]).ok();
    assert!(matches!(c.read("r", "new2", 60000), Reply::Int(_)));
    assert!(c.read("r", "new3", 60000).is_err());
    // An exclusive lock is one holder whatever the limit.
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "1"]).ok();
    assert!(matches!(c.acquire("x", "a", 60000), Reply::Int(_)));
    assert!(c.acquire("x", "b", 60000).is_nil());
    assert!(c.cmd(&["CONFIG", "SET", "lock.max-holders", "0"]).is_err());
}

#[test]
fn the_limits_worth_of_holders_never_stalls_the_server() {
    let s = Server::start();
    let mut c = s.conn();
    let max = max_holders(&mut c);
    eprintln!("lock.max-holders {max}");
    fill(&mut c, "big", "reader-", max, &["LOCK.READ", "3600000"]);
    assert_eq!(holders_of(&mut c, "big"), max);
    no_stall_on_keyspace_commands(&s, &mut c, "big", "readers");
    fill(
        &mut c,
        "sem",
        "permit-",
        max,
        &["LOCK.SEMAPHORE", "1000000", "3600000"],
    );
    assert_eq!(holders_of(&mut c, "sem"), max);
    no_stall_on_keyspace_commands(&s, &mut c, "sem", "semaphore");

    // Every lease ending together, a writer waiting for them: the visit at
    // their deadline drops them all and grants it. The readers are
    // restored with one deadline (grants would spread theirs).
    let head = c.cmd(&["DUMP", "big"]).bulk().to_vec();
    let (_, version) = dump_parts(&head);
    let first_token = c.read("t", "t", 1000).int() as u64;
    report_stall("every reader expiring at once", |i| {
        let key = format!("expiring{i}");
        let deadline = now_ms() + 3_000;
        let holders: Vec<OldHolder> = (0..max)
            .map(|n| OldHolder {
                owner: format!("reader-{n}").into_bytes(),
                holds: 1,
                token: first_token + (i * max + n) as u64 + 1,
                deadline,
            })
            .collect();
        let body = old_lock_body(&head, 2, 1, None, &holders);
        let payload = dump_with_footer(&body, version);
        c.cmdv(&[
            b"RESTORE".to_vec(),
            key.clone().into_bytes(),
            b"0".to_vec(),
            payload,
        ])
        .ok();
        assert_eq!(holders_of(&mut c, &key), max);
        let mut w = s.conn();
        w.send(&["LOCK.ACQUIRE", &key, "writer", "1000", "WAIT", "5000"])
            .expect("send");
        // Measured from shortly before the deadline (a shorter window
        // catches less of the machine's own noise).
        thread::sleep(Duration::from_millis(
            deadline.saturating_sub(now_ms()).saturating_sub(100),
        ));
        let stall = stall_of(&s, &mut c, Duration::from_millis(250), |_| {});
        let granted = w.read_reply().expect("the writer's reply");
        assert!(matches!(granted, Reply::Int(_)), "{granted:?}");
        stall
    });
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `commands(i)` for each `i` below `n`, pipelined in chunks: the replies
/// in order.
fn pipelined(c: &mut Conn, n: usize, command: impl Fn(usize) -> Vec<String>) -> Vec<Reply> {
    let mut replies = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        for &i in chunk {
            let args = command(i);
            let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            c.push(&args);
        }
        c.flush().expect("flush");
        for _ in chunk {
            replies.push(c.read_reply().expect("reply"));
        }
    }
    replies
}

/// 200,000 readers of one key (`lock.max-holders` raised to them): each
/// one found by its owner (a renewal with its own token answers 1), each
/// released exactly once (a second release answers nil), in an order that
/// leaves gaps between the live readers (a large lock's removals mark
/// entries rather than move the rest: docs/design.md, "How many holders a
/// key may have"), and `LOCK.INFO` lists exactly the readers left, with
/// their tokens, before and after a save and load. What it cost is the
/// bench's (section 10, shape (13)), never asserted here.
#[test]
fn two_hundred_thousand_readers_are_each_found_and_released_exactly_once() {
    let n = 200_000;
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&["CONFIG", "SET", "lock.max-holders", &n.to_string()])
        .ok();
    let owner = |i: usize| format!("reader-{i}");
    let granted = pipelined(&mut c, n, |i| {
        vec![
            "LOCK.READ".into(),
            "wide".into(),
            owner(i),
            "3600000".into(),
        ]
    });
    let tokens: Vec<i64> = granted.iter().map(|r| r.int()).collect();
    let distinct: std::collections::HashSet<i64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), n, "every reader its own token");
    // At the limit: a new reader is refused, a repeat is not.
    let refused = c.cmd(&["LOCK.READ", "wide", "one-more", "3600000"]);
    assert!(refused.err().contains("lock.max-holders"), "{refused:?}");
    // Every reader found by its owner and token.
    let renewed = pipelined(&mut c, n, |i| {
        vec![
            "LOCK.RENEW".into(),
            "wide".into(),
            owner(i),
            "3600000".into(),
            "TOKEN".into(),
            tokens[i].to_string(),
        ]
    });
    assert!(renewed.iter().all(|r| r.int() == 1));
    // Released: every third reader, then the readers from the end down to
    // the middle (every one of them once).
    let gone = |i: usize| i.is_multiple_of(3) || i >= n / 2;
    let order: Vec<usize> = (0..n)
        .filter(|i| i.is_multiple_of(3))
        .chain((n / 2..n).rev().filter(|i| !i.is_multiple_of(3)))
        .collect();
    let released = pipelined(&mut c, order.len(), |k| {
        vec!["LOCK.RELEASE".into(), "wide".into(), owner(order[k])]
    });
    assert!(released.iter().all(|r| r.int() == 1), "each released once");
    let again = pipelined(&mut c, order.len(), |k| {
        vec!["LOCK.RELEASE".into(), "wide".into(), owner(order[k])]
    });
    assert!(
        again.iter().all(|r| r.is_nil()),
        "a second release holds nothing"
    );
    let left: Vec<(Vec<u8>, i64)> = {
        let mut left: Vec<(Vec<u8>, i64)> = (0..n)
            .filter(|&i| !gone(i))
            .map(|i| (owner(i).into_bytes(), tokens[i]))
            .collect();
        left.sort();
        left
    };
    let listed = |c: &mut Conn| -> Vec<(Vec<u8>, i64)> {
        let info = c.lock_info("wide").expect("still held");
        info.holders
            .iter()
            .map(|h| (h.owner.clone(), h.token))
            .collect()
    };
    assert_eq!(listed(&mut c), left);
    c.cmd(&["DEBUG", "RELOAD"]).ok();
    assert_eq!(listed(&mut c), left);
    // The rest, each found after the load too; then the key is gone.
    let rest: Vec<usize> = (0..n).filter(|&i| !gone(i)).collect();
    let released = pipelined(&mut c, rest.len(), |k| {
        vec!["LOCK.RELEASE".into(), "wide".into(), owner(rest[k])]
    });
    assert!(released.iter().all(|r| r.int() == 1));
    assert_eq!(c.cmd(&["EXISTS", "wide"]).int(), 0);
}

/// 200,000 readers of one key (`lock.max-holders` raised to them), a
/// replica attached, 5,000 more readers granted and 5,000 renewed (each
/// applied by the replica through the lock's index): `PERSIST`, `PEXPIRE`, `RENAME`, `MOVE` and `RESTORE`
/// of the key each leave every reader as it was, on the master and on the
/// replica, and the key's TTL its latest lease's again on both (the
/// refresh sends the replica one absolute `PEXPIREAT`, not every holder:
/// docs/design.md, "How many holders a key may have"); then all but one
/// of the readers of a restored key whose leases end together are dropped
/// by the visit at their deadline, on both, the last one left with its
/// TTL. What it cost is the bench's (section 10, shape (6) with
/// `--holders`), never asserted here.
#[test]
fn two_hundred_thousand_holders_keep_their_state_through_keyspace_commands_and_a_mass_expiry() {
    let n = 200_000;
    let master = Server::start();
    let replica = Server::start();
    let mut c = master.conn();
    let mut r = replica.conn();
    let late = 5_000;
    for conn in [&mut c, &mut r] {
        conn.cmd(&["CONFIG", "SET", "lock.max-holders", &(n + late).to_string()])
            .ok();
    }
    let granted = pipelined(&mut c, n, |i| {
        vec![
            "LOCK.READ".into(),
            "big".into(),
            format!("reader-{i}"),
            "3600000".into(),
        ]
    });
    assert!(granted.iter().all(|g| matches!(g, Reply::Int(_))));
    // Attached after the grants: the replica loads them in one full sync.
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    // Grants and renewals the replica applies one by one (`LOCK.SYNC` on
    // a lock of 200,000: through its index).
    let more = pipelined(&mut c, late, |i| {
        vec![
            "LOCK.READ".into(),
            "big".into(),
            format!("late-{i}"),
            "3600000".into(),
        ]
    });
    assert!(more.iter().all(|g| matches!(g, Reply::Int(_))));
    let renewed = pipelined(&mut c, late, |i| {
        vec![
            "LOCK.RENEW".into(),
            "big".into(),
            format!("reader-{}", i * 7),
            "3500000".into(),
        ]
    });
    assert!(renewed.iter().all(|g| g.int() == 1));
    let n = n + late;
    let whole = c.lock_info("big").expect("the lock").stable();
    assert_eq!(whole.1.len(), n);
    wait_for_sync(&master, &replica);
    assert!(
        r.lock_info("big").expect("the replica's lock").stable() == whole,
        "the replica applied every grant and renewal"
    );
    // The key `key` of database `db` holds `whole` on both servers, and
    // its TTL is its leases' (over 3,000 s of the hour) on both, once the
    // refresh visit ran and reached the replica.
    let same_on_both = |c: &mut Conn, r: &mut Conn, db: &str, key: &str, what: &str| {
        c.cmd(&["SELECT", db]).ok();
        r.cmd(&["SELECT", db]).ok();
        wait_until(Duration::from_secs(30), what, || c.pttl(key) > 3_000_000);
        wait_for_sync(&master, &replica);
        for (conn, side) in [(&mut *c, "master"), (&mut *r, "replica")] {
            let info = conn.lock_info(key).expect("the lock");
            assert!(
                info.stable() == whole,
                "{what}: the {side} has {} holders, not the {n} it had",
                info.holders.len()
            );
            let ttl = conn.pttl(key);
            assert!(ttl > 3_000_000, "{what}: the {side}'s TTL is {ttl}");
        }
        c.cmd(&["SELECT", "0"]).ok();
        r.cmd(&["SELECT", "0"]).ok();
    };
    assert_eq!(c.cmd(&["PERSIST", "big"]).int(), 1);
    same_on_both(&mut c, &mut r, "0", "big", "after PERSIST");
    assert_eq!(c.cmd(&["PEXPIRE", "big", "5000"]).int(), 1);
    same_on_both(&mut c, &mut r, "0", "big", "after PEXPIRE");
    c.cmd(&["RENAME", "big", "big2"]).ok();
    assert!(c.lock_info("big").is_none(), "renamed away");
    same_on_both(&mut c, &mut r, "0", "big2", "after RENAME");
    assert_eq!(c.cmd(&["MOVE", "big2", "1"]).int(), 1);
    assert!(c.lock_info("big2").is_none(), "moved away");
    same_on_both(&mut c, &mut r, "1", "big2", "after MOVE");
    c.cmd(&["SELECT", "1"]).ok();
    let payload = c.cmd(&["DUMP", "big2"]).bulk().to_vec();
    c.cmd(&["SELECT", "0"]).ok();
    c.cmdv(&[
        b"RESTORE".to_vec(),
        b"big3".to_vec(),
        b"0".to_vec(),
        payload.clone(),
    ])
    .ok();
    same_on_both(&mut c, &mut r, "0", "big3", "after RESTORE");

    // All but the last reader's leases end together: restored with one
    // deadline (grants would spread theirs).
    let first_token = c.read("t", "t", 3_600_000).int() as u64;
    let deadline = restore_ending_together(&mut c, "expiring", n, &payload, first_token);
    wait_until(Duration::from_secs(60), "every ended lease dropped", || {
        holders_of(&mut c, "expiring") == 1
    });
    assert!(now_ms() >= deadline, "none dropped before its deadline");
    wait_for_sync(&master, &replica);
    let last = format!("reader-{}", n - 1).into_bytes();
    for (conn, side) in [(&mut c, "master"), (&mut r, "replica")] {
        let info = conn.lock_info("expiring").expect("the last reader's lock");
        let owners: Vec<&[u8]> = info.holders.iter().map(|h| h.owner.as_slice()).collect();
        assert_eq!(
            owners,
            [last.as_slice()],
            "the {side} keeps the last reader"
        );
        let ttl = conn.pttl("expiring");
        assert!(
            ttl > 3_000_000,
            "the {side}'s TTL is the last lease's: {ttl}"
        );
    }
    // (`LOCK.INFO` takes expired holders as absent at once: the purge's
    // slices may still be counting them.)
    wait_until(
        Duration::from_secs(120),
        "every ended lease counted",
        || expired_leases(&mut c) >= n - 1,
    );
    assert_eq!(
        c.info_field("lock", "lock_expired_leases"),
        (n - 1).to_string(),
        "each ended lease counted once"
    );
}

/// 200,000 readers of one key whose leases all end together but the last
/// one's, a writer waiting for the key: the purge of a lock that large
/// goes in slices over turns (docs/design.md, "How many holders a key may
/// have"), and what anyone sees is the lock purged at the deadline. The
/// writer is granted only once the last reader left (it releases right
/// at the deadline, while the purge may still go on: its grant sets the
/// readers left aside), and then holds the key alone, renamed in the same
/// read as that release; every ended lease is counted once (the readers
/// set aside too, after the rename), `INFO`'s holder counts and the
/// replica's lock are exact.
#[test]
fn a_mass_expiry_of_two_hundred_thousand_readers_grants_the_waiting_writer_after_the_last() {
    let n = 200_000;
    let MassExpiry {
        master,
        replica,
        mut c,
        mut r,
        deadline,
        expired_before,
    } = mass_expiry(n);
    // The writer waits (a minute at most) from before the deadline.
    let mut w = master.conn();
    w.send(&["LOCK.ACQUIRE", "mass", "writer", "600000", "WAIT", "60000"])
        .expect("send");
    wait_until(Duration::from_secs(10), "the writer waits", || {
        c.info_field("clients", "blocked_clients") == "1"
    });
    // The last reader leaves at the deadline: the others' leases ended
    // with it, whether or not the purge has dropped them all yet.
    let left = deadline.saturating_sub(now_ms());
    thread::sleep(Duration::from_millis(left + 1));
    // The key renamed in the same read as the release, before any tick:
    // the readers the writer's grant set aside are ended all the same
    // (their ends are not the old name's visits, which a RENAME forgets).
    let last = format!("reader-{}", n - 1);
    let replies = pipelined(&mut c, 2, |i| match i {
        0 => vec!["LOCK.RELEASE".into(), "mass".into(), last.clone()],
        _ => vec!["RENAME".into(), "mass".into(), "moved".into()],
    });
    assert_eq!(
        replies[0],
        Reply::Int(1),
        "the last reader held until it left"
    );
    assert_eq!(replies[1], Reply::Status("OK".into()), "the rename");
    let granted = w.read_reply().expect("the writer's reply");
    assert!(matches!(granted, Reply::Int(_)), "{granted:?}");
    // Each ended lease counted once (the writer's grant may set the last
    // slices' readers aside: their ends are counted as they are ended;
    // the replica is compared once every drop was sent).
    each_ended_lease_counted_once(&mut c, expired_before, n - 1);
    // Nothing of the readers is left: the writer holds the key alone.
    for (conn, side) in [(&mut c, "master"), (&mut r, "replica")] {
        if side == "replica" {
            wait_for_sync(&master, &replica);
        }
        let info = conn.lock_info("moved").expect("the writer's lock");
        let owners: Vec<&[u8]> = info.holders.iter().map(|h| h.owner.as_slice()).collect();
        assert_eq!(
            owners,
            [b"writer".as_slice()],
            "the {side} has the writer alone"
        );
    }
    assert_eq!(c.info_field("lock", "lock_holders_shared"), "1", "reader t");
    assert_eq!(
        c.info_field("lock", "lock_holders_exclusive"),
        "1",
        "the writer"
    );
    // No reader's entry came back: a release of one holds nothing.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "moved", "reader-7"]), Reply::Nil);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "moved", "writer"]).int(), 1);
    assert!(c.lock_info("moved").is_none(), "released: the key is gone");
}

/// 200,000 readers of one key, `lock.max-holders` then lowered to 2, all
/// but one ending together: right after their deadline (the purge in
/// slices under way: a pipeline read in one go, its sleep past the
/// deadline) a newcomer's `READ` without `WAIT` is granted (one live
/// holder: the limit counts the live ones, whatever the purge has dropped
/// yet) and a third's gets the limit's error (two live); once the last
/// live reader and the newcomer leave, a writer's `ACQUIRE` without
/// `WAIT` is granted too, not answered nil: every reply is the one on the
/// lock purged whole. After: the writer holds the key alone on the
/// master (`LOCK.INFO`) and the replica, `INFO lock`'s holder counts are
/// exact at once, and each ended lease is counted once.
#[test]
fn after_a_mass_expiry_a_newcomer_at_the_limit_and_a_writer_without_wait_are_granted_at_once() {
    let n = 200_000;
    let MassExpiry {
        master,
        replica,
        mut c,
        mut r,
        deadline,
        expired_before,
    } = mass_expiry(n);
    // The master's limit lowered to 2 (a lowered setting keeps the
    // holders): past it by the stored count, a newcomer before the
    // deadline gets the limit's error.
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "2"]).ok();
    if now_ms() + 1_000 < deadline {
        let refused = c.cmd(&["LOCK.READ", "mass", "early", "60000"]);
        assert!(
            matches!(&refused, Reply::Error(e) if e.starts_with("ERR")),
            "{refused:?}"
        );
    }
    // Pipelined, read by the server in one go: a sleep past the deadline
    // (no visit, no slice of the purge meanwhile), then in the same turn,
    // before the purge's next slices: the newcomer (one live reader: room
    // for it), one more (two live: the limit's error), the last live
    // reader and the newcomer leaving, the writer.
    let sleep = deadline.saturating_sub(now_ms()) + 50;
    let last = format!("reader-{}", n - 1);
    let replies = pipelined(&mut c, 6, |i| {
        let secs = format!("{:.3}", sleep as f64 / 1000.0);
        let args: &[&str] = match i {
            0 => &["DEBUG", "SLEEP", &secs],
            1 => &["LOCK.READ", "mass", "newcomer", "60000"],
            2 => &["LOCK.READ", "mass", "third", "60000"],
            3 => &["LOCK.RELEASE", "mass", &last],
            4 => &["LOCK.RELEASE", "mass", "newcomer"],
            _ => &["LOCK.ACQUIRE", "mass", "writer", "600000"],
        };
        args.iter().map(|a| a.to_string()).collect()
    });
    assert!(now_ms() > deadline);
    assert!(
        matches!(replies[1], Reply::Int(_)),
        "newcomer: {:?}",
        replies[1]
    );
    assert!(
        matches!(&replies[2], Reply::Error(e) if e.contains("lock.max-holders is 2")),
        "a third at the limit: {:?}",
        replies[2]
    );
    assert_eq!(
        replies[3],
        Reply::Int(1),
        "the last reader held until it left"
    );
    assert_eq!(replies[4], Reply::Int(1), "the newcomer held until it left");
    assert!(
        matches!(replies[5], Reply::Int(_)),
        "writer: {:?}",
        replies[5]
    );
    // At once: the writer alone, and the counts say so.
    let info = c.lock_info("mass").expect("the writer's lock");
    let owners: Vec<&[u8]> = info.holders.iter().map(|h| h.owner.as_slice()).collect();
    assert_eq!(owners, [b"writer".as_slice()], "the writer alone");
    assert_eq!(c.info_field("lock", "lock_holders_shared"), "1", "reader t");
    assert_eq!(c.info_field("lock", "lock_holders_exclusive"), "1");
    // A reader now waits for the writer, as on any held key.
    assert_eq!(c.cmd(&["LOCK.READ", "mass", "late", "60000"]), Reply::Nil);
    each_ended_lease_counted_once(&mut c, expired_before, n - 1);
    wait_for_sync(&master, &replica);
    let info = r.lock_info("mass").expect("the replica's lock");
    let owners: Vec<&[u8]> = info.holders.iter().map(|h| h.owner.as_slice()).collect();
    assert_eq!(
        owners,
        [b"writer".as_slice()],
        "the replica has the writer alone"
    );
    assert_eq!(
        r.info_field("lock", "lock_holders_shared"),
        "1",
        "replica: reader t"
    );
    assert_eq!(r.info_field("lock", "lock_holders_exclusive"), "1");
    assert_eq!(c.cmd(&["LOCK.RELEASE", "mass", "writer"]).int(), 1);
    assert!(c.lock_info("mass").is_none(), "released: the key is gone");
}
