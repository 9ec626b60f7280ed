//! Deadlock detection (shared/CONTRACT.md, "Deadlock detection"): a request
//! that would close a cycle of waits is answered `DEADLOCK` at once, state
//! unchanged; a chain without a cycle waits.

use std::time::Duration;

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
        .unwrap()
}

/// Sends a waiting request on its own connection and waits until it queues.
fn wait_on(s: &Server, obs: &mut Conn, args: &[&str]) -> Conn {
    let before = stat(obs, "waiters");
    let mut w = s.conn();
    w.send(args).unwrap();
    w.set_timeout(Duration::from_secs(8));
    wait_until(Duration::from_secs(5), "the request to queue", || {
        stat(obs, "waiters") == before + 1
    });
    w
}

fn is_deadlock(r: &Reply) -> bool {
    matches!(r, Reply::Error(e) if e.starts_with("DEADLOCK"))
}

#[test]
fn two_owners_crossing_two_keys() {
    let s = Server::start();
    let mut c = s.conn();
    token(c.acquire("a", "x", 60000));
    token(c.acquire("b", "y", 60000));
    let mut xw = wait_on(
        &s,
        &mut c,
        &["LOCK.ACQUIRE", "b", "x", "60000", "WAIT", "0"],
    );
    let state = |c: &mut Conn| {
        let [a, b] = ["a", "b"].map(|k| c.lock_info(k).map(|i| i.stable()));
        (a, b)
    };
    let before = state(&mut c);
    let r = c.cmd(&["LOCK.ACQUIRE", "a", "y", "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "{r:?}");
    assert_eq!(state(&mut c), before, "state unchanged");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    // Without WAIT it is a plain refusal.
    assert!(c.acquire("a", "y", 60000).is_nil());
    // y gives way: x gets b.
    assert_eq!(c.release("b", "y").int(), 1);
    token(xw.read_reply().unwrap());
}

#[test]
fn a_chain_without_a_cycle_waits_and_a_long_cycle_is_found() {
    let s = Server::start();
    let mut c = s.conn();
    // o0 holds k0, o1 holds k1, ...; o_i waits for k_{i+1}.
    let n = 6;
    for i in 0..n {
        token(c.acquire(&format!("k{i}"), &format!("o{i}"), "60000".parse().unwrap()));
    }
    let mut waiting = Vec::new();
    for i in 0..n - 1 {
        let (k, o) = (format!("k{}", i + 1), format!("o{i}"));
        waiting.push(wait_on(
            &s,
            &mut c,
            &["LOCK.ACQUIRE", &k, &o, "60000", "WAIT", "0"],
        ));
    }
    // Someone else joining the chain's end waits (no cycle).
    let mut tail = wait_on(
        &s,
        &mut c,
        &["LOCK.ACQUIRE", "k0", "outsider", "60000", "WAIT", "0"],
    );
    // The last owner closing the ring is told at once.
    let last = format!("o{}", n - 1);
    let r = c.cmd(&["LOCK.ACQUIRE", "k0", &last, "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "{r:?}");
    // Through a queued request ahead: the outsider waits on k0 ahead of it.
    let r = c.cmd(&["LOCK.ACQUIRE", "k0", "outsider2", "60000", "WAIT", "100"]);
    assert!(r.is_nil(), "no cycle through outsider2: {r:?}");
    assert_eq!(c.release("k0", "o0").int(), 1);
    token(tail.read_reply().unwrap());
    drop(waiting);
}

#[test]
fn cycles_through_readers_semaphores_multi_key_requests_and_databases() {
    let s = Server::start();
    let mut c = s.conn();
    // Readers: r holds `doc` shared; w waits to write it; r waits for w's key.
    token(c.read("doc", "r", 60000));
    token(c.acquire("wkey", "w", 60000));
    let _w = wait_on(
        &s,
        &mut c,
        &["LOCK.ACQUIRE", "doc", "w", "60000", "WAIT", "0"],
    );
    let r = c.cmd(&["LOCK.ACQUIRE", "wkey", "r", "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "through a reader: {r:?}");
    // A reader behind a waiting writer waits for it.
    token(c.acquire("rk", "z", 60000));
    let _z = wait_on(&s, &mut c, &["LOCK.READ", "doc", "z", "60000", "WAIT", "0"]);
    // (z waits for w's queued write, w for r: no cycle back to z unless r waits for z.)
    let r = c.cmd(&["LOCK.ACQUIRE", "rk", "r", "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "r -> z -> w (queued ahead) -> r: {r:?}");

    // Semaphores: p1 and p2 hold both permits; p1 waits for q's key; q
    // waiting for a permit closes the cycle through p1.
    c.cmd(&["FLUSHALL"]).ok();
    token(c.cmd(&["LOCK.SEMAPHORE", "sem", "2", "p1", "60000"]));
    token(c.cmd(&["LOCK.SEMAPHORE", "sem", "2", "p2", "60000"]));
    token(c.acquire("qk", "q", 60000));
    let _p1 = wait_on(
        &s,
        &mut c,
        &["LOCK.ACQUIRE", "qk", "p1", "60000", "WAIT", "0"],
    );
    let r = c.cmd(&["LOCK.SEMAPHORE", "sem", "2", "q", "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "through a semaphore: {r:?}");

    // Multi-key requests, and a key in another database.
    token(c.acquire("m1", "a", 60000));
    c.cmd(&["SELECT", "3"]).ok();
    token(c.acquire("m2", "b", 60000));
    let mut s3 = s.conn();
    s3.cmd(&["SELECT", "3"]).ok();
    let before = stat(&mut c, "waiters");
    s3.send(&["LOCK.MACQUIRE", "2", "m2", "m3", "a", "60000", "WAIT", "0"])
        .unwrap();
    wait_until(Duration::from_secs(5), "queued", || {
        stat(&mut c, "waiters") == before + 1
    });
    c.cmd(&["SELECT", "0"]).ok();
    let r = c.cmd(&["LOCK.MACQUIRE", "2", "m1", "m4", "b", "60000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "multi-key across databases: {r:?}");
    assert!(c.lock_info("m4").is_none(), "nothing granted");
    assert!(stat(&mut c, "deadlocks") >= 4);
}

/// Issue 30.2: every cycle is found, however long. A chain of 1,000 owners,
/// each holding its key and waiting for the one below (more than the 500
/// steps the search used to stop at), closed by the bottom owner asking for
/// the top key: `DEADLOCK` at once, nothing cut; a fresh owner asking for
/// the top key waits (no cycle), and costs no search.
#[test]
fn a_cycle_a_thousand_owners_long_is_found_at_once() {
    let s = Server::start();
    let mut c = s.conn();
    const N: usize = 1_000;
    let mut holders = Vec::new();
    for i in 0..N {
        token(c.acquire(&format!("k{i}"), &format!("o{i}"), 600_000));
    }
    // o<i> waits for k<i-1>, each on a connection of its own.
    for i in 1..N {
        let mut w = s.conn();
        w.send(&[
            "LOCK.ACQUIRE",
            &format!("k{}", i - 1),
            &format!("o{i}"),
            "600000",
            "WAIT",
            "0",
        ])
        .unwrap();
        holders.push(w);
    }
    wait_until(Duration::from_secs(30), "the chain to queue", || {
        stat(&mut c, "waiters") == (N - 1) as i64
    });
    assert_eq!(stat(&mut c, "deadlocks"), 0, "a chain is no cycle");
    let top = format!("k{}", N - 1);
    let r = c.cmd(&["LOCK.ACQUIRE", &top, "o0", "600000", "WAIT", "1000"]);
    assert!(is_deadlock(&r), "the closing request: {r:?}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "deadlock_searches_cut"), 0);
    // Nothing changed: o0 still holds k0, everyone still waits.
    assert_eq!(stat(&mut c, "waiters"), (N - 1) as i64);
    assert!(c.lock_info("k0").unwrap().holder("o0").token > 0);
    // An owner holding nothing waits at the top of the chain.
    let r = c.cmd(&["LOCK.ACQUIRE", &top, "fresh", "600000", "WAIT", "50"]);
    assert!(r.is_nil(), "{r:?}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
}

/// Issue 38: a search too long for one turn of the event loop lets its
/// request wait while it goes on over the next ticks, then answers
/// `DEADLOCK` and changes nothing. A chain of 3,000 owners closed by the
/// bottom one walks 3,000 steps (slices of 0.5 ms: several turns in a debug
/// build); meanwhile the closing request waits in the queue like any other.
#[test]
fn a_search_longer_than_a_turn_waits_then_answers_deadlock() {
    let s = Server::start();
    let mut c = s.conn();
    const N: usize = 3_000;
    let mut keys = Vec::new();
    for i in 0..N {
        keys.push(format!("k{i}"));
    }
    // One connection grants every holder (holders need no connection).
    for (i, k) in keys.iter().enumerate() {
        let owner = format!("o{i}");
        c.push(&[b"LOCK.ACQUIRE", k.as_bytes(), owner.as_bytes(), b"600000"]);
    }
    c.flush().unwrap();
    for _ in 0..N {
        token(c.read_reply().unwrap());
    }
    let mut chain = Vec::new();
    for i in 1..N {
        let mut w = s.conn();
        w.send(&[
            "LOCK.ACQUIRE",
            &keys[i - 1],
            &format!("o{i}"),
            "600000",
            "WAIT",
            "0",
        ])
        .unwrap();
        chain.push(w);
    }
    wait_until(Duration::from_secs(60), "the chain to queue", || {
        stat(&mut c, "waiters") == (N - 1) as i64
    });
    let before = stat(&mut c, "deadlock_searches_sliced");
    let mut closing = s.conn();
    closing.set_timeout(Duration::from_secs(30));
    let r = closing.cmd(&["LOCK.ACQUIRE", &keys[N - 1], "o0", "600000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "the closing request: {r:?}");
    assert!(
        stat(&mut c, "deadlock_searches_sliced") > before,
        "the search went on over several turns"
    );
    // Nothing changed: o0 still holds k0, everyone else still waits, the
    // closing request left the queue it waited in.
    assert_eq!(stat(&mut c, "waiters"), (N - 1) as i64);
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert!(c.lock_info("k0").unwrap().holder("o0").token > 0);
    assert_eq!(c.lock_info(&keys[N - 1]).unwrap().waiters, 0);
    // A request in the middle of the chain that closes no cycle waits, and
    // its WAIT ends in nil.
    let r = closing.cmd(&[
        "LOCK.ACQUIRE",
        &keys[N / 2],
        "fresh",
        "600000",
        "WAIT",
        "200",
    ]);
    assert!(r.is_nil(), "{r:?}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
}

/// Issue 38's fan: readers holding many keys that many writers wait on
/// all at once (`LOCK.MACQUIRE`). A reader asking for a key whose holder
/// waits for nothing waits (no cycle) without listing the writers; a reader
/// asking for a key one of the waiting writers holds closes a cycle, found
/// however wide the fan, and answered `DEADLOCK` with nothing changed.
#[test]
fn readers_under_a_wide_fan_of_waiting_writers() {
    let s = Server::start();
    let mut c = s.conn();
    const KEYS: usize = 10;
    const READERS: usize = 100;
    const WRITERS: usize = 500;
    let keys: Vec<String> = (0..KEYS).map(|k| format!("f{k}")).collect();
    for k in &keys {
        for r in 0..READERS {
            let owner = format!("reader-{r}");
            c.push(&[b"LOCK.READ", k.as_bytes(), owner.as_bytes(), b"600000"]);
        }
    }
    c.flush().unwrap();
    for _ in 0..KEYS * READERS {
        token(c.read_reply().unwrap());
    }
    // Writer 0 holds `y` before it waits with the others.
    token(c.acquire("y", "writer-0", 600_000));
    token(c.acquire("z", "idle", 600_000));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut conn = s.conn();
        let mut args = vec!["LOCK.MACQUIRE".to_string(), KEYS.to_string()];
        args.extend(keys.iter().cloned());
        args.extend([
            format!("writer-{w}"),
            "600000".into(),
            "WAIT".into(),
            "0".into(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        conn.send(&args).unwrap();
        writers.push(conn);
    }
    wait_until(Duration::from_secs(60), "the writers to queue", || {
        stat(&mut c, "waiters") == WRITERS as i64
    });
    // z's holder waits for nothing: no cycle, the WAIT runs out.
    let r = c.cmd(&["LOCK.ACQUIRE", "z", "reader-0", "1000", "WAIT", "50"]);
    assert!(r.is_nil(), "{r:?}");
    // y's holder waits for every reader: reader 0 asking for y closes a
    // cycle.
    let mut asking = s.conn();
    asking.set_timeout(Duration::from_secs(30));
    let r = asking.cmd(&["LOCK.ACQUIRE", "y", "reader-0", "1000", "WAIT", "0"]);
    assert!(is_deadlock(&r), "{r:?}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "waiters"), WRITERS as i64);
    assert_eq!(c.lock_info(&keys[0]).unwrap().holders.len(), READERS);
    assert!(c.lock_info("y").unwrap().holder("writer-0").token > 0);
}

/// The waiting registry numbers each key with a queue and each waiting
/// owner (docs/design.md, "Deadlock detection", numbers kept by the
/// registry), and gives an owner's slot again once its last request is
/// gone. Rounds of a request that leaves a queue that stays (its connection
/// closes) and a new owner that takes its slot: the request that left is
/// never seen again through the slot given anew (it would close a false
/// cycle), and a cycle through the new owner is found.
#[test]
fn numbers_given_again_after_requests_leave_alias_no_old_edge() {
    let s = Server::start();
    let mut c = s.conn();
    for round in 0..3 {
        let [a, b, k] = ["a", "b", "k"].map(|n| format!("{n}{round}"));
        let [x, y, z, w, q] = ["x", "y", "z", "w", "q"].map(|n| format!("{n}{round}"));
        token(c.acquire(&a, &x, 60000));
        token(c.acquire(&b, &w, 60000));
        token(c.acquire(&k, &q, 60000));
        // z, then y, wait for x (on a); y leaves (its connection closes):
        // a's queue stays (z), y's number goes.
        let mut zw = wait_on(&s, &mut c, &["LOCK.ACQUIRE", &a, &z, "60000", "WAIT", "0"]);
        let yw = wait_on(&s, &mut c, &["LOCK.ACQUIRE", &a, &y, "60000", "WAIT", "0"]);
        drop(yw);
        wait_until(Duration::from_secs(5), "y's request to leave", || {
            stat(&mut c, "waiters") == 1
        });
        // w starts waiting (for q, on k): it takes the slot y had.
        let mut ww = wait_on(&s, &mut c, &["LOCK.ACQUIRE", &k, &w, "60000", "WAIT", "0"]);
        // x asking for b (held by w, who waits for q, who waits for
        // nobody): no cycle (y's request on a, behind x's hold, is gone),
        // it waits, and its WAIT ends in nil.
        let r = c.cmd(&["LOCK.ACQUIRE", &b, &x, "60000", "WAIT", "100"]);
        assert!(r.is_nil(), "round {round}: x waited for b: {r:?}");
        assert_eq!(stat(&mut c, "deadlocks"), round, "round {round}");
        // x waiting for b now, q asking for a (held by x) closes q -> x ->
        // w -> q.
        let mut xw = wait_on(&s, &mut c, &["LOCK.ACQUIRE", &b, &x, "60000", "WAIT", "0"]);
        let r = c.cmd(&["LOCK.ACQUIRE", &a, &q, "60000", "WAIT", "0"]);
        assert!(is_deadlock(&r), "round {round}: q closing the cycle: {r:?}");
        assert_eq!(stat(&mut c, "deadlocks"), round + 1, "round {round}");
        // Everyone goes: w gives b to x, x gives a to z, q gives k to w.
        assert_eq!(c.release(&b, &w).int(), 1);
        token(xw.read_reply().unwrap());
        assert_eq!(c.release(&a, &x).int(), 1);
        token(zw.read_reply().unwrap());
        assert_eq!(c.release(&k, &q).int(), 1);
        token(ww.read_reply().unwrap());
        for (key, owner) in [(&a, &z), (&b, &x), (&k, &w)] {
            assert_eq!(c.release(key, owner).int(), 1);
        }
        assert_eq!(stat(&mut c, "waiters"), 0);
    }
}
