//! The Rust package (clients/rust, `redis-native-lock`), blocking and tokio,
//! against servers started here: every kind, waiting in the server, the
//! keepalive, a lost lease, a bound lock freed when its connection dies,
//! `DEADLOCK` as its own error, a cancelled acquire, and RedLock over five
//! servers with two, then three, stopped.

mod common;

use common::cluster::Cluster;
use common::*;
use redis_native_lock::redlock::{AsyncRedLock, RedLock};
use redis_native_lock::{aio, Error, Lock, Target};
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
    let mut l = Lock::exclusive(&cc, "{c}:renewed").ttl(ms(600));
    let g = l.acquire().unwrap().unwrap();
    thread::sleep(ms(1_500));
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
        let mut l = Lock::exclusive(&c, &key).ttl(ms(600)).bind(bind);
        let g = l.acquire().unwrap().unwrap();
        assert_eq!(g.is_bound(), bind);
        thread::sleep(ms(1_500));
        assert!(!g.is_lost(), "renewed");
        assert!(g.owned().unwrap());
        g.extend(Duration::from_secs(20)).unwrap();
        assert!(
            s.conn().pttl(&key) > 10_000,
            "extend sets the lease from now"
        );
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
    let mut w = aio::Lock::exclusive(t.clone(), format!("{{t}}:w"))
        .ttl(ms(600))
        .wait(Some(Duration::from_secs(5)));
    let g = w
        .acquire()
        .await
        .unwrap()
        .expect("granted after the release");
    holder.await.unwrap();
    // The watchdog renews.
    tokio::time::sleep(ms(1_500)).await;
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

#[test]
fn redlock_over_five_servers_with_two_then_three_stopped() {
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let clients: Vec<redis::Client> = servers.iter().map(client).collect();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    for down in [0usize, 2, 3] {
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        let rl = RedLock::new(clients.clone());
        let key = format!("red{down}");
        let lease = rl.acquire(&key, Duration::from_secs(10));
        let arl = AsyncRedLock::new(clients.clone());
        let akey = format!("ared{down}");
        let alease = rt.block_on(arl.acquire(&akey, Duration::from_secs(10)));
        if down <= 2 {
            let mut lease = lease.expect("a quorum granted it");
            assert_eq!(lease.tokens.len(), 5 - down);
            assert!(lease.remaining() > Duration::from_secs(5));
            assert!(RedLock::new(clients.clone())
                .acquire(&key, Duration::from_secs(10))
                .is_none());
            assert!(rl.extend(&mut lease, Duration::from_secs(20)));
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
