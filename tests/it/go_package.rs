//! The Go package (clients/go, on redigo), built as Debian's Go builds it:
//! GOPATH mode (no module proxy is reachable), a temporary GOPATH whose
//! `src/redislock` is clients/go, and Debian's redigo from
//! golang-github-gomodule-redigo-dev (/usr/share/gocode; `make client-deps`
//! installs it and golang-go). `gofmt -l` and `go vet`, then its `go test`
//! against servers started here: a server, a second one SIGSTOPped by the
//! stall test, a 3-master cluster (redigo has no cluster client: one node,
//! keys in its slots; a Session opens a session on each node's Client), and
//! five RedLock servers with two, then three,
//! stopped; and the Go programs of docs/clients.md and clients/go/README.md,
//! run against a server. Go's output is in the failure message, and printed
//! on success too.

use crate::common::cluster::Cluster;
use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const REDIGO: &str = "/usr/share/gocode/src/github.com/gomodule/redigo/redis";

/// A fresh GOPATH with `src/redislock` linked to clients/go; the build cache
/// is kept under target/ between runs.
fn gopath() -> PathBuf {
    assert!(
        std::path::Path::new(REDIGO).is_dir(),
        "redigo is not installed at {REDIGO}: run `make client-deps` (apt-get install golang-go golang-github-gomodule-redigo-dev)"
    );
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "gopath-{}-{}-{n}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(dir.join("src")).expect("a GOPATH");
    std::os::unix::fs::symlink(root().join("clients/go"), dir.join("src/redislock"))
        .expect("link the package into the GOPATH");
    dir
}

fn go(gopath: &Path, args: &[&str]) -> Command {
    let pkg = gopath.join("src/redislock");
    let mut c = Command::new("go");
    c.args(args)
        .current_dir(&pkg)
        // Go takes $PWD for the directory: the package is `redislock`, in the GOPATH.
        .env("PWD", &pkg)
        .env("GO111MODULE", "off")
        .env(
            "GOPATH",
            format!("{}:/usr/share/gocode", gopath.to_string_lossy()),
        )
        .env("GOCACHE", root().join("target/go-cache"))
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0");
    c
}

#[track_caller]
fn run(what: &str, cmd: &mut Command) -> String {
    let out: Output = cmd.output().unwrap_or_else(|e| {
        panic!("{what}: cannot run {cmd:?}: {e} (is Go installed? `make client-deps`)")
    });
    let text = format!(
        "--- stdout ---\n{}--- stderr ---\n{}--- end ---",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({})\n{text}",
        out.status
    );
    eprintln!("== {what}\n{text}");
    text
}

/// The tests that ran: each `--- PASS: Name` line; none failed.
#[track_caller]
fn passed(what: &str, out: &str) -> Vec<String> {
    assert!(!out.contains("--- FAIL"), "{what}: a test failed\n{out}");
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("--- PASS: "))
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn go_package_vet_and_tests_on_a_server_a_stalled_server_a_cluster_node_and_redlock() {
    let gp = gopath();
    let fmt = run(
        "gofmt -l",
        Command::new("gofmt")
            .arg("-l")
            .arg(root().join("clients/go")),
    );
    assert!(
        !fmt.lines().any(|l| l.ends_with(".go")),
        "gofmt -l lists files:\n{fmt}"
    );
    run("go vet", &mut go(&gp, &["vet", "."]));

    let server = Server::start();
    let stalled = Server::start();
    let cluster = Cluster::start();
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    let mut killed = Server::start();
    let cluster_addrs: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let out = {
        let mut cmd = go(&gp, &["test", "-count=1", "-v", "."]);
        cmd.env("REDIS_LOCK_ADDR", format!("127.0.0.1:{}", server.port))
            .env(
                "REDIS_LOCK_STALL_ADDR",
                format!("127.0.0.1:{}", stalled.port),
            )
            .env(
                "REDIS_LOCK_STALL_PID",
                stalled.pid().expect("pid").to_string(),
            )
            .env("REDIS_LOCK_CLUSTER_ADDRS", cluster_addrs.join(","))
            .env(
                "REDIS_LOCK_DURABLE_ADDR",
                format!("127.0.0.1:{}", master.port),
            )
            .env(
                "REDIS_LOCK_DURABLE_REPLICA_PID",
                replica.pid().expect("pid").to_string(),
            )
            .env("REDIS_LOCK_KILL_ADDR", format!("127.0.0.1:{}", killed.port))
            .env(
                "REDIS_LOCK_KILL_PID",
                killed.pid().expect("pid").to_string(),
            );
        let out = cmd.output().expect("go test");
        stalled.resume(); // whatever the stall test did
        replica.resume(); // whatever the durable test did
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "go test failed:\n{text}");
        eprintln!("== go test\n{text}");
        text
    };
    let ran = passed("go test", &out);
    for t in [
        "TestEveryKindBoundAndNot",
        "TestWaitsInTheServerWithoutPolling",
        "TestCancelledContextLeavesTheQueue",
        "TestKeepaliveRenewsBoundWithKeepaliveElseRenew",
        "TestLostLease",
        "TestSessionOneKeepaliveForManyLocks",
        "TestBoundSessionOneKeepaliveForManyLocks",
        "TestSessionSurvivesKilledConnections",
        "TestSessionEndedFromOutside",
        "TestSessionOnePerClusterNode",
        "TestDeadlockIsAnError",
        "TestBadInputIsErrInvalid",
        "TestStalledServerStallsNothingElse",
        "TestClusterNodeSingleSlot",
        "TestDurableGrants",
        "TestGuard",
        "TestLostBoundLockToldBeforeTheNextKeepalive",
        "TestKilledServerToldBeforeTheNextKeepalive",
        "TestStaleHolderNeverEndsANewerGrant",
        "TestSharedLockWithOwnerLetsOneIn",
    ] {
        assert!(ran.iter().any(|r| r == t), "{t} passed:\n{out}");
    }
    let skipped: Vec<&str> = out.lines().filter(|l| l.contains("--- SKIP")).collect();
    assert!(
        skipped.len() == 1 && skipped[0].contains("TestRedLock"),
        "only TestRedLock (run below) is skipped here:\n{out}"
    );
    assert!(!killed.is_running(), "TestKilledServer... killed it");
    drop(cluster);
    drop(stalled);

    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let addrs: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    for down in [0, 2, 3] {
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        let out = run(
            &format!("go test -run TestRedLock, {down} of 5 servers stopped"),
            go(
                &gp,
                &["test", "-count=1", "-v", "-run", "^TestRedLock$", "."],
            )
            .env("REDLOCK_ADDRS", addrs.join(","))
            .env("REDLOCK_DOWN", down.to_string()),
        );
        assert_eq!(passed("RedLock", &out), ["TestRedLock"], "{out}");
    }
    let _ = std::fs::remove_dir_all(&gp);
}

/// The ```go blocks of clients/go/README.md and of the Go section of
/// docs/clients.md: each is a program of its own.
fn go_doc_examples() -> Vec<(String, String)> {
    let readme = markdown("clients/go/README.md");
    let docs = markdown("docs/clients.md");
    let section = section(&docs, "## Go (redigo): the package");
    fenced_blocks(&[("readme", &readme), ("docs", section)], "go")
}

#[test]
fn go_docs_examples_build_and_run() {
    let examples = go_doc_examples();
    assert!(
        examples.len() >= 3,
        "the README and the docs have Go programs"
    );
    let gp = gopath();
    let server = Server::start();
    for (name, text) in &examples {
        assert!(
            text.starts_with("package main"),
            "{name} is a program:\n{text}"
        );
        let dir = gp.join("src").join(name);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("main.go"), text).expect("write");
        let mut vet = go(&gp, &["vet", "."]);
        run(
            &format!("go vet {name}"),
            vet.current_dir(&dir).env("PWD", &dir),
        );
        let mut cmd = go(&gp, &["run", "."]);
        cmd.current_dir(&dir)
            .env("PWD", &dir)
            .env("REDIS_ADDR", format!("127.0.0.1:{}", server.port));
        let out = run(&format!("go run {name}"), &mut cmd);
        assert!(out.contains("token"), "{name} printed its tokens:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&gp);
}
