//! The client examples (examples/clients), each against real servers started
//! by the harness on 127.0.0.1:
//!
//! - Python (redis-py): `python3 test_kinds.py PORT`, the semaphore, transfer
//!   and DEADLOCK patterns of docs/clients.md with redis-py alone (the
//!   Python package, clients/python, is tested by tests/packages.rs);
//! - the shell helper over redis-cli: `bash test.sh PORT`, and the redis-cli
//!   session of examples/clients/cli/session.txt replayed and compared;
//! - Rust: the `redis` crate's view of a `DEADLOCK` reply (the Rust package,
//!   clients/rust, is tested by tests/rust_package.rs).
//!
//! redis-py and ioredis are installed project-locally by
//! scripts/client-deps.sh (`make test` runs it) into target/clients. A missing
//! runtime or library fails the test with that advice: it never skips.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::common::*;

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
    let mut r = redis::Client::open(format!("redis://127.0.0.1:{}/", s.port))
        .expect("client")
        .get_connection()
        .expect("connection");
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
/// docs/clients.md) in one redis-cli session and compares the output
/// (`replay_cli_transcript`).
#[test]
fn redis_cli_session_transcript() {
    require("redis-cli", "redis-cli", &["--version"], &[]);
    let text = fs::read_to_string(examples("cli").join("session.txt")).expect("session.txt");
    replay_cli_transcript(&text);
}
