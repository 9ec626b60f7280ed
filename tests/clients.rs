//! The client examples (examples/clients), each against real servers started
//! by the harness on 127.0.0.1:
//!
//! - Python (redis-py): `python3 test_kinds.py PORT`, the semaphore, transfer
//!   and DEADLOCK patterns of docs/clients.md with redis-py alone (the
//!   Python package, clients/python, is tested by tests/packages.rs);
//! - Node.js (ioredis): `node test.js PORT`;
//! - the shell helper over redis-cli: `bash test.sh PORT`, and the redis-cli
//!   session of examples/clients/cli/session.txt replayed and compared;
//! - Rust (the `redis` crate): the helper examples/clients/rust/redis_lock.rs,
//!   tested here in-process.
//!
//! redis-py and ioredis are installed project-locally by
//! scripts/client-deps.sh (`make test` runs it) into target/clients. A missing
//! runtime or library fails the test with that advice: it never skips.

mod common;

#[path = "../examples/clients/rust/redis_lock.rs"]
#[allow(dead_code)]
mod redis_lock;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis_lock::{acquire, with_lock, LockError, Options};

/// How long one example's test script may run.
const SCRIPT_DEADLINE: Duration = Duration::from_secs(120);

const INSTALL_HINT: &str =
    "run `make test` (it runs scripts/client-deps.sh first), or scripts/client-deps.sh";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn examples(lang: &str) -> PathBuf {
    root().join("examples/clients").join(lang)
}

/// Where scripts/client-deps.sh installs the client libraries.
fn deps(lang: &str) -> PathBuf {
    root().join("target/clients").join(lang)
}

/// Panics with [`INSTALL_HINT`] unless `program args...` runs and succeeds.
fn require(what: &str, program: &str, args: &[&str], env: &[(&str, &Path)]) {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "{what} is missing (`{program} {}` exited {s}): {INSTALL_HINT}",
            args.join(" ")
        ),
        Err(e) => panic!("{what} is missing (cannot run `{program}`: {e}): {INSTALL_HINT}"),
    }
}

/// Runs `cmd` (stdout and stderr to files, so that a grandchild left running
/// cannot hold a pipe open) with a deadline; panics with both outputs unless
/// it succeeds and its last line says `N passed, 0 failed` with N > 0.
fn run_tests(mut cmd: Command, what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "clients-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    fs::create_dir_all(&dir).expect("create the output dir");
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).expect("stdout file"))
        .stderr(fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}: {INSTALL_HINT}"));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if start.elapsed() > SCRIPT_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let out = fs::read_to_string(&out_path).unwrap_or_default();
    let err = fs::read_to_string(&err_path).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    let report = format!("--- stdout ---\n{out}--- stderr ---\n{err}--- end ---");
    let Some(status) = status else {
        panic!("{what} did not finish within {SCRIPT_DEADLINE:?}\n{report}");
    };
    assert!(status.success(), "{what} failed ({status})\n{report}");
    let last = out.lines().last().unwrap_or("");
    let passed = last
        .strip_suffix(" passed, 0 failed")
        .and_then(|n| n.parse::<u32>().ok());
    assert!(
        matches!(passed, Some(n) if n > 0),
        "{what}: no 'N passed, 0 failed' line at the end\n{report}"
    );
    println!("{what}:\n{out}");
    out
}

fn python(script: &str) -> Command {
    let lib = deps("python");
    require("python3", "python3", &["--version"], &[]);
    require(
        &format!("redis-py (in {})", lib.display()),
        "python3",
        &["-c", "import redis"],
        &[("PYTHONPATH", &lib)],
    );
    let dir = examples("python");
    let path = std::env::join_paths([&lib, &dir]).expect("PYTHONPATH");
    let mut cmd = Command::new("python3");
    cmd.arg(dir.join(script))
        .current_dir(&dir)
        .env("PYTHONPATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    cmd
}

// ---------------------------------------------------------------------------
// Python, Node.js, shell
// ---------------------------------------------------------------------------

/// docs/clients.md's semaphore, MACQUIRE and DEADLOCK patterns, as written.
#[test]
fn python_semaphore_transfer_and_deadlock_patterns() {
    let mut cmd = python("test_kinds.py");
    let s = Server::start();
    cmd.arg(s.port.to_string());
    run_tests(cmd, "examples/clients/python/test_kinds.py");
    assert_eq!(s.conn().info_field("lock", "lock_waiters"), "0");
}

/// The `redis` crate reports `DEADLOCK` with its own error code, as
/// docs/clients.md says.
#[test]
fn rust_client_sees_the_deadlock_code() {
    let s = Server::start();
    let mut c = s.conn();
    c.acquire("a", "x", 60_000);
    c.acquire("b", "y", 60_000);
    c.send(&["LOCK.ACQUIRE", "b", "x", "60000", "WAIT", "0"])
        .unwrap();
    let mut obs = s.conn();
    wait_until(Duration::from_secs(5), "x to wait", || {
        obs.info_field("lock", "lock_waiters") == "1"
    });
    let mut r = client(&s).get_connection().expect("connection");
    let err = redis::cmd("LOCK.ACQUIRE")
        .arg("a")
        .arg("y")
        .arg(60_000)
        .arg("WAIT")
        .arg(0)
        .query::<Option<i64>>(&mut r)
        .expect_err("DEADLOCK");
    assert_eq!(err.code(), Some("DEADLOCK"), "{err:?}");
}

#[test]
fn node_helper() {
    let lib = deps("node").join("node_modules");
    require("Node.js", "node", &["--version"], &[]);
    require(
        &format!("ioredis (in {})", lib.display()),
        "node",
        &["-e", "require('ioredis')"],
        &[("NODE_PATH", &lib)],
    );
    let s = Server::start();
    let dir = examples("node");
    let mut cmd = Command::new("node");
    cmd.arg(dir.join("test.js"))
        .arg(s.port.to_string())
        .current_dir(&dir)
        .env("NODE_PATH", &lib);
    run_tests(cmd, "examples/clients/node/test.js");
    assert_eq!(s.conn().info_field("lock", "lock_waiters"), "0");
}

#[test]
fn shell_helper_over_redis_cli() {
    require("bash", "bash", &["--version"], &[]);
    require("redis-cli", "redis-cli", &["--version"], &[]);
    let s = Server::start();
    let dir = examples("cli");
    let mut cmd = Command::new("bash");
    cmd.arg(dir.join("test.sh"))
        .arg(s.port.to_string())
        .current_dir(&dir);
    run_tests(cmd, "examples/clients/cli/test.sh");
}

/// Replays examples/clients/cli/session.txt (the transcript shown in
/// docs/clients.md) in one redis-cli session and compares the output.
/// Tokens (integers of 13 digits or more) may differ from the transcript's,
/// but consistently (the same token where the transcript repeats one) and
/// increasing; other integers of 4 digits or more are remaining times, within
/// 5 s of the transcript's; everything else is compared exactly.
#[test]
fn redis_cli_session_transcript() {
    require("redis-cli", "redis-cli", &["--version"], &[]);
    let text = fs::read_to_string(examples("cli").join("session.txt")).expect("session.txt");
    const PROMPT: &str = "127.0.0.1:6379> ";
    let mut commands = String::new();
    let mut expected: Vec<&str> = Vec::new();
    for line in text.lines() {
        match line.strip_prefix(PROMPT) {
            Some(cmd) => {
                commands.push_str(cmd);
                commands.push('\n');
            }
            None => expected.push(line),
        }
    }
    let s = Server::start();
    let mut child = Command::new("redis-cli")
        .args(["--no-raw", "-h", "127.0.0.1", "-p", &s.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}: {INSTALL_HINT}"));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(commands.as_bytes())
            .expect("write commands");
    }
    let out = child.wait_with_output().expect("redis-cli output");
    let got = String::from_utf8_lossy(&out.stdout).into_owned();
    let got: Vec<&str> = got.lines().collect();
    let show = || {
        format!(
            "--- expected ---\n{}\n--- got ---\n{}",
            expected.join("\n"),
            got.join("\n")
        )
    };
    assert_eq!(got.len(), expected.len(), "line count\n{}", show());
    let mut tokens: Vec<(i64, i64)> = Vec::new(); // (transcript's, actual)
    for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
        if want == have {
            continue;
        }
        let split = |l: &str| {
            let at = l.find("(integer) ")?;
            let n: i64 = l[at + 10..].parse().ok()?;
            Some((l[..at].to_string(), n))
        };
        let (Some((wp, w)), Some((hp, h))) = (split(want), split(have)) else {
            panic!("line {}: {want:?} vs {have:?}\n{}", i + 1, show());
        };
        assert_eq!(wp, hp, "line {}\n{}", i + 1, show());
        if w >= 1_000_000_000_000 {
            match tokens.iter().find(|(tw, _)| *tw == w) {
                Some((_, th)) => assert_eq!(h, *th, "line {}: the same token\n{}", i + 1, show()),
                None => {
                    if let Some((_, last)) = tokens.last() {
                        assert!(h > *last, "line {}: tokens increase\n{}", i + 1, show());
                    }
                    tokens.push((w, h));
                }
            }
        } else if w >= 1000 {
            assert!(
                (w - h).abs() <= 5000,
                "line {}: {w} vs {h}\n{}",
                i + 1,
                show()
            );
        } else {
            panic!("line {}: {want:?} vs {have:?}\n{}", i + 1, show());
        }
    }
}

// ---------------------------------------------------------------------------
// Rust (the `redis` crate): examples/clients/rust/redis_lock.rs
// ---------------------------------------------------------------------------

fn client(s: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", s.port)).expect("redis::Client")
}

fn opts(ttl_ms: u64, wait_ms: Option<u64>) -> Options {
    Options {
        ttl: Duration::from_millis(ttl_ms),
        wait: wait_ms.map(Duration::from_millis),
        ..Options::default()
    }
}

/// Renewals sent so far: LOCK.KEEPALIVE (bound locks) and LOCK.RENEW.
fn renew_calls(c: &mut Conn) -> i64 {
    let stats = c.info("commandstats");
    ["renew", "keepalive"]
        .iter()
        .map(|cmd| {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_lock.{cmd}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<i64>().expect("calls"))
        })
        .sum()
}

fn bound_holders(c: &mut Conn) -> i64 {
    c.info_field("lock", "lock_bound_holders")
        .parse()
        .expect("a count")
}

/// The protected resource: refuses a write older than one it has seen.
#[derive(Default)]
struct FencedStore {
    last_token: i64,
    value: Option<String>,
}

impl FencedStore {
    fn write(&mut self, value: &str, token: i64) -> bool {
        if token < self.last_token {
            return false;
        }
        self.last_token = token;
        self.value = Some(value.to_string());
        true
    }
}

#[test]
fn rust_helper_holds_with_a_token_and_releases() {
    let s = Server::start();
    let mut c = s.conn();
    let (owner, token) = with_lock(
        &client(&s),
        "rs:basic",
        &opts(10_000, Some(1_000)),
        |lease| {
            let info = c.lock_info("rs:basic").expect("held");
            assert_eq!(info.holder(lease.owner()).token, lease.token());
            assert!(c.acquire("rs:basic", "intruder", 1_000).is_nil());
            assert!(!lease.is_lost());
            lease.check().expect("held");
            (lease.owner().to_string(), lease.token())
        },
    )
    .expect("with_lock");
    assert!(token > 0 && !owner.is_empty());
    assert!(c.lock_info("rs:basic").is_none(), "released");
}

#[test]
fn rust_helper_waits_in_the_server_until_the_holder_releases() {
    let s = Server::start();
    let mut holder = s.conn();
    let first = holder.acquire("rs:wait", "holder", 30_000).int();
    let releaser = thread::spawn(move || {
        sleep_ms(200);
        assert_eq!(holder.release("rs:wait", "holder").int(), 1);
    });
    let lease = acquire(&client(&s), "rs:wait", &opts(10_000, Some(10_000))).expect("granted");
    assert!(lease.token() > first);
    releaser.join().expect("releaser");
    lease.release().expect("release");
    assert!(s.conn().lock_info("rs:wait").is_none());
}

#[test]
fn rust_helper_wait_running_out_is_not_acquired() {
    let s = Server::start();
    let mut c = s.conn();
    c.acquire("rs:busy", "holder", 30_000).int();
    match acquire(&client(&s), "rs:busy", &opts(1_000, Some(100))) {
        Err(LockError::NotAcquired { key }) => assert_eq!(key, "rs:busy"),
        Err(e) => panic!("expected NotAcquired, got {e}"),
        Ok(lease) => panic!("granted token {}", lease.token()),
    }
    let info = c.lock_info("rs:busy").expect("held");
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner, b"holder");
    assert_eq!(info.waiters, 0);
}

#[test]
fn rust_helper_watchdog_keeps_the_lease_and_stops_at_release() {
    let s = Server::start();
    let mut c = s.conn();
    for bind in [true, false] {
        let before = renew_calls(&mut c);
        let o = Options {
            bind,
            ..opts(900, None)
        };
        with_lock(&client(&s), "rs:long", &o, |lease| {
            assert_eq!(lease.is_bound(), bind);
            assert_eq!(bound_holders(&mut c), i64::from(bind));
            for _ in 0..4 {
                sleep_ms(300); // 1.2 s of work: longer than the ttl
                let info = c.lock_info("rs:long").expect("still held");
                assert_eq!(info.holder(lease.owner()).token, lease.token());
                lease.check().expect("not lost");
            }
        })
        .expect("with_lock");
        assert!(renew_calls(&mut c) - before >= 2);
        assert!(c.lock_info("rs:long").is_none());
        assert_eq!(bound_holders(&mut c), 0);
    }

    // The Redisson race: a renewal outliving unlock would extend the next
    // lock of the same owner id. Here the owner is stable on purpose.
    let stable = Options {
        owner: Some("worker-1".into()),
        ..opts(150, None)
    };
    with_lock(&client(&s), "rs:race", &stable, |_| sleep_ms(200)).expect("with_lock");
    let after_release = renew_calls(&mut c);
    assert!(c.acquire("rs:race", "worker-1", 200).int() > 0);
    sleep_ms(500); // ten watchdog intervals
    assert_eq!(
        renew_calls(&mut c),
        after_release,
        "a renewal was sent after the release"
    );
    assert!(
        c.lock_info("rs:race").is_none(),
        "the second lease was extended"
    );
}

/// With `BIND` (the default) a dead holder's lock is free at once: its
/// connection closing is enough, whatever its lease.
#[test]
fn rust_helper_bound_lock_is_freed_when_its_connection_dies() {
    let s = Server::start();
    let mut admin = s.conn();
    let lease = acquire(&client(&s), "rs:dies", &opts(6_000, None)).expect("granted");
    assert!(lease.is_bound());
    let mut w = s.conn();
    w.send(&["LOCK.ACQUIRE", "rs:dies", "next", "10000", "WAIT", "5000"])
        .unwrap();
    wait_until(Duration::from_secs(5), "the waiter to queue", || {
        admin.info_field("lock", "lock_waiters") == "1"
    });
    // The holder's connection: the one whose last command was LOCK.ACQUIRE
    // and that is not blocked (the waiter is). The process "dies".
    let list = String::from_utf8_lossy(admin.cmd(&["CLIENT", "LIST"]).bulk()).into_owned();
    let holder: Vec<&str> = list
        .lines()
        .filter(|l| l.contains(" cmd=lock.acquire") && l.contains(" flags=N "))
        .filter_map(|l| l.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .collect();
    assert_eq!(holder.len(), 1, "{list}");
    let start = std::time::Instant::now();
    admin.cmd(&["CLIENT", "KILL", "ID", holder[0]]).int();
    let got = w.read_reply().expect("granted").int();
    assert!(got > 0);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "granted at the close, not at the lease"
    );
    wait_until(Duration::from_secs(5), "the keepalive notices", || {
        lease.is_lost()
    });
    assert!(matches!(lease.release(), Err(LockError::LeaseLost { .. })));
    assert_eq!(
        admin
            .lock_info("rs:dies")
            .expect("held")
            .holder("next")
            .token,
        got
    );
}

#[test]
fn rust_helper_reports_a_lost_lease_and_leaves_the_successor_alone() {
    let s = Server::start();
    let mut admin = s.conn();
    let lease = acquire(&client(&s), "rs:lost", &opts(300, None)).expect("granted");
    assert_eq!(admin.cmd(&["DEL", "rs:lost"]).int(), 1); // forced unlock
    let theirs = admin.acquire("rs:lost", "successor", 10_000).int();
    wait_until(Duration::from_secs(5), "the watchdog notices", || {
        lease.is_lost()
    });
    match lease.check() {
        Err(LockError::LeaseLost { why, .. }) => {
            assert!(why.contains("LOCK.KEEPALIVE renewed nothing"), "{why}")
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    match lease.release() {
        Err(e @ LockError::LeaseLost { .. }) => assert!(e.to_string().contains("rs:lost"), "{e}"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    let info = admin.lock_info("rs:lost").expect("the successor holds");
    assert_eq!(info.holder("successor").token, theirs);
}

#[test]
fn rust_helper_fencing_token_rejects_the_stale_write() {
    let s = Server::start();
    let cl = client(&s);
    let mut admin = s.conn();
    let mut store = FencedStore::default();
    let result = with_lock(&cl, "rs:fence", &opts(10_000, None), |a| {
        assert!(store.write("from a", a.token()));
        admin.cmd(&["DEL", "rs:fence"]).int(); // a stalls; its lock is taken away
        with_lock(&cl, "rs:fence", &opts(10_000, None), |b| {
            assert!(b.token() > a.token());
            assert!(store.write("from b", b.token()));
        })
        .expect("b");
        assert!(!store.write("late from a", a.token()));
    });
    assert!(
        matches!(result, Err(LockError::LeaseLost { .. })),
        "{result:?}"
    );
    assert_eq!(store.value.as_deref(), Some("from b"));
}

#[test]
fn rust_helper_releases_when_the_work_panics() {
    let s = Server::start();
    let cl = client(&s);
    let r = std::panic::catch_unwind(|| {
        with_lock(&cl, "rs:boom", &opts(10_000, None), |_| -> () {
            panic!("boom (expected by the test)")
        })
    });
    assert!(r.is_err(), "the panic went through");
    assert!(s.conn().lock_info("rs:boom").is_none(), "released by Drop");
    // Also an early return that drops the lease.
    let lease = acquire(&cl, "rs:drop", &opts(10_000, None)).expect("granted");
    drop(lease);
    assert!(s.conn().lock_info("rs:drop").is_none(), "released by Drop");
}
