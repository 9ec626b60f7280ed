//! The Rust package (clients/rust, `redis-native-lock`), blocking and tokio,
//! against servers started here: every kind, waiting in the server, the
//! watchdog, a lost lease (deleted, overwritten, a killed connection), a
//! bound lock freed when its connection dies, `DEADLOCK` as its own error, a
//! cancelled acquire, RedLock over five servers with two, then three,
//! stopped; and for the issue "the client packages lose mutual exclusion":
//! threads each with a `Lock` and a fenced counter (one object per
//! acquisition is the compiler's job: the crate's compile_fail doctests), a
//! SIGSTOPped server among three, lost for good and never a raw WRONGTYPE,
//! the API's defaults and refusals, the docs' examples, and the package
//! built from its packaged sources.

use crate::common::cluster::Cluster;
use crate::common::*;
use redis_native_lock::redlock::{AsyncRedLock, RedLock};
use redis_native_lock::{aio, Error, Guard, Lock, Target};
use std::thread;
use std::time::{Duration, Instant};

fn client(s: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", s.port)).expect("client")
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Every kind, on a server or a cluster (keys share a hash slot).
fn kinds_blocking(t: &Target, bound: bool) {
    let k = |name: &str| format!("{{kinds}}:{name}");
    // Exclusive: a second owner is refused; tokens increase.
    let mut a = Lock::exclusive(t.clone(), k("x"));
    let g = a.acquire().unwrap().expect("granted");
    assert_eq!(g.is_bound(), bound);
    assert!(Lock::exclusive(t.clone(), k("x"))
        .wait(None)
        .acquire()
        .unwrap()
        .is_none());
    let t1 = g.token();
    g.release().unwrap();
    let mut b = Lock::exclusive(t.clone(), k("x"));
    let g2 = b.acquire().unwrap().unwrap();
    assert!(g2.token() > t1);
    drop(g2);
    assert!(!a.locked().unwrap(), "dropping the guard released it");
    // Reentrant: holds counted.
    let mut r = Lock::reentrant(t.clone(), k("r"));
    let mut r1 = r.acquire().unwrap().unwrap();
    let t1 = r1.token();
    let r2 = r1.reacquire().unwrap().unwrap();
    assert_eq!(t1, r2.token());
    r2.release().unwrap();
    r1.check().unwrap();
    r1.release().unwrap();
    assert!(!r.locked().unwrap());
    // Read-write: readers share, a writer waits for them.
    let (mut ra, mut rb) = (
        Lock::read(t.clone(), k("rw")),
        Lock::read(t.clone(), k("rw")),
    );
    let (ga, gb) = (
        ra.acquire().unwrap().unwrap(),
        rb.acquire().unwrap().unwrap(),
    );
    assert!(Lock::write(t.clone(), k("rw"))
        .wait(None)
        .acquire()
        .unwrap()
        .is_none());
    drop((ga, gb));
    let mut wl = Lock::write(t.clone(), k("rw"));
    let w = wl.acquire().unwrap().unwrap();
    assert!(Lock::read(t.clone(), k("rw"))
        .wait(None)
        .acquire()
        .unwrap()
        .is_none());
    drop(w);
    // Semaphore: two permits.
    let sem = || Lock::semaphore(t.clone(), k("sem"), 2).wait(None);
    let (mut p0, mut p1, mut p2) = (sem(), sem(), sem());
    let g0 = p0.acquire().unwrap().unwrap();
    let g1 = p1.acquire().unwrap().unwrap();
    assert!(p2.acquire().unwrap().is_none());
    drop(g0);
    let g2 = p2.acquire().unwrap().unwrap();
    assert_ne!(g1.token(), g2.token());
    drop((g1, g2));
    // Multi: all or none, a token per key.
    let mut ml = Lock::multi(t.clone(), [k("m1"), k("m2")]);
    let m = ml.acquire().unwrap().unwrap();
    assert_eq!(m.tokens().len(), 2);
    assert!(Lock::exclusive(t.clone(), k("m2"))
        .wait(None)
        .acquire()
        .unwrap()
        .is_none());
    m.release().unwrap();
    assert!(Lock::exclusive(t.clone(), k("m2"))
        .wait(None)
        .acquire()
        .unwrap()
        .is_some());
}

#[test]
fn every_kind_blocking_on_a_server_and_a_cluster() {
    let s = Server::start();
    kinds_blocking(&Target::from(&client(&s)), true);
    let cluster = Cluster::start();
    let cc = cluster_client(&cluster);
    kinds_blocking(&Target::from(&cc), false);
    // A cluster lease is renewed through the cluster connection.
    let mut l = Lock::exclusive(&cc, "{c}:renewed").ttl(ms(2000));
    let g = l.acquire().unwrap().unwrap();
    thread::sleep(ms(2_500));
    assert!(!g.is_lost() && g.owned().unwrap(), "renewed in the cluster");
    g.release().unwrap();
}

fn cluster_client(c: &Cluster) -> redis::cluster::ClusterClient {
    redis::cluster::ClusterClient::new(vec![format!("redis://127.0.0.1:{}/", c.nodes[0].port)])
        .expect("cluster client")
}

#[test]
fn waits_in_the_server_renews_and_signals_a_lost_lease() {
    let s = Server::start();
    let c = client(&s);
    // A waiter is granted when the holder releases.
    let mut first = Lock::exclusive(&c, "w");
    let holder = first.acquire().unwrap().unwrap();
    thread::scope(|scope| {
        scope.spawn(move || {
            thread::sleep(ms(300));
            holder.release().unwrap();
        });
        let start = Instant::now();
        let mut waiter = Lock::exclusive(&c, "w").wait(Some(Duration::from_secs(5)));
        let g = waiter
            .acquire()
            .unwrap()
            .expect("granted after the release");
        assert!(start.elapsed() < Duration::from_secs(3));
        drop(g);
    });
    // The keeper renews, bound or not.
    for bind in [true, false] {
        let key = format!("k{bind}");
        let mut l = Lock::exclusive(&c, &key).ttl(ms(2000)).bind(bind);
        let g = l.acquire().unwrap().unwrap();
        assert_eq!(g.is_bound(), bind);
        thread::sleep(ms(2_500));
        assert!(!g.is_lost(), "renewed");
        assert!(g.owned().unwrap());
        g.extend(Duration::from_secs(20)).unwrap();
        // The holder's ttl (a bound lock's key has no Redis TTL: its holder
        // follows its connection's lease).
        let left = s.conn().lock_info(&key).map_or(-1, |i| i.holders[0].ttl);
        assert!(left > 10_000, "extend sets the lease from now: {left}");
        g.release().unwrap();
    }
    // Deleted behind the holder's back: lost, and the release says so.
    for bind in [true, false] {
        let key = format!("d{bind}");
        let mut l = Lock::exclusive(&c, &key).ttl(ms(600)).bind(bind);
        let g = l.acquire().unwrap().unwrap();
        s.conn().cmd(&["DEL", &key]);
        wait_until(
            Duration::from_secs(3),
            "the keeper to see the lease lost",
            || g.is_lost(),
        );
        assert!(matches!(g.check(), Err(Error::LeaseLost { .. })));
        assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
    }
}

#[test]
fn a_bound_lock_is_freed_when_its_connection_dies_and_deadlock_is_an_error() {
    let s = Server::start();
    let c = client(&s);
    let mut l = Lock::exclusive(&c, "b").ttl(ms(900));
    let g = l.acquire().unwrap().unwrap();
    // What a dead process does: its connections close.
    let mut admin = s.conn();
    admin.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let mut other = Lock::exclusive(&c, "b").wait(Some(ms(500)));
    assert!(
        other.acquire().unwrap().is_some(),
        "freed at once, not at the lease's end"
    );
    wait_until(Duration::from_secs(3), "the holder to see it lost", || {
        g.is_lost()
    });
    assert!(g.release().is_err());

    let mut la = Lock::exclusive(&c, "d1").owner("A");
    let a1 = la.acquire().unwrap().unwrap();
    let mut lb = Lock::exclusive(&c, "d2").owner("B");
    let b2 = lb.acquire().unwrap().unwrap();
    let c2 = c.clone();
    let a_waits = thread::spawn(move || {
        let mut l = Lock::exclusive(&c2, "d2")
            .owner("A")
            .wait(Some(Duration::from_secs(5)));
        l.acquire().map(|g| g.is_some())
    });
    wait_until(Duration::from_secs(3), "A to wait", || {
        s.conn().info_field("lock", "lock_waiters") == "1"
    });
    let mut b_waits = Lock::exclusive(&c, "d1")
        .owner("B")
        .wait(Some(Duration::from_secs(5)));
    assert!(matches!(b_waits.acquire(), Err(Error::Deadlock(_))));
    drop(b2);
    assert!(a_waits.join().unwrap().unwrap(), "A got d2 once B gave way");
    drop(a1);
}

/// Every kind through the tokio API, on a server or a cluster.
async fn kinds_tokio(t: &Target, bound: bool) {
    let k = |n: &str| format!("{{t}}:{n}");
    let mut x = aio::Lock::exclusive(t.clone(), k("x"));
    let g = x.acquire().await.unwrap().unwrap();
    assert_eq!(g.is_bound(), bound);
    assert!(aio::Lock::exclusive(t.clone(), k("x"))
        .acquire()
        .await
        .unwrap()
        .is_none());
    g.release().await.unwrap();
    let mut r = aio::Lock::reentrant(t.clone(), k("r"));
    let mut r1 = r.acquire().await.unwrap().unwrap();
    let r2 = r1.reacquire().await.unwrap().unwrap();
    r2.release().await.unwrap();
    assert!(r1.owned().await.unwrap(), "one hold left");
    r1.release().await.unwrap();
    assert!(!r.locked().await.unwrap());
    let mut rl = aio::Lock::read(t.clone(), k("rw"));
    let ra = rl.acquire().await.unwrap().unwrap();
    assert!(aio::Lock::write(t.clone(), k("rw"))
        .acquire()
        .await
        .unwrap()
        .is_none());
    ra.release().await.unwrap();
    let mut sl = aio::Lock::semaphore(t.clone(), k("sem"), 1);
    let p1 = sl.acquire().await.unwrap().unwrap();
    assert!(aio::Lock::semaphore(t.clone(), k("sem"), 1)
        .acquire()
        .await
        .unwrap()
        .is_none());
    p1.release().await.unwrap();
    let mut ml = aio::Lock::multi(t.clone(), [k("m1"), k("m2")]);
    let m = ml.acquire().await.unwrap().unwrap();
    assert_eq!(m.tokens().len(), 2);
    m.release().await.unwrap();
    // Waiting in the server: a task holds, then releases.
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let t2 = t.clone();
    let holder = tokio::spawn(async move {
        let mut l = aio::Lock::exclusive(t2, k("w"));
        let g = l.acquire().await.unwrap().unwrap();
        held_tx.send(()).unwrap();
        tokio::time::sleep(ms(300)).await;
        g.release().await.unwrap();
    });
    held_rx.await.unwrap();
    let mut w = aio::Lock::exclusive(t.clone(), "{t}:w")
        .ttl(ms(2000))
        .wait(Some(Duration::from_secs(5)));
    let g = w
        .acquire()
        .await
        .unwrap()
        .expect("granted after the release");
    holder.await.unwrap();
    // The watchdog renews.
    tokio::time::sleep(ms(2_500)).await;
    assert!(!g.is_lost(), "renewed");
    assert!(g.owned().await.unwrap());
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_tokio_on_a_cluster() {
    let cluster = Cluster::start();
    let cc = cluster_client(&cluster);
    kinds_tokio(&Target::from(&cc), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_tokio() {
    let s = Server::start();
    let c = client(&s);
    kinds_tokio(&Target::from(&c), true).await;

    // Deleted behind the holder's back: lost, and the release says so.
    let mut l = aio::Lock::exclusive(&c, "del").ttl(ms(600));
    let g = l.acquire().await.unwrap().unwrap();
    s.conn().cmd(&["DEL", "del"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while !g.is_lost() && Instant::now() < deadline {
        tokio::time::sleep(ms(50)).await;
    }
    assert!(matches!(g.release().await, Err(Error::LeaseLost { .. })));

    // A cancelled acquire leaves nothing held.
    let mut hl = aio::Lock::exclusive(&c, "cx");
    let holder = hl.acquire().await.unwrap().unwrap();
    let mut waiting = aio::Lock::exclusive(&c, "cx").wait(Some(Duration::from_secs(5)));
    let cancelled = tokio::time::timeout(ms(200), waiting.acquire())
        .await
        .is_err();
    assert!(cancelled, "cancelled by the timeout");
    holder.release().await.unwrap();
    tokio::time::sleep(ms(200)).await;
    assert!(
        !waiting.locked().await.unwrap(),
        "the cancelled waiter was not granted"
    );
}

/// A panic in the work releases (the guard's drop), and a wait that runs
/// out is `None`; a resource that keeps the highest token refuses the
/// holder whose lease ran out once its successor wrote.
#[test]
fn releases_on_panic_wait_runs_out_and_the_token_fences() {
    let s = Server::start();
    let c = client(&s);
    let r = std::panic::catch_unwind(|| {
        let mut l = Lock::exclusive(&c, "boom");
        let _g = l.acquire().unwrap().unwrap();
        panic!("boom (expected by the test)");
    });
    assert!(r.is_err());
    assert!(
        s.conn().lock_info("boom").is_none(),
        "released by the guard's drop"
    );
    let mut busy = Lock::exclusive(&c, "busy");
    let held = busy.acquire().unwrap().unwrap();
    let start = Instant::now();
    assert!(Lock::exclusive(&c, "busy")
        .wait(Some(ms(200)))
        .acquire()
        .unwrap()
        .is_none());
    assert!(start.elapsed() >= ms(190), "it waited in the server");
    drop(held);
    // Fencing: a holder stopped past its lease (a process that stalled: no
    // renewal, no release) writes after its successor.
    let stale_token = s.conn().acquire("f", "stalled", 300).int();
    let mut successor = Lock::exclusive(&c, "f").wait(Some(Duration::from_secs(5)));
    let next = successor.acquire().unwrap().unwrap();
    let mut highest = next.token();
    assert!(stale_token < highest);
    let accepted = stale_token >= highest;
    if accepted {
        highest = stale_token;
    }
    assert!(
        !accepted && highest == next.token(),
        "the stale write is refused"
    );
}

/// The servers' answers waited for: every live server answers each
/// request (a stopped one refuses the connection at once). The package's
/// default (100 ms a server, small beside a lease, as RedLock wants) is a
/// deadline a loaded machine passes: a live server answering later counts
/// as one that did not grant, and the counts below are of every live one.
const REDLOCK_ANSWER: Duration = Duration::from_secs(10);

#[test]
fn redlock_over_five_servers_with_two_then_three_stopped() {
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let clients: Vec<redis::Client> = servers.iter().map(client).collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let ttl = Duration::from_secs(60);
    let redlock = || {
        let mut rl = RedLock::new(clients.clone());
        rl.settings.timeout = REDLOCK_ANSWER;
        rl
    };
    for down in [0usize, 2, 3] {
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        let rl = redlock();
        let key = format!("red{down}");
        let lease = rl.acquire(&key, ttl);
        let mut arl = AsyncRedLock::new(clients.clone());
        arl.settings.timeout = REDLOCK_ANSWER;
        let akey = format!("ared{down}");
        let alease = rt.block_on(arl.acquire(&akey, ttl));
        if down <= 2 {
            let mut lease = lease.expect("a quorum granted it");
            assert_eq!(lease.tokens.len(), 5 - down);
            assert!(lease.remaining() > ttl / 2);
            assert!(redlock().acquire(&key, ttl).is_none());
            assert!(rl.extend(&mut lease, 2 * ttl));
            assert_eq!(rl.release(&lease), 5 - down);
            let alease = alease.expect("a quorum granted it (tokio)");
            assert_eq!(rt.block_on(arl.release(&alease)), 5 - down);
        } else {
            assert!(
                lease.is_none() && alease.is_none(),
                "no quorum of 2 live servers"
            );
        }
        for s in servers.iter().take(5 - down) {
            let mut c = s.conn();
            assert!(
                c.lock_info(&key).is_none() && c.lock_info(&akey).is_none(),
                "nothing left held"
            );
        }
    }
}

/// A resource that keeps the highest fencing token it accepted and refuses
/// writes carrying a lower one (the README's `store`).
#[derive(Default)]
struct Store {
    highest: std::sync::Mutex<i64>,
    rows: std::sync::Mutex<Vec<String>>,
}

impl Store {
    fn write(&self, rows: &str, token: i64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        if token < *highest {
            return false;
        }
        *highest = token;
        self.rows.lock().unwrap().push(rows.to_string());
        true
    }
}

// The README's example and docs/clients.md's, as they are there (checked
// by `the_docs_examples_are_these_tests`).
mod readme_example {
    use super::Store;
    use redis_native_lock::{Error, Lock};
    use std::time::Duration;

    /// Writes `rows` under the lock, fenced by its token; `false` when busy.
    pub fn update_order(client: &redis::Client, store: &Store, rows: &str) -> Result<bool, Error> {
        let mut lock = Lock::exclusive(client, "orders:42")
            .ttl(Duration::from_secs(30))
            .wait(Some(Duration::from_secs(10))); // no .wait(): one try, no waiting
        let Some(guard) = lock.acquire()? else {
            return Ok(false); // busy for 10 s
        };
        guard.check()?; // Err(Error::LeaseLost { .. }) if the lease is gone
        store.write(rows, guard.token()); // the fencing token goes with the write
        guard.release()?; // dropping the guard releases too
        Ok(true)
    }
}

mod docs_example {
    use redis_native_lock::Error;
    use std::thread;
    use std::time::Duration;

    /// docs/clients.md's example: each thread its own holder.
    pub fn four_workers(client: &redis::Client) -> Result<usize, Error> {
        use redis_native_lock::Lock;

        let workers: Vec<_> = (0..4)
            .map(|_| {
                let client = client.clone();
                thread::spawn(move || -> Result<bool, Error> {
                    let mut lock = Lock::exclusive(&client, "orders:42") // a Lock per thread
                        .wait(Some(Duration::from_secs(10)));
                    let Some(guard) = lock.acquire()? else {
                        return Ok(false);
                    };
                    // ... the work, fenced by guard.token() ...
                    guard.release()?;
                    Ok(true)
                })
            })
            .collect();
        let mut done = 0;
        for w in workers {
            done += usize::from(w.join().expect("worker")?);
        }
        Ok(done)
    }
}

mod guard_example {
    use redis_native_lock::{Error, Lock};

    /// The README's and docs/clients.md's guarded write: `Ok(false)` when
    /// busy or when the lease was lost before the write (nothing written).
    pub fn finish_job(client: &redis::Client) -> Result<bool, Error> {
        let mut lock = Lock::exclusive(client, "{job:1}:lock");
        let Some(guard) = lock.acquire()? else {
            return Ok(false);
        };
        // Runs in the server iff this grant still holds "{job:1}:lock" (its token).
        match guard.call::<()>(redis::cmd("SET").arg("{job:1}:state").arg("done")) {
            Ok(()) => {}
            Err(Error::LeaseLost { .. }) => return Ok(false), // nothing was written
            Err(e) => return Err(e),
        }
        let runs: i64 = guard.call(redis::cmd("INCR").arg("{job:1}:runs"))?;
        println!("job 1 finished, run {runs}");
        guard.release()?;
        Ok(true)
    }
}

#[test]
fn the_docs_examples_are_these_tests() {
    let s = Server::start();
    let c = client(&s);
    let store = Store::default();
    assert!(readme_example::update_order(&c, &store, "row 1").unwrap());
    assert_eq!(store.rows.lock().unwrap().len(), 1);
    assert_eq!(docs_example::four_workers(&c).unwrap(), 4);
    assert!(guard_example::finish_job(&c).unwrap());
    let mut admin = s.conn();
    assert_eq!(admin.cmd(&["GET", "{job:1}:state"]).str(), "done");
    assert_eq!(admin.cmd(&["GET", "{job:1}:runs"]).str(), "1");
    // Busy: nothing written.
    let mut other = Lock::exclusive(&c, "{job:1}:lock");
    let held = other.acquire().unwrap().unwrap();
    assert!(!guard_example::finish_job(&c).unwrap());
    assert_eq!(admin.cmd(&["GET", "{job:1}:runs"]).str(), "1");
    drop(held);
    // Every ```rust block of the README and of docs/clients.md's Rust
    // section is in this file, line for line (trimmed), in order.
    let here = include_str!("rust_package.rs");
    let readme = include_str!("../../clients/rust/README.md");
    let clients = include_str!("../../docs/clients.md");
    let start = clients
        .find("## Rust (`redis` crate): the package")
        .expect("the Rust section");
    let end = start + clients[start..].find("\n## Shell").expect("its end");
    let mut blocks = 0;
    for doc in [readme, &clients[start..end]] {
        for block in doc.split("```rust\n").skip(1) {
            let block = block.split("```").next().unwrap_or_default();
            let mut rest = here;
            for line in block.lines().map(str::trim).filter(|l| !l.is_empty()) {
                // (`pub` in the test's module, not in the docs)
                let found = rest
                    .lines()
                    .position(|l| l.trim().trim_start_matches("pub ") == line);
                let Some(at) = found else {
                    panic!(
                        "a docs example's line is not in tests/rust_package.rs (in order): {line}"
                    )
                };
                let skip: usize = rest.lines().take(at + 1).map(|l| l.len() + 1).sum();
                rest = &rest[skip.min(rest.len())..];
            }
            blocks += 1;
        }
    }
    assert!(blocks >= 2, "the README's example and the docs' example");
}

/// Issue class 1: N threads, each with a Lock of its own, and a counter
/// fenced by the tokens: never two inside, tokens strictly increase. And
/// one Lock shared behind a mutex: the mutex spans the acquisition.
#[test]
fn threads_each_with_their_own_lock_are_mutually_exclusive() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let s = Server::start();
    let c = client(&s);
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let last_token = Arc::new(Mutex::new(0i64));
    let done = Arc::new(AtomicUsize::new(0));
    let (threads, rounds) = (8, 20);
    thread::scope(|scope| {
        for _ in 0..threads {
            let (c, inside, most, last_token, done) = (&c, &inside, &most, &last_token, &done);
            scope.spawn(move || {
                let mut lock = Lock::exclusive(c, "counted").wait(Some(Duration::from_secs(20)));
                for _ in 0..rounds {
                    let g = lock.acquire().unwrap().expect("granted within the wait");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    {
                        let mut last = last_token.lock().unwrap();
                        assert!(g.token() > *last, "tokens strictly increase");
                        *last = g.token();
                    }
                    thread::sleep(ms(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    g.release().unwrap();
                }
            });
        }
    });
    assert_eq!(done.load(Ordering::SeqCst), threads * rounds);
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two inside");

    // One Lock behind a mutex, shared by 4 threads.
    let shared = Mutex::new(Lock::exclusive(&c, "shared").wait(Some(Duration::from_secs(20))));
    inside.store(0, Ordering::SeqCst);
    most.store(0, Ordering::SeqCst);
    thread::scope(|scope| {
        for _ in 0..4 {
            let (shared, inside, most) = (&shared, &inside, &most);
            scope.spawn(move || {
                for _ in 0..10 {
                    let mut lock = shared.lock().unwrap();
                    let g = lock.acquire().unwrap().expect("granted");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    thread::sleep(ms(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().unwrap();
                }
            });
        }
    });
    assert_eq!(most.load(Ordering::SeqCst), 1, "never two inside");
}

/// Resumes a SIGSTOPped server however the test ends.
struct Resume<'a>(&'a Server);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Issue class 2: three servers, one SIGSTOPped. The locks on the other two
/// are kept for three lease lengths; every call returns within its
/// timeout; the stalled server's locks are reported lost (is_lost, the
/// on_lost callback, the release), blocking and tokio.
#[test]
fn a_stalled_server_stalls_nothing_else() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let clients: Vec<redis::Client> = servers.iter().map(client).collect();
    let ttl = ms(600);
    let timeout = ms(300);
    let told = Arc::new(AtomicUsize::new(0));
    let mk = |i: usize, key: &str, bind: bool| {
        let told = Arc::clone(&told);
        Lock::exclusive(&clients[i], key)
            .ttl(ttl)
            .timeout(timeout)
            .bind(bind)
            .on_lost(move |_| {
                told.fetch_add(1, Ordering::SeqCst);
            })
    };
    // Healthy: s0 and s1, bound and not. Stalled: s2, three locks (a
    // keeper renewing in turn would spend its time there).
    let mut healthy: Vec<Lock> = vec![
        mk(0, "h0", true),
        mk(1, "h1", true),
        mk(0, "h2", false),
        mk(1, "h3", false),
    ];
    let mut stalled: Vec<Lock> = vec![mk(2, "s0", true), mk(2, "s1", false), mk(2, "s2", true)];
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut ahealthy = aio::Lock::exclusive(&clients[0], "ah")
        .ttl(ttl)
        .timeout(timeout);
    let mut astalled = aio::Lock::exclusive(&clients[2], "as")
        .ttl(ttl)
        .timeout(timeout);
    let hg: Vec<Guard> = healthy
        .iter_mut()
        .map(|l| l.acquire().unwrap().unwrap())
        .collect();
    let sg: Vec<Guard> = stalled
        .iter_mut()
        .map(|l| l.acquire().unwrap().unwrap())
        .collect();
    let ahg = rt.block_on(ahealthy.acquire()).unwrap().unwrap();
    let asg = rt.block_on(astalled.acquire()).unwrap().unwrap();

    servers[2].pause();
    let _resume = Resume(&servers[2]);
    let paused = Instant::now();
    // Calls to the stalled server return within their timeout.
    let mut probe = Lock::exclusive(&clients[2], "probe").timeout(timeout);
    let t = Instant::now();
    assert!(probe.acquire().is_err(), "no reply: a timeout");
    assert!(t.elapsed() < timeout * 2, "acquire took {:?}", t.elapsed());
    let t = Instant::now();
    assert!(probe.locked().is_err());
    assert!(t.elapsed() < timeout * 2, "locked took {:?}", t.elapsed());
    // Three lease lengths: the healthy locks stay held, the stalled ones
    // are lost within about a lease, and no check ever waits.
    let mut slowest_check = Duration::ZERO;
    let mut lost_at = None;
    while paused.elapsed() < ttl * 3 {
        for g in &hg {
            let t = Instant::now();
            assert!(
                g.check().is_ok(),
                "a healthy lock was lost: {:?}",
                g.check()
            );
            slowest_check = slowest_check.max(t.elapsed());
        }
        assert!(ahg.check().is_ok(), "a healthy tokio lock was lost");
        if lost_at.is_none() && sg.iter().all(|g| g.is_lost()) && asg.is_lost() {
            lost_at = Some(paused.elapsed());
        }
        thread::sleep(ms(20));
    }
    let lost_at = lost_at.expect("the stalled server's locks reported lost");
    println!(
        "stalled server: its locks lost {lost_at:?} after the stop (ttl {ttl:?}); slowest check {slowest_check:?}"
    );
    assert!(lost_at <= ttl + ms(200));
    assert!(slowest_check < ms(50));
    assert_eq!(
        told.load(Ordering::SeqCst),
        3,
        "on_lost told each stalled lock"
    );
    for (i, g) in hg.iter().enumerate() {
        assert!(
            g.owned().unwrap(),
            "healthy lock {i} still held in its server"
        );
    }
    // Releases: the healthy ones cleanly; the stalled ones report the loss
    // within the timeout.
    for g in sg {
        let t = Instant::now();
        assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
        assert!(t.elapsed() < timeout * 2, "release took {:?}", t.elapsed());
    }
    for g in hg {
        g.release().unwrap();
    }
    rt.block_on(async {
        assert!(matches!(asg.release().await, Err(Error::LeaseLost { .. })));
        ahg.release().await.unwrap();
    });
}

/// Issue class 4: a key overwritten (WRONGTYPE) or deleted is LeaseLost,
/// never a raw server error, at the renewal, the extend and the release;
/// once lost, lost for good.
#[test]
fn an_overwritten_or_deleted_key_is_lease_lost_for_good() {
    let s = Server::start();
    let c = client(&s);
    for bind in [true, false] {
        let key = format!("over{bind}");
        let mut l = Lock::exclusive(&c, &key).ttl(ms(600)).bind(bind);
        let g = l.acquire().unwrap().unwrap();
        s.conn().cmd(&["SET", &key, "not a lock"]);
        assert!(
            matches!(g.extend(ms(600)), Err(Error::LeaseLost { .. })),
            "extend over WRONGTYPE"
        );
        assert!(g.is_lost());
        thread::sleep(ms(700));
        assert!(g.is_lost(), "lost stays lost");
        match g.release() {
            Err(Error::LeaseLost { why, .. }) => println!("release after SET: {why}"),
            other => panic!("release after SET: {other:?}"),
        }
        // Found by the watchdog alone, then released.
        let key = format!("over2{bind}");
        let mut l = Lock::exclusive(&c, &key).ttl(ms(300)).bind(bind);
        let g = l.acquire().unwrap().unwrap();
        s.conn().cmd(&["SET", &key, "not a lock"]);
        wait_until(Duration::from_secs(2), "the watchdog to see it", || {
            g.is_lost()
        });
        assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
    }
    // A reentrant hold asked for after the loss sends nothing: LeaseLost.
    let mut r = Lock::reentrant(&c, "rl").ttl(ms(300));
    let mut g = r.acquire().unwrap().unwrap();
    s.conn().cmd(&["DEL", "rl"]);
    wait_until(Duration::from_secs(2), "lost", || g.is_lost());
    assert!(matches!(g.reacquire(), Err(Error::LeaseLost { .. })));
    assert!(s.conn().lock_info("rl").is_none(), "nothing granted anew");
    assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
}

/// Issue class 5: no wait by default; the owner goes with every kind (as
/// bytes); a mode change under one owner is the server's error at once;
/// nonsense is refused before anything is sent; RedLock's methods are the
/// same in both flavours.
#[test]
fn the_api_says_what_it_does() {
    let s = Server::start();
    let c = client(&s);
    let mut holder = Lock::exclusive(&c, "busy");
    let _held = holder.acquire().unwrap().unwrap();
    let waits = s.conn().info_field("lock", "lock_waits");
    assert!(Lock::exclusive(&c, "busy").acquire().unwrap().is_none());
    assert_eq!(
        s.conn().info_field("lock", "lock_waits"),
        waits,
        "no wait by default: the request did not queue"
    );

    let owner: &[u8] = b"me\0\xff";
    let kinds: Vec<(&str, Lock)> = vec![
        ("x", Lock::exclusive(&c, "ox")),
        ("r", Lock::reentrant(&c, "or")),
        ("rd", Lock::read(&c, "ord")),
        ("w", Lock::write(&c, "ow")),
        ("sem", Lock::semaphore(&c, "osem", 3)),
        ("m", Lock::multi(&c, ["om1", "om2"])),
    ];
    for (name, l) in kinds {
        let mut l = l.owner(owner);
        assert_eq!(l.owner_id(), owner);
        let g = l.acquire().unwrap().unwrap();
        assert!(g.owned().unwrap(), "{name}: the server has our owner");
        g.release().unwrap();
        assert_eq!(l.owner_id(), owner, "{name}: a given owner is kept");
    }
    // Binary keys.
    let mut bin = Lock::exclusive(&c, b"k\0\xfe");
    let g = bin.acquire().unwrap().unwrap();
    assert!(g.owned().unwrap());
    g.release().unwrap();
    // A fresh owner per acquisition otherwise.
    let mut fresh = Lock::exclusive(&c, "fresh");
    let first = fresh.owner_id();
    fresh.acquire().unwrap().unwrap().release().unwrap();
    assert_ne!(fresh.owner_id(), first);

    // Read then write under one owner: the server's error, at once.
    let mut reader = Lock::read(&c, "mode").owner("one");
    let rg = reader.acquire().unwrap().unwrap();
    let mut writer = Lock::write(&c, "mode")
        .owner("one")
        .wait(Some(Duration::from_secs(5)));
    let t = Instant::now();
    match writer.acquire() {
        Err(Error::Redis(e)) => println!("upgrade: {e}"),
        other => panic!("upgrade: {:?}", other.map(|g| g.is_some())),
    }
    assert!(t.elapsed() < ms(2000), "at once");
    assert!(rg.owned().unwrap(), "the read hold is unchanged");
    rg.release().unwrap();

    // Nonsense, refused before anything is sent.
    let no_keys: [&str; 0] = [];
    let many: Vec<String> = (0..1001).map(|i| format!("{{m}}{i}")).collect();
    for (what, mut l) in [
        ("no key", Lock::multi(&c, no_keys)),
        ("a repeated key", Lock::multi(&c, ["a", "b", "a"])),
        ("1001 keys", Lock::multi(&c, &many)),
        ("0 permits", Lock::semaphore(&c, "s0", 0)),
        ("a zero ttl", Lock::exclusive(&c, "z").ttl(Duration::ZERO)),
        ("an empty owner", Lock::exclusive(&c, "e").owner("")),
    ] {
        assert!(
            matches!(l.acquire(), Err(Error::Invalid(_))),
            "{what}: Error::Invalid"
        );
    }
    assert!(s.conn().cmd(&["DBSIZE"]).int() == 1, "only `busy` exists");

    // RedLock: the same methods, blocking and tokio.
    let rl = RedLock::new(vec![c.clone()]);
    let mut lease = rl.acquire("red", Duration::from_secs(5)).unwrap();
    assert!(rl.extend(&mut lease, Duration::from_secs(5)));
    assert_eq!(rl.release(&lease), 1);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let arl = AsyncRedLock::new(vec![c.clone()]);
        let mut lease = arl.acquire("ared", Duration::from_secs(5)).await.unwrap();
        assert!(arl.extend(&mut lease, Duration::from_secs(5)).await);
        assert_eq!(arl.release(&lease).await, 1);
    });
}

/// Issue class 6: the package holds only what belongs, and builds from its
/// packaged sources alone (unpacked in a temporary directory, outside the
/// workspace, offline from the local registry cache).
#[test]
fn the_package_builds_from_its_packaged_sources() {
    use std::process::Command;
    let root = env!("CARGO_MANIFEST_DIR");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "package",
            "--list",
            "--allow-dirty",
            "-p",
            "redis-native-lock",
        ])
        .current_dir(root)
        .output()
        .expect("cargo package --list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| l != ".cargo_vcs_info.json")
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "Cargo.lock",
            "Cargo.toml",
            "Cargo.toml.orig",
            "README.md",
            "src/aio.rs",
            "src/api.rs",
            "src/blocking.rs",
            "src/commands.rs",
            "src/conn.rs",
            "src/holding.rs",
            "src/lib.rs",
            "src/redlock.rs",
            "src/session.rs",
            "src/watch.rs"
        ]
    );
    let out = Command::new(&cargo)
        .args([
            "package",
            "--no-verify",
            "--allow-dirty",
            "-p",
            "redis-native-lock",
        ])
        .current_dir(root)
        .output()
        .expect("cargo package");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = std::fs::read_to_string(format!("{root}/clients/rust/Cargo.toml")).unwrap();
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the crate's version");
    let krate = format!("{root}/target/package/redis-native-lock-{version}.crate");
    let dir = std::env::temp_dir().join(format!("rnl-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let untar = Command::new("tar")
        .args(["xzf", &krate, "-C"])
        .arg(&dir)
        .status()
        .expect("tar");
    assert!(untar.success());
    let src = dir.join(format!("redis-native-lock-{version}"));
    let packaged = std::fs::read_to_string(src.join("Cargo.toml")).unwrap();
    assert!(
        !packaged
            .lines()
            .any(|l| l.contains("path =") && !l.contains("\"src/")),
        "a path-free manifest"
    );
    let t = Instant::now();
    let out = Command::new(&cargo)
        .args(["build", "--offline", "--lib", "--locked"])
        .env("CARGO_TARGET_DIR", format!("{root}/target/package-check"))
        .current_dir(&src)
        .output()
        .expect("cargo build of the unpacked package");
    println!("the unpacked package built in {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the packaged sources do not build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Subscribers to `__redis__:invalidate` on `s`: the crate's watchers.
fn watchers(s: &Server) -> i64 {
    match s.conn().cmd(&["PUBSUB", "NUMSUB", "__redis__:invalidate"]) {
        Reply::Array(a) => a[1].int(),
        other => panic!("PUBSUB NUMSUB: {other:?}"),
    }
}

type Told = std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>;

fn recorder() -> (Told, impl Fn(&Error) + Send + Sync + 'static) {
    let told: Told = Default::default();
    let t = told.clone();
    (told, move |e: &Error| {
        t.lock().unwrap().push((Instant::now(), e.to_string()))
    })
}

/// How long after `t0` the lock was told lost (the first callback), waiting up to 3 s.
fn told_after(told: &Told, t0: Instant) -> Option<Duration> {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Some((at, _)) = told.lock().unwrap().first() {
            return Some(at.saturating_duration_since(t0));
        }
        thread::sleep(ms(1));
    }
    None
}

/// Issue "lost leases told within 100 ms" (blocking): a DEL, and a SET over
/// a held bound lock (a reentrant one re-entered, partly released, extended
/// and renewed first: each a write of its own, after which it reads the key
/// again to stay tracked) are told by the server's watcher, long before a
/// renewal (ttl/3 away; how soon is printed, not asserted: a loaded machine
/// moves it); `is_lost` stays true; one watcher
/// serves every bound lock on the server and closes with the last one.
#[test]
fn a_deleted_or_overwritten_bound_lock_is_told_within_100_ms_blocking() {
    let s = Server::start();
    let c = client(&s);
    let before = watchers(&s);
    let mut other = Lock::exclusive(&c, "notice-other").ttl(ms(10_000));
    let og = other.acquire().unwrap().unwrap();
    for op in ["DEL", "SET"] {
        let key = format!("notice-{op}");
        let (told, on_lost) = recorder();
        let mut l = match op {
            "DEL" => Lock::exclusive(&c, &key).ttl(ms(10_000)),
            _ => Lock::reentrant(&c, &key).ttl(ms(6000)),
        }
        .on_lost(on_lost);
        let mut g = l.acquire().unwrap().unwrap();
        assert!(g.is_bound());
        if op == "SET" {
            g.reacquire().unwrap().unwrap().release().unwrap();
            g.extend(ms(6000)).unwrap();
            thread::sleep(ms(2100)); // one renewal (at 2000 ms); the next at 4000 ms
        } else {
            thread::sleep(ms(50));
        }
        assert!(!g.is_lost(), "held");
        // One watcher for two bound locks: a watcher replaced (its observer can
        // time out on a loaded machine) closes its subscription a
        // moment after the new one opened.
        wait_until(
            Duration::from_secs(10),
            "one watcher for two bound locks",
            || watchers(&s) == before + 1,
        );
        let t0 = Instant::now();
        match op {
            "DEL" => s.conn().cmd(&["DEL", &key]),
            _ => s.conn().cmd(&["SET", &key, "not a lock"]),
        };
        let took = told_after(&told, t0);
        println!("blocking: {op} over a held bound lock told after {took:?}");
        let took = took.expect("told at all");
        assert!(
            took <= ms(1500),
            "told by the watcher, before a renewal, not {took:?}"
        );
        assert!(g.is_lost() && g.check().is_err(), "lost");
        thread::sleep(ms(20));
        assert!(g.is_lost(), "lost stays true");
        assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
        assert_eq!(told.lock().unwrap().len(), 1, "told once");
    }
    assert!(
        !og.is_lost() && og.owned().unwrap(),
        "the other lock is untouched"
    );
    og.release().unwrap();
    wait_until(Duration::from_secs(2), "the watcher to close", || {
        watchers(&s) == before
    });
}

/// The same with the tokio API (the watcher is the same thread; each lock's
/// watchdog task is woken to check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_overwritten_bound_lock_is_told_within_100_ms_tokio() {
    let s = Server::start();
    let c = client(&s);
    let before = watchers(&s);
    let mut other = aio::Lock::exclusive(&c, "notice-other").ttl(ms(10_000));
    let og = other.acquire().await.unwrap().unwrap();
    for op in ["DEL", "SET"] {
        let key = format!("notice-{op}");
        let (told, on_lost) = recorder();
        let mut l = match op {
            "DEL" => aio::Lock::exclusive(&c, &key).ttl(ms(10_000)),
            _ => aio::Lock::reentrant(&c, &key).ttl(ms(6000)),
        }
        .on_lost(on_lost);
        let mut g = l.acquire().await.unwrap().unwrap();
        assert!(g.is_bound());
        if op == "SET" {
            g.reacquire()
                .await
                .unwrap()
                .unwrap()
                .release()
                .await
                .unwrap();
            g.extend(ms(6000)).await.unwrap();
            tokio::time::sleep(ms(2100)).await;
        } else {
            tokio::time::sleep(ms(50)).await;
        }
        assert!(!g.is_lost(), "held");
        // One watcher for two bound locks: a watcher replaced (its observer can
        // time out on a loaded machine) closes its subscription a
        // moment after the new one opened.
        wait_until(
            Duration::from_secs(10),
            "one watcher for two bound locks",
            || watchers(&s) == before + 1,
        );
        let t0 = Instant::now();
        match op {
            "DEL" => s.conn().cmd(&["DEL", &key]),
            _ => s.conn().cmd(&["SET", &key, "not a lock"]),
        };
        let took = told_after(&told, t0);
        println!("tokio: {op} over a held bound lock told after {took:?}");
        let took = took.expect("told at all");
        assert!(
            took <= ms(1500),
            "told by the watcher, before a renewal, not {took:?}"
        );
        assert!(g.is_lost() && g.check().is_err(), "lost");
        tokio::time::sleep(ms(20)).await;
        assert!(g.is_lost(), "lost stays true");
        assert!(matches!(g.release().await, Err(Error::LeaseLost { .. })));
        assert_eq!(told.lock().unwrap().len(), 1, "told once");
    }
    assert!(!og.is_lost() && og.owned().await.unwrap());
    og.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while watchers(&s) != before {
        assert!(
            Instant::now() < deadline,
            "the watcher closes with the last bound lock"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// The bound on waiting for a durable grant's event (a renewal and its
/// WAIT): generous, for a loaded machine; on time they take seconds.
const DURABLE_EVENT: Duration = Duration::from_secs(60);

/// A `WAIT` timeout for a replica that is up, on a loaded machine.
const DURABLE_ACK: Duration = Duration::from_secs(10);

/// The guard of `$acquire` (`l.acquire()`, or `.await`ed) once the replica
/// acknowledged the grant: a grant it did not acknowledge within the WAIT's
/// timeout (a loaded machine's replica, late) was given back
/// (`NotDurable`), and is asked again, for up to [`DURABLE_EVENT`].
macro_rules! durable_grant {
    ($acquire:expr) => {{
        let deadline = Instant::now() + DURABLE_EVENT;
        loop {
            match $acquire {
                Ok(Some(g)) => break g,
                Err(Error::NotDurable { .. }) if Instant::now() < deadline => {}
                other => panic!(
                    "a grant its replica acknowledged: {:?}",
                    other.map(|g| g.map(|g| g.token()))
                ),
            }
        }
    }};
}

/// Polls `f` (every 10 ms, without blocking the runtime) until it holds;
/// panics after [`DURABLE_EVENT`].
async fn until_async(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + DURABLE_EVENT;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {DURABLE_EVENT:?} waiting for: {what}"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Durable grants (`.replicas(1, ..)`), blocking, bound and not: with a
/// real replica up, a grant and its renewals are acknowledged; with it
/// SIGSTOPped, a grant is released with `Error::NotDurable`, or kept and
/// flagged with `allow_not_durable`, and a held lock's renewal is told
/// through `on_not_durable` (the lease kept).
#[test]
fn replicas_wait_after_grant_and_renewal_blocking() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let c = client(&master);
    for bind in [true, false] {
        let (told, on_nd) = recorder();
        // A WAIT timeout a loaded machine's replica keeps (2 s was missed
        // at load 17: the grant NotDurable, acknowledged 0).
        let mut l = Lock::exclusive(&c, format!("durable-ok-{bind}"))
            .bind(bind)
            .ttl(ms(6000))
            .replicas(1, DURABLE_ACK)
            .on_lost(|e| println!("LOST {e}"))
            .on_not_durable(on_nd);
        let t0 = Instant::now();
        let g = durable_grant!(l.acquire());
        println!(
            "blocking (bind {bind}): grant + WAIT 1 in {:?}",
            t0.elapsed()
        );
        assert_eq!(g.durable(), Some(true));
        assert_eq!(g.is_bound(), bind);
        thread::sleep(ms(2500)); // a renewal at 2000 ms
        assert!(
            !g.is_lost() && g.durable() == Some(true) && told.lock().unwrap().is_empty(),
            "renewals acknowledged: lost {}, durable {:?}, told {:?}",
            g.is_lost(),
            g.durable(),
            told.lock().unwrap()
        );
        g.release().unwrap();

        // Refused and released.
        replica.pause();
        let key = format!("durable-refused-{bind}");
        let mut l = Lock::exclusive(&c, &key).bind(bind).replicas(1, ms(200));
        let t0 = Instant::now();
        let r = l.acquire().map(|g| g.map(|g| g.token()));
        let took = t0.elapsed();
        let free = !Lock::exclusive(&c, &key).locked().unwrap();
        // Kept and flagged.
        let mut k = Lock::exclusive(&c, format!("durable-kept-{bind}"))
            .bind(bind)
            .replicas(1, ms(200))
            .allow_not_durable(true);
        let kept = k.acquire().unwrap().unwrap();
        let kept_flag = kept.durable();
        let kept_owned = kept.owned().unwrap();
        replica.resume();
        assert!(
            matches!(
                r,
                Err(Error::NotDurable {
                    acknowledged: 0,
                    replicas: 1,
                    ..
                })
            ),
            "NotDurable: {r:?}"
        );
        assert!(
            took >= ms(190) && took < ms(5000),
            "the WAIT's timeout: {took:?}"
        );
        assert!(free, "released on the master");
        assert_eq!(kept_flag, Some(false));
        assert!(kept_owned);
        kept.release().unwrap();

        // A renewal not acknowledged: each renewal's WAIT runs its 2 s with
        // the replica paused (renewals every third of the ttl keep the lease
        // meanwhile). The grant's WAIT has the replica up: one that a
        // loaded machine's replica missed is asked again.
        let (told, on_nd) = recorder();
        let mut l = Lock::exclusive(&c, format!("durable-renew-{bind}"))
            .bind(bind)
            .ttl(ms(6000))
            .replicas(1, ms(2000))
            .on_not_durable(on_nd);
        let g = durable_grant!(l.acquire());
        assert_eq!(g.durable(), Some(true));
        replica.pause();
        // A renewal (every 2 s) after the pause, its WAIT run out: told.
        wait_until(DURABLE_EVENT, "a renewal's WAIT told", || {
            !told.lock().unwrap().is_empty() || g.is_lost()
        });
        assert!(!g.is_lost(), "the lease kept while the replica is paused");
        let flag = g.durable();
        let owned = g.owned().unwrap();
        replica.resume();
        let first = told.lock().unwrap().first().map(|(_, e)| e.clone());
        assert!(
            first
                .as_deref()
                .is_some_and(|e| e.contains("0 of 1 replicas")),
            "told: {first:?}"
        );
        assert!(flag == Some(false) && owned && !g.is_lost());
        wait_until(DURABLE_EVENT, "a renewal acknowledged again", || {
            g.durable() == Some(true)
        });
        assert!(!g.is_lost() && g.owned().unwrap());
        g.release().unwrap();
    }
    // No WAIT without the option.
    let mut plain = Lock::exclusive(&c, "durable-plain");
    assert_eq!(plain.acquire().unwrap().unwrap().durable(), None);
}

/// The same with the tokio API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_wait_after_grant_and_renewal_tokio() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let c = client(&master);
    for bind in [true, false] {
        let (told, on_nd) = recorder();
        let mut l = aio::Lock::exclusive(&c, format!("durable-ok-{bind}"))
            .bind(bind)
            .ttl(ms(6000))
            .on_lost(|e| println!("LOST {e}"))
            .replicas(1, DURABLE_ACK)
            .on_not_durable(on_nd);
        let g = durable_grant!(l.acquire().await);
        assert_eq!(g.durable(), Some(true));
        assert_eq!(g.is_bound(), bind);
        tokio::time::sleep(ms(2500)).await;
        assert!(
            !g.is_lost() && g.durable() == Some(true) && told.lock().unwrap().is_empty(),
            "renewals acknowledged: lost {}, durable {:?}, told {:?}",
            g.is_lost(),
            g.durable(),
            told.lock().unwrap()
        );
        g.release().await.unwrap();

        replica.pause();
        let key = format!("durable-refused-{bind}");
        let mut l = aio::Lock::exclusive(&c, &key)
            .bind(bind)
            .replicas(1, ms(200));
        let r = l.acquire().await.map(|g| g.map(|g| g.token()));
        let free = !aio::Lock::exclusive(&c, &key).locked().await.unwrap();
        let mut k = aio::Lock::exclusive(&c, format!("durable-kept-{bind}"))
            .bind(bind)
            .replicas(1, ms(200))
            .allow_not_durable(true);
        let kept = k.acquire().await.unwrap().unwrap();
        let kept_flag = kept.durable();
        replica.resume();
        assert!(
            matches!(
                r,
                Err(Error::NotDurable {
                    acknowledged: 0,
                    replicas: 1,
                    ..
                })
            ),
            "NotDurable: {r:?}"
        );
        assert!(free, "released on the master");
        assert_eq!(kept_flag, Some(false));
        kept.release().await.unwrap();

        // As the blocking test's.
        let (told, on_nd) = recorder();
        let mut l = aio::Lock::exclusive(&c, format!("durable-renew-{bind}"))
            .bind(bind)
            .ttl(ms(6000))
            .replicas(1, ms(2000))
            .on_not_durable(on_nd);
        let g = durable_grant!(l.acquire().await);
        assert_eq!(g.durable(), Some(true));
        replica.pause();
        until_async("a renewal's WAIT told", || {
            !told.lock().unwrap().is_empty() || g.is_lost()
        })
        .await;
        assert!(!g.is_lost(), "the lease kept while the replica is paused");
        let flag = g.durable();
        let owned = g.owned().await.unwrap();
        replica.resume();
        let first = told.lock().unwrap().first().map(|(_, e)| e.clone());
        assert!(
            first
                .as_deref()
                .is_some_and(|e| e.contains("0 of 1 replicas")),
            "told: {first:?}"
        );
        assert!(flag == Some(false) && owned && !g.is_lost());
        until_async("a renewal acknowledged again", || g.durable() == Some(true)).await;
        assert!(!g.is_lost() && g.owned().await.unwrap());
        g.release().await.unwrap();
    }
}

/// Issue 29.3: a grant acknowledged by a replica (`.replicas(1, ..)`)
/// survives a Sentinel failover. The master is killed right after the
/// grant (kill -9: nothing more reaches anyone), the Sentinels promote the
/// replica, and the new master holds the lock under the same token. (The
/// refusal when the replica does not acknowledge is
/// `replicas_wait_after_grant_and_renewal_blocking`.)
#[test]
fn an_acknowledged_grant_survives_a_sentinel_failover() {
    let mut g = crate::common::sentinel::Group::start(1, 3, 1000, &[]);
    let old = g.master_port().expect("a master");
    let c = redis::Client::open(format!("redis://127.0.0.1:{old}/")).expect("client");
    let mut l = Lock::exclusive(&c, "durable-across-failover")
        .ttl(Duration::from_secs(60))
        .replicas(1, ms(2000));
    let held = l.acquire().unwrap().expect("granted");
    assert_eq!(held.durable(), Some(true), "acknowledged by the replica");
    let token = held.token();
    g.server_mut(old).kill9();
    let new = g.wait_new_master(old, Duration::from_secs(60));
    let mut n = Conn::connect(new);
    let info = n
        .lock_info("durable-across-failover")
        .expect("the new master holds the lock");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].token, token);
    // Its tokens go on above the one granted before the failover.
    let next = n
        .cmd(&["LOCK.ACQUIRE", "after-failover", "b", "10000"])
        .int();
    assert!(next > token, "{next} <= {token}");
    drop(held);
}

/// Issue 33: `Guard::call` runs a command iff the grant still holds the
/// lock (`LOCK.GUARD ... TOKEN <its token> CALL ...`): the command's reply
/// typed as asked, its own errors as its own; once the lease is lost
/// (expired in the server, freed and retaken, retaken by the same owner
/// name under a new token) nothing runs and it is `LeaseLost` for good.
#[test]
fn a_guarded_call_runs_only_while_the_grant_holds_blocking() {
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let get = |admin: &mut Conn, key: &str| admin.cmd(&["GET", key]);

    // Held: runs, the reply typed as asked; the command's own error is its own.
    let mut l = Lock::exclusive(&c, "g:lock");
    let g = l.acquire().unwrap().unwrap();
    let () = g.call(redis::cmd("SET").arg("g:data").arg("a")).unwrap();
    let n: i64 = g.call(redis::cmd("INCR").arg("g:n")).unwrap();
    assert_eq!(n, 1);
    let v: Option<String> = g.call(redis::cmd("GET").arg("g:data")).unwrap();
    assert_eq!(v.as_deref(), Some("a"));
    match g.call::<i64>(redis::cmd("INCR").arg("g:data")) {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
        other => panic!("the command's own error: {other:?}"),
    }
    assert!(matches!(
        g.call::<()>(&redis::Cmd::new()),
        Err(Error::Invalid(_))
    ));
    assert!(!g.is_lost(), "the command's error is not a lost lease");
    g.release().unwrap();
    assert_eq!(get(&mut admin, "g:data").str(), "a");

    // Expired in the server while the holder did not know (unbound, a
    // renewal 10 s away): refused by the server, lost for good, told once.
    let told = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t2 = std::sync::Arc::clone(&told);
    let mut l = Lock::exclusive(&c, "g:lock").bind(false).on_lost(move |_| {
        t2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let g = l.acquire().unwrap().unwrap();
    let owner = String::from_utf8(l_owner(&g)).unwrap();
    // What a pause past the lease does: the server's lease ends.
    assert_eq!(admin.cmd(&["LOCK.RENEW", "g:lock", &owner, "1"]).int(), 1);
    thread::sleep(ms(20));
    assert!(!g.is_lost(), "the holder does not know yet");
    match g.call::<()>(redis::cmd("SET").arg("g:data").arg("late")) {
        Err(Error::LeaseLost { keys, token, why }) => {
            assert_eq!(keys, [b"g:lock".to_vec()]);
            assert_eq!(token, g.token());
            assert!(why.contains("NOTHELD"), "{why}");
        }
        other => panic!("refused: {other:?}"),
    }
    assert_eq!(get(&mut admin, "g:data").str(), "a", "nothing ran");
    assert!(g.is_lost() && matches!(g.check(), Err(Error::LeaseLost { .. })));
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Known lost: refused again, nothing sent (the key is free: an
    // unguarded write would run).
    assert!(matches!(
        g.call::<()>(redis::cmd("SET").arg("g:data").arg("late")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(get(&mut admin, "g:data").str(), "a");
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);
    drop(g);

    // Freed and retaken by another holder, who writes: the first one's
    // guarded write is refused, the other's stays.
    let mut a = Lock::exclusive(&c, "g:lock").bind(false);
    let ga = a.acquire().unwrap().unwrap();
    let owner = String::from_utf8(l_owner(&ga)).unwrap();
    assert_eq!(admin.cmd(&["LOCK.RELEASE", "g:lock", &owner]).int(), 1);
    let mut b = Lock::exclusive(&c, "g:lock");
    let gb = b.acquire().unwrap().unwrap();
    let () = gb.call(redis::cmd("SET").arg("g:data").arg("b")).unwrap();
    assert!(matches!(
        ga.call::<()>(redis::cmd("SET").arg("g:data").arg("stale")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(get(&mut admin, "g:data").str(), "b");
    drop((ga, gb));

    // The same owner name holds again, under a new token: the stale guard
    // is refused (its token is sent), the new one runs. Without the token
    // the owner name alone would pass (the control).
    let mut a = Lock::exclusive(&c, "g:lock").owner("worker-a").bind(false);
    let ga = a.acquire().unwrap().unwrap();
    assert_eq!(admin.cmd(&["LOCK.RELEASE", "g:lock", "worker-a"]).int(), 1);
    let mut b = Lock::exclusive(&c, "g:lock").owner("worker-a");
    let gb = b.acquire().unwrap().unwrap();
    assert!(gb.token() > ga.token());
    assert!(matches!(
        ga.call::<()>(redis::cmd("SET").arg("g:data").arg("stale")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(get(&mut admin, "g:data").str(), "b");
    let () = gb.call(redis::cmd("SET").arg("g:data").arg("b2")).unwrap();
    assert_eq!(get(&mut admin, "g:data").str(), "b2");
    let control = admin.cmd(&["LOCK.GUARD", "g:lock", "worker-a", "CALL", "GET", "g:data"]);
    assert_eq!(control.str(), "b2", "the owner name alone passes");
    drop((ga, gb));

    // A bound lock deleted: told at once, refused without sending.
    let mut l = Lock::exclusive(&c, "g:lock");
    let g = l.acquire().unwrap().unwrap();
    admin.cmd(&["DEL", "g:lock"]);
    wait_until(Duration::from_secs(3), "the deletion told", || g.is_lost());
    assert!(matches!(
        g.call::<()>(redis::cmd("SET").arg("g:data").arg("gone")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(get(&mut admin, "g:data").str(), "b2");
    drop(g);

    // A multi-key lock: its first key, or the one named, each under its
    // own token; a key not of the lock is refused before sending.
    let mut m = Lock::multi(&c, ["g:m1", "g:m2"]).bind(false);
    let g = m.acquire().unwrap().unwrap();
    let () = g.call(redis::cmd("SET").arg("g:data").arg("m")).unwrap();
    let () = g
        .call_on("g:m2", redis::cmd("SET").arg("g:data").arg("m2"))
        .unwrap();
    assert!(matches!(
        g.call_on::<()>("g:other", redis::cmd("SET").arg("g:data").arg("x")),
        Err(Error::Invalid(_))
    ));
    let owner = String::from_utf8(l_owner(&g)).unwrap();
    assert_eq!(admin.cmd(&["LOCK.RELEASE", "g:m2", &owner]).int(), 1);
    assert!(matches!(
        g.call_on::<()>("g:m2", redis::cmd("SET").arg("g:data").arg("x")),
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(get(&mut admin, "g:data").str(), "m2");
    drop(g);

    // A reader and a semaphore permit guard too.
    let mut r = Lock::read(&c, "g:rw");
    let gr = r.acquire().unwrap().unwrap();
    let v: String = gr.call(redis::cmd("GET").arg("g:data")).unwrap();
    assert_eq!(v, "m2");
    drop(gr);
    let mut p = Lock::semaphore(&c, "g:sem", 2);
    let gp = p.acquire().unwrap().unwrap();
    let n: i64 = gp.call(redis::cmd("INCR").arg("g:n")).unwrap();
    assert_eq!(n, 2);
    drop(gp);
}

/// The owner id a guard's grant went out under.
fn l_owner(g: &Guard<'_>) -> Vec<u8> {
    g.lock().owner_id()
}

/// The same as the blocking test, in tokio: runs while held, refused and
/// lost for good once the server's lease is gone or retaken by the same
/// owner name under a new token; calls from several tasks at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guarded_call_runs_only_while_the_grant_holds_tokio() {
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();

    let mut l = aio::Lock::exclusive(&c, "ga:lock");
    let g = l.acquire().await.unwrap().unwrap();
    let () = g
        .call(redis::cmd("SET").arg("ga:data").arg("a"))
        .await
        .unwrap();
    // Several calls in flight at once on one guard.
    let incr = redis::cmd("INCR").arg("ga:n").clone();
    let (a, b, c3, d) = tokio::join!(
        g.call::<i64>(&incr),
        g.call::<i64>(&incr),
        g.call::<i64>(&incr),
        g.call::<i64>(&incr)
    );
    let mut replies = [a.unwrap(), b.unwrap(), c3.unwrap(), d.unwrap()];
    replies.sort_unstable();
    assert_eq!(replies, [1, 2, 3, 4]);
    match g.call::<i64>(redis::cmd("INCR").arg("ga:data")).await {
        Err(Error::Redis(e)) => assert!(e.to_string().contains("not an integer"), "{e}"),
        other => panic!("the command's own error: {other:?}"),
    }
    assert!(!g.is_lost());
    g.release().await.unwrap();

    // Expired in the server, the holder not yet knowing: refused, lost.
    let mut l = aio::Lock::exclusive(&c, "ga:lock").bind(false);
    let g = l.acquire().await.unwrap().unwrap();
    let owner = String::from_utf8(g.lock().owner_id()).unwrap();
    assert_eq!(admin.cmd(&["LOCK.RENEW", "ga:lock", &owner, "1"]).int(), 1);
    tokio::time::sleep(ms(20)).await;
    assert!(!g.is_lost());
    assert!(matches!(
        g.call::<()>(redis::cmd("SET").arg("ga:data").arg("late"))
            .await,
        Err(Error::LeaseLost { .. })
    ));
    assert!(g.is_lost());
    assert_eq!(admin.cmd(&["GET", "ga:data"]).str(), "a");
    drop(g);

    // The same owner name again, a new token: the stale guard is refused.
    let mut a = aio::Lock::exclusive(&c, "ga:lock")
        .owner("worker-a")
        .bind(false);
    let ga = a.acquire().await.unwrap().unwrap();
    assert_eq!(admin.cmd(&["LOCK.RELEASE", "ga:lock", "worker-a"]).int(), 1);
    let mut b = aio::Lock::exclusive(&c, "ga:lock").owner("worker-a");
    let gb = b.acquire().await.unwrap().unwrap();
    let () = gb
        .call(redis::cmd("SET").arg("ga:data").arg("b"))
        .await
        .unwrap();
    assert!(matches!(
        ga.call::<()>(redis::cmd("SET").arg("ga:data").arg("stale"))
            .await,
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(admin.cmd(&["GET", "ga:data"]).str(), "b");
    let control = admin.cmd(&[
        "LOCK.GUARD",
        "ga:lock",
        "worker-a",
        "CALL",
        "GET",
        "ga:data",
    ]);
    assert_eq!(control.str(), "b", "the owner name alone passes");
    gb.release().await.unwrap();
    drop(ga);

    // Multi-key: call_on a named key.
    let mut m = aio::Lock::multi(&c, ["ga:m1", "ga:m2"]);
    let g = m.acquire().await.unwrap().unwrap();
    let () = g
        .call_on("ga:m2", redis::cmd("SET").arg("ga:data").arg("m"))
        .await
        .unwrap();
    assert!(matches!(
        g.call_on::<()>("ga:x", redis::cmd("SET").arg("ga:data").arg("x"))
            .await,
        Err(Error::Invalid(_))
    ));
    g.release().await.unwrap();
    assert_eq!(admin.cmd(&["GET", "ga:data"]).str(), "m");
}

/// The client id of the one bound holder's connection on `s` (a server with
/// one holder): a client that is neither the watcher (a subscriber) nor its
/// observer (tracking on), nor `admin`.
fn bound_connection(s: &Server, admin: &mut Conn) -> String {
    let me = admin.cmd(&["CLIENT", "ID"]).int().to_string();
    let list = admin.cmd(&["CLIENT", "LIST"]).str();
    let ids: Vec<String> = list
        .lines()
        .filter(|l| {
            let field = |name: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("")
                    .to_string()
            };
            let flags = field("flags=");
            field("id=") != me && !flags.contains('t') && !flags.contains('P')
        })
        .map(|l| {
            l.split(' ')
                .next()
                .unwrap_or("")
                .trim_start_matches("id=")
                .to_string()
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one holder's connection on {}:\n{list}",
        s.port
    );
    ids[0].clone()
}

/// What the lost-lease callback was told (waiting up to `d`: well before
/// the next renewal, a third of a 30 s ttl away).
fn told_within(told: &Told, d: Duration) -> Option<String> {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if let Some((_, why)) = told.lock().unwrap().first() {
            return Some(why.clone());
        }
        thread::sleep(ms(2));
    }
    None
}

/// Issue 40 (blocking): a bound lock lost behind its holder's back is told
/// before the next keepalive would tell it (a 30 s ttl: the keepalive is
/// 10 s away), with its own cause: a DEL (freed), a SET (overwritten), a
/// release by its owner name elsewhere (freed), `CLIENT KILL` of its
/// connection, kill -9 of the server, and a restart (the connection
/// failed). Never "the connection failed" for an overwritten key.
#[test]
fn a_lost_bound_lock_is_told_before_the_next_keepalive_blocking() {
    for how in ["KILL", "KILL9", "RESTART", "DEL", "SET", "RELEASE"] {
        let mut s = Server::start();
        let c = client(&s);
        let mut admin = s.conn();
        let (told, on_lost) = recorder();
        let mut l = Lock::reentrant(&c, "told").ttl(ms(30_000)).on_lost(on_lost);
        let mut g = l.acquire().unwrap().unwrap();
        g.reacquire().unwrap().unwrap().release().unwrap(); // a write of its own first
        thread::sleep(ms(100));
        assert!(!g.is_lost(), "{how}: held");
        let owner = String::from_utf8(l_owner(&g)).unwrap();
        match how {
            "DEL" => drop(admin.cmd(&["DEL", "told"])),
            "SET" => drop(admin.cmd(&["SET", "told", "not a lock"])),
            "RELEASE" => drop(admin.cmd(&["LOCK.RELEASE", "told", &owner])),
            "KILL" => {
                let id = bound_connection(&s, &mut admin);
                assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &id]).int(), 1);
            }
            "KILL9" => s.kill9(),
            _ => s.restart(),
        }
        let why = told_within(&told, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{how}: not told before the next keepalive"));
        println!("blocking {how}: {why}");
        let cause = match how {
            "DEL" | "RELEASE" => "freed",
            "SET" => "overwritten",
            _ => "connection the lock was bound to",
        };
        assert!(why.contains(cause), "{how}: told {why:?}, not {cause:?}");
        assert!(
            how != "SET" || !why.contains("connection"),
            "{how}: {why:?}"
        );
        assert!(g.is_lost());
        assert!(matches!(g.release(), Err(Error::LeaseLost { .. })), "{how}");
    }
}

/// The same with the tokio API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bound_lock_is_told_before_the_next_keepalive_tokio() {
    for how in ["KILL", "KILL9", "RESTART", "DEL", "SET", "RELEASE"] {
        let mut s = Server::start();
        let c = client(&s);
        let mut admin = s.conn();
        let (told, on_lost) = recorder();
        let mut l = aio::Lock::reentrant(&c, "told")
            .ttl(ms(30_000))
            .on_lost(on_lost);
        let owner = String::from_utf8(l.owner_id()).unwrap();
        let mut g = l.acquire().await.unwrap().unwrap();
        g.reacquire()
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
        tokio::time::sleep(ms(100)).await;
        assert!(!g.is_lost(), "{how}: held");
        match how {
            "DEL" => drop(admin.cmd(&["DEL", "told"])),
            "SET" => drop(admin.cmd(&["SET", "told", "not a lock"])),
            "RELEASE" => drop(admin.cmd(&["LOCK.RELEASE", "told", &owner])),
            "KILL" => {
                let id = bound_connection(&s, &mut admin);
                assert_eq!(admin.cmd(&["CLIENT", "KILL", "ID", &id]).int(), 1);
            }
            "KILL9" => s.kill9(),
            _ => s.restart(),
        }
        let t = told.clone();
        let why = tokio::task::spawn_blocking(move || told_within(&t, Duration::from_secs(5)))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{how}: not told before the next keepalive"));
        println!("tokio {how}: {why}");
        let cause = match how {
            "DEL" | "RELEASE" => "freed",
            "SET" => "overwritten",
            _ => "connection the lock was bound to",
        };
        assert!(why.contains(cause), "{how}: told {why:?}, not {cause:?}");
        assert!(g.is_lost());
        assert!(
            matches!(g.release().await, Err(Error::LeaseLost { .. })),
            "{how}"
        );
    }
}

/// Issue 40 (blocking): a stale holder (its grant lost behind its back, the
/// owner name granted again to a newer holder) never ends or renews the
/// newer grant: its release is `LeaseLost`, dropping its guard frees
/// nothing, its extend is `LeaseLost`, and its renewals stop; every kind.
#[test]
fn a_stale_holder_never_ends_a_newer_grant_blocking() {
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    type Make = fn(&redis::Client, &str) -> Lock;
    let kinds: [(&str, Make); 5] = [
        ("exclusive", |c, k| Lock::exclusive(c, k)),
        ("reentrant", |c, k| Lock::reentrant(c, k)),
        ("read", |c, k| Lock::read(c, k)),
        ("semaphore", |c, k| Lock::semaphore(c, k, 2)),
        ("multi", |c, k| Lock::multi(c, [k])),
    ];
    for (kind, make) in kinds {
        for op in ["release", "drop", "extend", "renewal"] {
            let key = format!("stale:{kind}:{op}");
            let stale_ttl = if op == "renewal" { 600 } else { 30_000 };
            let mut stale_lock = make(&c, &key)
                .owner("worker-1")
                .bind(false)
                .ttl(ms(stale_ttl));
            let stale = stale_lock.acquire().unwrap().unwrap();
            admin.cmd(&["DEL", &key]); // lost behind its back
            let mut fresh_lock = make(&c, &key).owner("worker-1").ttl(ms(20_000));
            let fresh = fresh_lock.acquire().unwrap().unwrap();
            assert!(fresh.token() > stale.token());
            assert!(
                !stale.owned().unwrap(),
                "{key}: the stale grant is not owned"
            );
            match op {
                "release" => assert!(
                    matches!(stale.release(), Err(Error::LeaseLost { .. })),
                    "{key}: the stale release is LeaseLost"
                ),
                "drop" => drop(stale),
                "extend" => {
                    assert!(matches!(
                        stale.extend(ms(1000)),
                        Err(Error::LeaseLost { .. })
                    ));
                    drop(stale);
                }
                _ => {
                    wait_until(
                        Duration::from_secs(3),
                        "the stale renewal told lost",
                        || stale.is_lost(),
                    );
                    drop(stale);
                }
            }
            assert!(
                fresh.owned().unwrap() && !fresh.is_lost(),
                "{key}: the newer grant kept"
            );
            // The holder's ttl (a bound lock's key has no Redis TTL).
            let pttl = admin.lock_info(&key).map_or(-1, |i| i.holders[0].ttl);
            assert!(
                pttl > 15_000,
                "{key}: the newer lease shortened: pttl {pttl}"
            );
            fresh.release().unwrap();
            assert!(admin.cmd(&["LOCK.INFO", &key]).is_nil(), "{key}");
        }
    }
}

/// The same with the tokio API (a dropped guard's release is sent by a
/// task: under its token, it frees nothing of the newer grant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_never_ends_a_newer_grant_tokio() {
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    for op in ["release", "drop", "extend", "renewal"] {
        for kind in ["exclusive", "reentrant"] {
            let key = format!("stale:tokio:{kind}:{op}");
            let make = |ttl: u64| {
                let l = if kind == "exclusive" {
                    aio::Lock::exclusive(&c, &key)
                } else {
                    aio::Lock::reentrant(&c, &key)
                };
                l.owner("worker-1").bind(false).ttl(ms(ttl))
            };
            let mut stale_lock = make(if op == "renewal" { 600 } else { 30_000 });
            let stale = stale_lock.acquire().await.unwrap().unwrap();
            admin.cmd(&["DEL", &key]);
            let mut fresh_lock = make(20_000);
            let fresh = fresh_lock.acquire().await.unwrap().unwrap();
            assert!(!stale.owned().await.unwrap());
            match op {
                "release" => assert!(matches!(
                    stale.release().await,
                    Err(Error::LeaseLost { .. })
                )),
                "drop" => {
                    drop(stale);
                    tokio::time::sleep(ms(200)).await; // the task's release
                }
                "extend" => {
                    assert!(matches!(
                        stale.extend(ms(1000)).await,
                        Err(Error::LeaseLost { .. })
                    ));
                    drop(stale);
                }
                _ => {
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while !stale.is_lost() {
                        assert!(
                            Instant::now() < deadline,
                            "{key}: the stale renewal told lost"
                        );
                        tokio::time::sleep(ms(20)).await;
                    }
                    drop(stale);
                }
            }
            assert!(fresh.owned().await.unwrap() && !fresh.is_lost(), "{key}");
            // The holder's ttl (a bound lock's key has no Redis TTL).
            let pttl = admin.lock_info(&key).map_or(-1, |i| i.holders[0].ttl);
            assert!(
                pttl > 15_000,
                "{key}: the newer lease shortened: pttl {pttl}"
            );
            fresh.release().await.unwrap();
            assert!(admin.cmd(&["LOCK.INFO", &key]).is_nil(), "{key}");
        }
    }
}

/// One version for every package: Python's, the Rust crate's, Go's
/// `Version`.
#[test]
fn every_package_has_one_version() {
    let read = |p: &str| std::fs::read_to_string(root_path(p)).expect(p);
    let between = |text: &str, start: &str| -> String {
        let at = text.find(start).unwrap_or_else(|| panic!("{start}")) + start.len();
        text[at..].split('"').next().unwrap_or("").to_string()
    };
    let python = between(&read("clients/python/pyproject.toml"), "version = \"");
    let rust = between(&read("clients/rust/Cargo.toml"), "version = \"");
    let go = between(&read("clients/go/client.go"), "const Version = \"");
    assert_eq!(python, "0.3.0");
    assert_eq!(rust, python, "the Rust crate's version");
    assert_eq!(go, python, "the Go package's Version");
}

fn root_path(p: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// The README's Session example, as it runs here.
mod session_example {
    use redis_native_lock::{Error, Lock, Session};
    use std::time::Duration;

    /// Holds a lock per job in one session: one keepalive renews them all,
    /// and a reconnect loses none of them.
    pub fn hold_jobs(client: &redis::Client, jobs: &[&str]) -> Result<usize, Error> {
        let session = Session::new(client)
            .ttl(Duration::from_secs(30))
            .on_lost(|e| eprintln!("lost: {e}")); // once per lock, if the session ends
        let mut locks: Vec<Lock> = jobs
            .iter()
            .map(|job| Lock::exclusive(client, format!("job:{job}")).session(&session))
            .collect();
        let mut guards = Vec::new();
        for lock in &mut locks {
            if let Some(guard) = lock.acquire()? {
                guards.push(guard);
            }
        }
        let held = guards.len();
        // ... the work: guard.check()? before each write, guard.token() to fence it
        for guard in guards {
            guard.release()?; // LOCK.RELEASE key owner TOKEN t, as for any lock
        }
        session.close()?; // dropping the Session closes it too
        Ok(held)
    }
}

/// `INFO commandstats`' calls of `cmd` ("lock.renew", "lock.session|keepalive").
fn calls(admin: &mut Conn, cmd: &str) -> i64 {
    let stats = admin.info("commandstats");
    info_get(&stats, &format!("cmdstat_{cmd}"))
        .and_then(|v| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// `LOCK.SESSION INFO id`'s holders; `None` when the session has ended.
fn session_holders(admin: &mut Conn, id: i64) -> Option<i64> {
    let r = admin.cmd(&["LOCK.SESSION", "INFO", &id.to_string()]);
    (!r.is_nil()).then(|| r.get("holders").expect("holders").int())
}

/// Whether `key` is held by this guard's grant (owner and token), as the server says.
fn held_as(admin: &mut Conn, key: &str, g: &Guard<'_>) -> bool {
    admin.lock_info(key).is_some_and(|i| {
        i.holders
            .iter()
            .any(|h| h.owner == l_owner(g) && h.token == g.token())
    })
}

/// Waits up to `d` for `told` to hold `n` callbacks.
fn told_n(told: &Told, n: usize, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if told.lock().unwrap().len() >= n {
            return true;
        }
        thread::sleep(ms(5));
    }
    false
}

/// Issue 42 (the package's Session): many locks on one session, granted
/// with `SESSION id` and without `BIND`, renewed by the session's
/// keepalives alone (no `LOCK.RENEW`, no `LOCK.KEEPALIVE`: counted by the
/// server), `extend` refused, released as any lock; opened lazily; the
/// README's example.
#[test]
fn many_locks_in_a_session_share_one_keepalive_blocking() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let (told, on_lost) = recorder();
    let session = Session::new(&c).ttl(ms(3_000)).on_lost(on_lost);
    assert!(session.ids().is_empty(), "opened lazily");
    let n = 200;
    let keys: Vec<String> = (0..n).map(|i| format!("sess:{i}")).collect();
    let mut locks: Vec<Lock> = keys
        .iter()
        .map(|k| Lock::exclusive(&c, k).session(&session))
        .collect();
    let guards: Vec<Guard<'_>> = locks
        .iter_mut()
        .map(|l| l.acquire().unwrap().expect("granted"))
        .collect();
    let ids = session.ids();
    assert_eq!(ids.len(), 1, "one session on the server: {ids:?}");
    let id = ids[0].1;
    assert!(guards
        .iter()
        .all(|g| g.session_id() == Some(id) && !g.is_bound()));
    assert_eq!(session_holders(&mut admin, id), Some(n as i64));
    let (renews, keepalives) = (
        calls(&mut admin, "lock.renew"),
        calls(&mut admin, "lock.keepalive"),
    );
    // Several of the session's keepalives (one a third of the ttl), past
    // two ttls: waited for rather than slept, so a loaded machine's late
    // keeper cannot fail the test, only slow it.
    let before = calls(&mut admin, "lock.session|keepalive");
    let t = Instant::now();
    wait_until(Duration::from_secs(60), "the session's keepalives", || {
        calls(&mut admin, "lock.session|keepalive") >= before + 6
    });
    let session_keepalives = calls(&mut admin, "lock.session|keepalive") - before;
    println!(
        "{n} locks held {:?}: {session_keepalives} LOCK.SESSION KEEPALIVE",
        t.elapsed()
    );
    assert!(session_keepalives >= 6, "renewed by the session");
    assert_eq!(calls(&mut admin, "lock.renew"), renews, "no LOCK.RENEW");
    assert_eq!(calls(&mut admin, "lock.keepalive"), keepalives);
    for (k, g) in keys.iter().zip(&guards) {
        assert!(!g.is_lost(), "{k} is held");
        assert!(held_as(&mut admin, k, g), "{k} held by its grant");
    }
    assert!(matches!(
        guards[0].extend(ms(5_000)),
        Err(Error::Invalid(_))
    ));
    for g in guards {
        g.release().unwrap();
    }
    assert!(keys.iter().all(|k| admin.lock_info(k).is_none()));
    assert_eq!(session_holders(&mut admin, id), Some(0));
    assert!(told.lock().unwrap().is_empty(), "nothing lost");
    assert_eq!(session.close().unwrap(), 0);
    assert_eq!(session_holders(&mut admin, id), None, "closed");
    // The README's example.
    assert_eq!(session_example::hold_jobs(&c, &["a", "b", "c"]).unwrap(), 3);
    assert!(admin.lock_info("job:a").is_none());
}

/// Kills every normal connection but its own (`CLIENT KILL TYPE normal
/// SKIPME yes`: the holder's, its session's keeper's) every 100 ms for `d`.
fn kill_every_100_ms(s: &Server, d: Duration) -> i64 {
    let mut killer = s.conn();
    let end = Instant::now() + d;
    let mut killed = 0;
    while Instant::now() < end {
        killed += killer
            .cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .int();
        thread::sleep(ms(100));
    }
    killed
}

/// The session fault tests' lease: one a loaded machine keeps while every
/// connection is killed (at 1.2 s and 1.5 s, keepalives that could not get
/// through in time ended the session at load 6 to 11). The kills last
/// [`SESSION_KILLS`], two of these leases: the session lives on only by
/// keepalives that got through on new connections meanwhile.
const SESSION_FAULT_TTL: Duration = Duration::from_secs(3);
const SESSION_KILLS: Duration = Duration::from_secs(6);
/// The fault test's locks each open a connection of their own, 1,000 in a
/// row: a connect timeout a loaded machine keeps (the default 2 s ran out
/// at load 17: "no connection within the timeout").
const FAULT_CONNECT: Duration = Duration::from_secs(30);

/// Issue 42 item 3, the fault test: a holder with 1,000 locks on a session
/// while every connection of the holder is killed every 100 ms for
/// [`SESSION_KILLS`] (the full 10 s run is the Python package's): none lost, each still held
/// under its token, none told lost, each released afterwards. The same
/// with `BIND` and no session: every lock freed at the first kill, and each
/// told lost.
#[test]
fn session_locks_survive_every_connection_killed_and_bound_ones_do_not() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let n = 1_000;
    let (told, on_lost) = recorder();
    let session = Session::new(&c).ttl(SESSION_FAULT_TTL).on_lost(on_lost);
    let keys: Vec<String> = (0..n).map(|i| format!("fault:{i}")).collect();
    let mut locks: Vec<Lock> = keys
        .iter()
        .map(|k| {
            Lock::exclusive(&c, k)
                .session(&session)
                .timeout(FAULT_CONNECT)
        })
        .collect();
    let t = Instant::now();
    let guards: Vec<Guard<'_>> = locks
        .iter_mut()
        .map(|l| l.acquire().unwrap().expect("granted"))
        .collect();
    println!("{n} session locks acquired in {:?}", t.elapsed());
    let killed = kill_every_100_ms(&s, SESSION_KILLS);
    assert!(
        killed >= n as i64,
        "the holder's connections were killed: {killed}"
    );
    let mut admin = s.conn();
    let id = session.ids()[0].1;
    assert_eq!(session_holders(&mut admin, id), Some(n as i64));
    for (k, g) in keys.iter().zip(&guards) {
        assert!(!g.is_lost(), "{k} is not lost");
        assert!(held_as(&mut admin, k, g), "{k} still held under its token");
    }
    assert!(told.lock().unwrap().is_empty(), "none told lost");
    let t = Instant::now();
    for g in guards {
        g.release().unwrap(); // on new connections
    }
    println!(
        "{n} released in {:?} (each on a new connection)",
        t.elapsed()
    );
    assert!(keys.iter().all(|k| admin.lock_info(k).is_none()));
    // Acquired again through a Lock whose connection was killed: a new one.
    admin
        .cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .int();
    let again = locks[0]
        .acquire()
        .unwrap()
        .expect("granted on a new connection");
    assert!(held_as(&mut admin, &keys[0], &again));
    again.release().unwrap();
    drop(locks);
    session.close().unwrap();

    // The same with BIND, no session: all freed at the first kill.
    let n = 1_000;
    let (told, on_lost) = recorder();
    let on_lost = std::sync::Arc::new(on_lost);
    let keys: Vec<String> = (0..n).map(|i| format!("bound:{i}")).collect();
    let mut locks: Vec<Lock> = keys
        .iter()
        .map(|k| {
            let f = on_lost.clone();
            Lock::exclusive(&c, k)
                .timeout(FAULT_CONNECT)
                .on_lost(move |e| f(e))
        })
        .collect();
    let guards: Vec<Guard<'_>> = locks
        .iter_mut()
        .map(|l| l.acquire().unwrap().expect("granted"))
        .collect();
    assert!(guards.iter().all(|g| g.is_bound()));
    admin
        .cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
        .int();
    let mut admin = s.conn();
    assert!(
        keys.iter().all(|k| admin.lock_info(k).is_none()),
        "every bound lock freed at the first kill"
    );
    assert!(told_n(&told, n, Duration::from_secs(10)), "each told lost");
    assert!(guards.iter().all(|g| g.is_lost()));
    drop(guards);
}

/// A session ended from outside: `LOCK.SESSION CLOSE` from another
/// connection (the next keepalive answers 0), and a server that answers
/// nothing past the session's deadline (`CLIENT PAUSE`: told at the
/// deadline, before the paused server answers anything). Every lock lost,
/// each told once, through its own `on_lost` and the session's; a later
/// lock opens a new session.
#[test]
fn a_session_ended_from_outside_loses_every_lock_once_blocking() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    for (round, ttl) in [("closed", 900), ("paused", 600)] {
        let (told, on_lost) = recorder();
        let (own_told, own) = recorder();
        let own = std::sync::Arc::new(own);
        let session = Session::new(&c).ttl(ms(ttl)).on_lost(on_lost);
        let n = 50;
        let keys: Vec<String> = (0..n).map(|i| format!("{round}:{i}")).collect();
        let mut locks: Vec<Lock> = keys
            .iter()
            .map(|k| {
                let f = own.clone();
                Lock::exclusive(&c, k)
                    .session(&session)
                    .on_lost(move |e| f(e))
            })
            .collect();
        let guards: Vec<Guard<'_>> = locks
            .iter_mut()
            .map(|l| l.acquire().unwrap().expect("granted"))
            .collect();
        let id = session.ids()[0].1;
        let t0 = Instant::now();
        let pause = 3_000;
        if round == "closed" {
            let ended = admin.cmd(&["LOCK.SESSION", "CLOSE", &id.to_string()]);
            assert_eq!(ended.int(), n as i64);
        } else {
            admin
                .cmd(&["CLIENT", "PAUSE", &pause.to_string(), "ALL"])
                .ok();
        }
        assert!(
            told_n(&told, n, Duration::from_secs(5)),
            "{round}: each told"
        );
        assert!(told_n(&own_told, n, Duration::from_secs(1)));
        let at = told.lock().unwrap().last().map(|(at, _)| *at).unwrap();
        println!(
            "{round}: {n} locks told lost {:?} after (ttl {ttl} ms)",
            at - t0
        );
        if round == "paused" {
            assert!(
                at < t0 + ms(pause),
                "told at the deadline, before the paused server answered"
            );
            let why = told.lock().unwrap()[0].1.clone();
            assert!(why.contains("deadline"), "{why}");
        }
        thread::sleep(ms(ttl)); // more keepalive ticks: no callback twice
        assert_eq!(told.lock().unwrap().len(), n, "{round}: once per lock");
        assert_eq!(own_told.lock().unwrap().len(), n);
        for g in &guards {
            assert!(g.is_lost());
            assert!(matches!(g.check(), Err(Error::LeaseLost { .. })));
        }
        if round == "paused" {
            admin.cmd(&["CLIENT", "UNPAUSE"]).ok();
        }
        for g in guards {
            assert!(matches!(g.release(), Err(Error::LeaseLost { .. })));
        }
        // A later lock on the same Session: a new session.
        let mut later = Lock::exclusive(&c, format!("{round}:later")).session(&session);
        let g = later.acquire().unwrap().expect("granted");
        assert_ne!(g.session_id(), Some(id), "a new session");
        assert!(!g.is_lost());
        g.release().unwrap();
        drop(locks);
        drop(session);
    }
}

/// `close()` ends the session's locks in the server at once (a waiter is
/// granted) and here (released: no callback, the release sends nothing);
/// dropping the `Session` closes it too (clean exit).
#[test]
fn closing_a_session_releases_its_locks_blocking() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let (told, on_lost) = recorder();
    let session = Session::new(&c).on_lost(on_lost);
    let mut a = Lock::exclusive(&c, "close:a").session(&session);
    let ga = a.acquire().unwrap().unwrap();
    let first = ga.token();
    let id = ga.session_id().unwrap();
    let waiter = {
        let c = c.clone();
        thread::spawn(move || {
            let mut w = Lock::exclusive(&c, "close:a").wait(Some(Duration::from_secs(10)));
            let g = w
                .acquire()
                .unwrap()
                .expect("granted once the session closed");
            let t = g.token();
            g.release().unwrap();
            t
        })
    };
    while admin.lock_info("close:a").map_or(0, |i| i.waiters) == 0 {
        thread::sleep(ms(5));
    }
    assert_eq!(session.close().unwrap(), 1, "one holder ended");
    assert!(waiter.join().unwrap() > first, "the waiter was granted");
    assert!(ga.is_lost(), "nothing is held any more");
    ga.release().unwrap();
    assert!(told.lock().unwrap().is_empty(), "released, not lost");
    assert_eq!(session_holders(&mut admin, id), None);
    // Dropping the Session closes it, its locks with it.
    let s2 = Session::new(&c);
    let mut b = Lock::exclusive(&c, "close:b").session(&s2);
    let gb = b.acquire().unwrap().unwrap();
    let id = gb.session_id().unwrap();
    drop(s2);
    assert!(admin.lock_info("close:b").is_none());
    assert_eq!(session_holders(&mut admin, id), None);
    drop(gb);
    // A Session is shared by threads (a lock per thread in one session).
    fn shared<T: Send + Sync>() {}
    shared::<Session>();
    shared::<aio::Session>();
    // A lock on another server than its Session's: refused, nothing sent.
    let other = Server::start();
    let s3 = Session::new(&c);
    let mut elsewhere = Lock::exclusive(&client(&other), "close:c").session(&s3);
    assert!(matches!(elsewhere.acquire(), Err(Error::Invalid(_))));
    assert!(s3.ids().is_empty());
}

/// tokio: many locks on one session (no LOCK.RENEW), an external CLOSE
/// tells each lock once, and `close().await` releases them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_tokio() {
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let (told, on_lost) = recorder();
    let session = aio::Session::new(&c).ttl(ms(3_000)).on_lost(on_lost);
    let n = 100;
    let keys: Vec<String> = (0..n).map(|i| format!("tokio:{i}")).collect();
    let mut locks: Vec<aio::Lock> = keys
        .iter()
        .map(|k| aio::Lock::exclusive(&c, k).session(&session))
        .collect();
    let mut guards = Vec::new();
    for l in locks.iter_mut() {
        guards.push(l.acquire().await.unwrap().expect("granted"));
    }
    let id = session.ids()[0].1;
    let renews = calls(&mut admin, "lock.renew");
    // Past two ttls of keepalives (one a third of the ttl), waited for
    // rather than slept: a loaded machine's keeper may run late.
    let keepalives = calls(&mut admin, "lock.session|keepalive");
    let start = Instant::now();
    while calls(&mut admin, "lock.session|keepalive") < keepalives + 6 {
        assert!(start.elapsed() < Duration::from_secs(60), "no keepalives");
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(calls(&mut admin, "lock.renew"), renews);
    assert_eq!(session_holders(&mut admin, id), Some(n as i64));
    assert!(guards
        .iter()
        .all(|g| !g.is_lost() && g.session_id() == Some(id)));
    assert!(matches!(
        guards[0].extend(ms(1_000)).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(session.close().await.unwrap(), n as i64);
    assert!(keys.iter().all(|k| admin.lock_info(k).is_none()));
    for g in guards {
        g.release().await.unwrap();
    }
    assert!(
        told.lock().unwrap().is_empty(),
        "closed: released, not lost"
    );
    // Ended from outside: each lock told once.
    let mut guards = Vec::new();
    for l in locks.iter_mut() {
        guards.push(l.acquire().await.unwrap().expect("granted"));
    }
    let id = session.ids()[0].1;
    assert_eq!(
        admin.cmd(&["LOCK.SESSION", "CLOSE", &id.to_string()]).int(),
        n as i64
    );
    assert!(told_n(&told, n, Duration::from_secs(5)));
    tokio::time::sleep(ms(600)).await;
    assert_eq!(told.lock().unwrap().len(), n, "once per lock");
    assert!(guards.iter().all(|g| g.is_lost()));
    drop(guards);
    session.close().await.unwrap();
}

/// A cluster: locks on keys of two nodes open one session per node, each
/// renewed on its node.
#[test]
fn a_session_in_a_cluster_opens_one_per_node() {
    use crate::common::cluster::key_slot;
    use redis_native_lock::Session;
    let cluster = Cluster::start();
    let cc = cluster_client(&cluster);
    let session = Session::new(&cc).ttl(ms(3_000));
    // Two keys whose slots two different primaries serve.
    let mut keys: Vec<(String, usize)> = Vec::new();
    for i in 0.. {
        let k = format!("node:{i}");
        let owner = cluster.owner(key_slot(k.as_bytes()));
        if keys.iter().all(|(_, o)| *o != owner) {
            keys.push((k, owner));
        }
        if keys.len() == 2 {
            break;
        }
    }
    let mut locks: Vec<Lock> = keys
        .iter()
        .map(|(k, _)| Lock::exclusive(&cc, k).session(&session))
        .collect();
    let guards: Vec<Guard<'_>> = locks
        .iter_mut()
        .map(|l| l.acquire().unwrap().expect("granted"))
        .collect();
    let ids = session.ids();
    assert_eq!(ids.len(), 2, "one session per node: {ids:?}");
    // Renewed on each node past two ttls (a keepalive a third of the ttl),
    // waited for rather than slept.
    for (_, owner) in &keys {
        let mut node = cluster.nodes[*owner].conn();
        let before = calls(&mut node, "lock.session|keepalive");
        wait_until(Duration::from_secs(60), "keepalives on each node", || {
            calls(&mut node, "lock.session|keepalive") >= before + 6
        });
    }
    for ((k, owner), g) in keys.iter().zip(&guards) {
        let mut node = cluster.nodes[*owner].conn();
        let id = g.session_id().unwrap();
        assert!(ids.iter().any(|(_, i)| *i == id));
        assert_eq!(session_holders(&mut node, id), Some(1), "{k}'s node");
        assert!(!g.is_lost());
        assert!(held_as(&mut node, k, g));
    }
    for g in guards {
        g.release().unwrap();
    }
    session.close().unwrap();
    assert!(session.ids().is_empty());
}

/// Every kind in a session: each granted with `SESSION id` (the server
/// counts its holders), a reentrant lock re-entered in it, each released.
#[test]
fn every_kind_in_a_session_blocking() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let session = Session::new(&c);
    let mut r = Lock::reentrant(&c, "kind:r").session(&session);
    let mut rd = Lock::read(&c, "kind:rw").session(&session);
    let mut sem = Lock::semaphore(&c, "kind:sem", 2).session(&session);
    let mut m = Lock::multi(&c, ["kind:m1", "kind:m2"]).session(&session);
    let mut gr = r.acquire().unwrap().unwrap();
    let id = gr.session_id().unwrap();
    let again = gr.reacquire().unwrap().expect("re-entered");
    let grd = rd.acquire().unwrap().unwrap();
    let gs = sem.acquire().unwrap().unwrap();
    let gm = m.acquire().unwrap().unwrap();
    // One holder per key (a reentrant lock's two holds are one holder).
    assert_eq!(session_holders(&mut admin, id), Some(5));
    assert!([grd.session_id(), gs.session_id(), gm.session_id()]
        .iter()
        .all(|i| *i == Some(id)));
    again.release().unwrap();
    assert!(!gr.is_lost());
    gr.release().unwrap();
    grd.release().unwrap();
    gs.release().unwrap();
    gm.release().unwrap();
    assert_eq!(session_holders(&mut admin, id), Some(0));
    for k in ["kind:r", "kind:rw", "kind:sem", "kind:m1", "kind:m2"] {
        assert!(admin.lock_info(k).is_none(), "{k} released");
    }
}

/// A grant answered `NOSESSION` (the session closed from outside, long
/// before the keeper's next tick): the session has ended, its locks are
/// told lost at once, and the grant is made in a new session.
#[test]
fn a_grant_answered_nosession_ends_the_session_blocking() {
    use redis_native_lock::Session;
    let s = Server::start();
    let c = client(&s);
    let mut admin = s.conn();
    let (told, on_lost) = recorder();
    let session = Session::new(&c).on_lost(on_lost); // 30 s: the next keepalive is 10 s away
    let mut a = Lock::exclusive(&c, "nos:a").session(&session);
    let ga = a.acquire().unwrap().unwrap();
    let id = ga.session_id().unwrap();
    assert_eq!(
        admin.cmd(&["LOCK.SESSION", "CLOSE", &id.to_string()]).int(),
        1
    );
    let mut b = Lock::exclusive(&c, "nos:b").session(&session);
    let gb = b.acquire().unwrap().expect("granted in a new session");
    assert_ne!(gb.session_id(), Some(id));
    assert_eq!(
        session.ids(),
        vec![(String::new(), gb.session_id().unwrap())]
    );
    let why = told_within(&told, Duration::from_secs(1)).expect("told at once");
    assert!(why.contains("NOSESSION"), "{why}");
    assert!(ga.is_lost());
    assert_eq!(told.lock().unwrap().len(), 1);
    gb.release().unwrap();
    drop(ga);
}

/// tokio: session locks survive every connection of the process killed
/// every 100 ms for [`SESSION_KILLS`] (the keeper reconnects; each lock's release goes on a new
/// connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_locks_survive_every_connection_killed_tokio() {
    let s = Server::start();
    let c = client(&s);
    let (told, on_lost) = recorder();
    let session = aio::Session::new(&c)
        .ttl(SESSION_FAULT_TTL)
        .on_lost(on_lost);
    let n = 200;
    let keys: Vec<String> = (0..n).map(|i| format!("tkill:{i}")).collect();
    let mut locks: Vec<aio::Lock> = keys
        .iter()
        .map(|k| {
            aio::Lock::exclusive(&c, k)
                .session(&session)
                .timeout(FAULT_CONNECT)
        })
        .collect();
    let mut guards = Vec::new();
    for l in locks.iter_mut() {
        guards.push(l.acquire().await.unwrap().expect("granted"));
    }
    let killer = {
        let s = &s;
        tokio::task::block_in_place(move || kill_every_100_ms(s, SESSION_KILLS))
    };
    assert!(killer >= n as i64);
    let mut admin = s.conn();
    for (k, g) in keys.iter().zip(&guards) {
        assert!(!g.is_lost(), "{k}");
        assert!(admin
            .lock_info(k)
            .is_some_and(|i| i.holders.iter().any(|h| h.token == g.token())));
    }
    assert!(told.lock().unwrap().is_empty(), "none lost");
    for g in guards {
        g.release().await.unwrap();
    }
    assert!(keys.iter().all(|k| admin.lock_info(k).is_none()));
    session.close().await.unwrap();
}
