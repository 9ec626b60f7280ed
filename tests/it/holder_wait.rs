//! The holder limit and waiting (contract v4, "Limits and forged state";
//! issue 38 item 4): a `LOCK.READ` or `LOCK.SEMAPHORE` with `WAIT` that
//! finds the key at `lock.max-holders` waits in the queue, first come first
//! served, and is granted when a holder leaves (release or lease end);
//! readers at the head are granted together up to the limit and the rest
//! keep their place; only a request without `WAIT` gets the limit's error.
//! (A semaphore at its own limit of permits waited already: checked too.)

use std::time::Duration;

use crate::common::*;

const LIMIT: &str = "lock.max-holders is 3";

fn server() -> Server {
    Server::builder().config("lock.max-holders 3").start()
}

/// The owners waiting on `key`, in queue order (`LOCK.INFO key WAITERS`).
fn waiting(c: &mut Conn, key: &str) -> Vec<String> {
    let r = c.cmd(&["LOCK.INFO", key, "WAITERS"]);
    if r.is_nil() {
        return Vec::new();
    }
    let list = r.get("waiting").expect("the waiting list");
    list.array().iter().map(|w| w.array()[0].str()).collect()
}

/// The live holders of `key`, sorted.
fn holders(c: &mut Conn, key: &str) -> Vec<String> {
    let mut owners: Vec<String> = c
        .lock_info(key)
        .map(|i| i.holders.iter().map(|h| show(&h.owner)).collect())
        .unwrap_or_default();
    owners.sort();
    owners
}

/// Sends `args` (a grant with `WAIT`) on a connection of its own, and waits
/// until it is queued on `key` as the `n`th waiter (so that the queue's
/// order is the order of the calls).
fn queue(s: &Server, c: &mut Conn, key: &str, args: &[&str], n: usize) -> Conn {
    let mut w = s.conn();
    w.send(args).expect("send");
    wait_until(Duration::from_secs(10), "the request to queue", || {
        waiting(c, key).len() == n
    });
    w
}

#[track_caller]
fn granted(w: &mut Conn) -> i64 {
    let r = w.read_reply().expect("a reply");
    match r {
        Reply::Int(t) if t > 0 => t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn owners(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// The case: six readers wait behind a writer with the limit at 3;
/// the writer's release grants three, and the other three wait their turn
/// (they used to get the limit's error at once).
#[test]
fn readers_behind_a_writer_are_granted_up_to_the_limit_and_the_rest_wait() {
    let s = server();
    let mut c = s.conn();
    c.acquire("k", "w", 60_000).int();
    let mut readers: Vec<Conn> = (0..6)
        .map(|i| {
            let owner = format!("r{i}");
            queue(
                &s,
                &mut c,
                "k",
                &["LOCK.READ", "k", &owner, "60000", "WAIT", "0"],
                i + 1,
            )
        })
        .collect();
    assert_eq!(c.release("k", "w").int(), 1);
    for r in &mut readers[..3] {
        granted(r);
    }
    assert_eq!(holders(&mut c, "k"), owners(&["r0", "r1", "r2"]));
    assert_eq!(waiting(&mut c, "k"), owners(&["r3", "r4", "r5"]));
    // A holder leaves: the next one in turn, and only it.
    assert_eq!(c.release("k", "r1").int(), 1);
    granted(&mut readers[3]);
    assert_eq!(holders(&mut c, "k"), owners(&["r0", "r2", "r3"]));
    assert_eq!(waiting(&mut c, "k"), owners(&["r4", "r5"]));
    // A newcomer never jumps the queue: without WAIT it gets nil (others
    // wait ahead of it), with WAIT it queues behind them.
    assert!(c.read("k", "late", 60_000).is_nil());
    let mut late = queue(
        &s,
        &mut c,
        "k",
        &["LOCK.READ", "k", "late", "60000", "WAIT", "0"],
        3,
    );
    for owner in ["r0", "r2"] {
        assert_eq!(c.release("k", owner).int(), 1);
    }
    granted(&mut readers[4]);
    granted(&mut readers[5]);
    assert_eq!(waiting(&mut c, "k"), owners(&["late"]));
    assert_eq!(c.release("k", "r3").int(), 1);
    granted(&mut late);
    assert_eq!(holders(&mut c, "k"), owners(&["late", "r4", "r5"]));
    assert!(waiting(&mut c, "k").is_empty());
}

/// A `READ ... WAIT` on a full key (no writer anywhere) waits, and is
/// granted when a lease ends; without `WAIT` it is the limit's error; a
/// `WAIT` that runs out answers nil; none of them changes anything.
#[test]
fn a_read_with_wait_on_a_full_key_waits_for_a_holder_to_leave() {
    let s = server();
    let mut c = s.conn();
    for owner in ["a", "b", "short"] {
        c.read("k", owner, 60_000).int();
    }
    let offset = s.repl_offset();
    let r = c.read("k", "new", 60_000);
    assert!(
        r.is_err() && r.err().starts_with("ERR ") && r.err().contains(LIMIT),
        "{r:?}"
    );
    let r = c.cmd(&["LOCK.READ", "k", "new", "60000", "WAIT", "1"]);
    assert!(r.is_nil(), "a WAIT that runs out: {r:?}");
    assert_eq!(s.repl_offset(), offset, "a refusal replicates nothing");
    assert_eq!(holders(&mut c, "k"), owners(&["a", "b", "short"]));
    // Waits; granted when `short`'s lease ends (shortened to 1 ms once the
    // request waits: nobody releases).
    let mut w = queue(
        &s,
        &mut c,
        "k",
        &["LOCK.READ", "k", "new", "60000", "WAIT", "0"],
        1,
    );
    assert_eq!(c.renew("k", "short", 1).int(), 1);
    let t = granted(&mut w);
    let i = c.lock_info("k").expect("held");
    assert_eq!(i.holder("new").token, t);
    assert_eq!(holders(&mut c, "k"), owners(&["a", "b", "new"]));
    assert_eq!(i.waiters, 0);
    // A holder's repeat is not a new holder: answered at once.
    assert!(matches!(c.read("k", "a", 60_000), Reply::Int(_)));
}

/// Permits: a semaphore whose limit is above `lock.max-holders` waits for
/// the holder limit; one at its own limit of permits waits as it always did.
#[test]
fn a_semaphore_waits_for_the_holder_limit_and_for_its_own() {
    let s = server();
    let mut c = s.conn();
    let sem = |c: &mut Conn, key: &str, limit: &str, owner: &str| {
        c.cmd(&["LOCK.SEMAPHORE", key, limit, owner, "60000"])
    };
    for owner in ["a", "b", "c"] {
        sem(&mut c, "big", "10", owner).int();
    }
    let r = sem(&mut c, "big", "10", "d");
    assert!(r.is_err() && r.err().contains(LIMIT), "{r:?}");
    let args = ["LOCK.SEMAPHORE", "big", "10", "d", "60000", "WAIT", "0"];
    let mut d = queue(&s, &mut c, "big", &args, 1);
    let args = ["LOCK.SEMAPHORE", "big", "10", "e", "60000", "WAIT", "0"];
    let mut e = queue(&s, &mut c, "big", &args, 2);
    assert_eq!(c.release("big", "b").int(), 1);
    granted(&mut d);
    assert_eq!(holders(&mut c, "big"), owners(&["a", "c", "d"]));
    assert_eq!(waiting(&mut c, "big"), owners(&["e"]));
    assert_eq!(c.release("big", "a").int(), 1);
    granted(&mut e);
    // Its own limit of 2 permits: nil without WAIT, waits with it.
    sem(&mut c, "two", "2", "a").int();
    sem(&mut c, "two", "2", "b").int();
    assert!(sem(&mut c, "two", "2", "c").is_nil());
    let args = ["LOCK.SEMAPHORE", "two", "2", "c", "60000", "WAIT", "0"];
    let mut w = queue(&s, &mut c, "two", &args, 1);
    assert_eq!(c.release("two", "a").int(), 1);
    granted(&mut w);
}

/// Inside MULTI/EXEC a `WAIT` is an immediate try: at the limit it answers
/// nil, as a refused try does; without `WAIT` it is the limit's error.
#[test]
fn inside_multi_a_wait_at_the_limit_is_a_refused_try() {
    let s = server();
    let mut c = s.conn();
    for owner in ["a", "b", "c"] {
        c.read("k", owner, 60_000).int();
    }
    c.cmd(&["MULTI"]).ok();
    c.cmd(&["LOCK.READ", "k", "new", "60000", "WAIT", "0"]);
    c.cmd(&["LOCK.READ", "k", "new", "60000"]);
    let r = c.cmd(&["EXEC"]);
    let replies = r.array();
    assert!(replies[0].is_nil(), "{r:?}");
    assert!(
        replies[1].is_err() && replies[1].err().contains(LIMIT),
        "{r:?}"
    );
    assert_eq!(holders(&mut c, "k"), owners(&["a", "b", "c"]));
    assert!(waiting(&mut c, "k").is_empty());
}
