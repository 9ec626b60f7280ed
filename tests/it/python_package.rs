//! The Python package as a user gets it: a wheel built from
//! `clients/python` (`pip wheel --no-deps`), installed into a fresh
//! virtualenv beside redis-py from PyPI (and mypy, for the typing test),
//! then the package's whole unittest suite run from a directory that holds
//! no copy of the source: blocking and asyncio, on `Redis` and
//! `RedisCluster`, the safety tests (shared objects, fork, a stalled server
//! among three, lost leases), the redis-py drop-in (`NativeLock`, in
//! redis-py's own call patterns), guarded commands (`guard()`: refused
//! after a lost lease or under a stale token), `replicas=N` against a master and its
//! replica (paused with SIGSTOP), how long a hold lives (`test_lifetime`: a lost
//! bound lock told at once, on a server of its own that it kills and restarts;
//! holds that outlive their thread or task; a stale holder's release), sessions (`test_session`,
//! on a server of their own: many locks renewed by one `LOCK.SESSION KEEPALIVE` and no
//! `LOCK.RENEW`; issue 42's fault test in full: 1,000 locks on a session while every connection of
//! the holder is killed every 100 ms for 10 s, none lost, and the same run with `BIND` losing them
//! all at the first kill; a session ended from elsewhere or past its deadline; close and exit),
//! RedLock over five servers with two, then
//! three, stopped, and every example of clients/python/README.md and the
//! Python section of docs/clients.md. First, that the generated blocking
//! modules (`clients/python/unasync.py`) are not stale. Every server is on 127.0.0.1, started
//! here.

use crate::common::cluster::Cluster;
use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// redis-py as the issue's user had it.
const REDIS_PY: &str = "redis==8.1.0";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[track_caller]
fn run(what: &str, cmd: &mut Command) -> String {
    let out: Output = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
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
    text
}

fn pip(venv: &Path) -> Command {
    let mut c = Command::new(venv.join("bin/pip"));
    c.args(["--disable-pip-version-check", "--no-input", "--quiet"]);
    c
}

/// A wheel of clients/python, installed into a fresh virtualenv.
fn venv_with_wheel(scratch: &Path) -> PathBuf {
    let venv = scratch.join("venv");
    run(
        "python3 -m venv (make client-deps installs python3-venv)",
        Command::new("python3").arg("-m").arg("venv").arg(&venv),
    );
    let wheels = scratch.join("wheels");
    run(
        "pip wheel --no-deps ./clients/python",
        pip(&venv)
            .args(["wheel", "--no-deps", "-w"])
            .arg(&wheels)
            .arg(root().join("clients/python")),
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("the wheel dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("pip wheel made a .whl");
    run(
        "pip install the wheel, redis-py and mypy",
        pip(&venv)
            .arg("install")
            .arg(&wheel)
            .args([REDIS_PY, "mypy"]),
    );
    venv
}

/// The virtualenv's python, in a directory of its own: it imports the
/// installed wheel, never the source tree.
fn python(venv: &Path, dir: &Path) -> Command {
    let mut c = Command::new(venv.join("bin/python"));
    c.current_dir(dir).env("PYTHONDONTWRITEBYTECODE", "1");
    c.env_remove("PYTHONPATH");
    c
}

/// The ```python blocks of a Markdown section that are marked runnable: a
/// block whose first line is `# run: PORT` (its port comes from the test).
fn runnable_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```python") => current = Some(String::new()),
            (Some(b), "```") => {
                if b.starts_with("# run") {
                    blocks.push(b.clone());
                }
                current = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

#[test]
fn python_wheel_in_a_fresh_virtualenv_whole_suite_examples_and_docs() {
    let scratch = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "pywheel-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&scratch).expect("scratch dir");
    // The blocking modules are generated from the asyncio ones: none stale.
    run(
        "clients/python/unasync.py --check (run it without --check and commit)",
        Command::new("python3")
            .arg(root().join("clients/python/unasync.py"))
            .arg("--check"),
    );
    let venv = venv_with_wheel(&scratch);
    // The tests run from a copy of the tests folder, away from the source.
    let tests = scratch.join("tests");
    std::fs::create_dir_all(&tests).expect("tests dir");
    for entry in std::fs::read_dir(root().join("clients/python/tests")).expect("tests") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|x| x == "py") {
            std::fs::copy(&path, tests.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let where_from = run(
        "the installed package is the wheel's",
        python(&venv, &tests).args([
            "-c",
            "import redis_native_lock, redis; print(redis_native_lock.__file__, redis.__version__)",
        ]),
    );
    assert!(
        where_from.contains("site-packages") && where_from.contains("8.1.0"),
        "{where_from}"
    );

    // The suite in three groups side by side, each on servers of its own
    // (the groups never share a server: no test sees another's keys,
    // kills or pauses), and the examples and RedLock beside them.
    std::thread::scope(|scope| {
        let groups: [&[&str]; 3] = [
            // test_session counts its server's commands, kills its
            // connections and pauses it.
            &["test_session"],
            &["test_sync", "test_async", "test_dropin", "test_guard"],
            // test_safety and test_lifetime pause the stall servers;
            // test_lifetime kills a server of its own with SIGKILL and
            // starts it again; test_replicas pauses the replica (SIGSTOP).
            &["test_safety", "test_replicas", "test_lifetime"],
        ];
        let runs: Vec<_> = groups
            .into_iter()
            .map(|modules| {
                let (venv, tests) = (&venv, &tests);
                scope.spawn(move || unittest_group(venv, tests, modules))
            })
            .collect();
        let others = scope.spawn(|| examples_docs_and_redlock(&venv, &scratch, &tests));
        for r in runs {
            match r.join() {
                Ok(out) => println!("{out}"),
                Err(e) => std::panic::resume_unwind(e),
            }
        }
        if let Err(e) = others.join() {
            std::panic::resume_unwind(e);
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
}

/// One group of the package's unittest modules, on servers of its own;
/// every test ran, none skipped.
fn unittest_group(venv: &Path, tests: &Path, modules: &[&str]) -> String {
    let server = Server::start();
    let cluster = Cluster::start();
    let stall: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let stall_ports: Vec<String> = stall.iter().map(|s| s.port.to_string()).collect();
    // replicas=N: a master and its replica (paused by the tests with SIGSTOP).
    let master = Server::start();
    let replica = Server::start();
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    let replica_pid = replica.pid().expect("the replica's pid");
    let sessions = Server::start();
    let out = run(
        &format!("the package's unittest suite: {modules:?}"),
        python(venv, tests)
            .args(["-m", "unittest", "-v"])
            .args(modules)
            .env("REDIS_LOCK_PORT", server.port.to_string())
            .env("REDIS_LOCK_CLUSTER_PORT", cluster.nodes[0].port.to_string())
            .env("REDIS_LOCK_STALL_PORTS", stall_ports.join(","))
            .env("REDIS_LOCK_MASTER_PORT", master.port.to_string())
            .env("REDIS_LOCK_REPLICA_PID", replica_pid.to_string())
            .env("REDIS_LOCK_SESSION_PORT", sessions.port.to_string())
            // Issue 42's fault test in full: 1,000 locks, a kill every 100 ms for 10 s.
            .env("REDIS_LOCK_FAULT_LOCKS", "1000")
            .env("REDIS_LOCK_FAULT_SECONDS", "10")
            .env(
                "REDIS_LOCK_SERVER_BIN",
                std::env::var_os("REDIS_SERVER").unwrap_or_else(|| "redis-server".into()),
            )
            .env("REDIS_LOCK_MODULE", module_path()),
    );
    assert!(
        !out.contains("skipped"),
        "every test ran, none skipped:\n{out}"
    );
    out
}

/// The examples (a server and a cluster), the README's and docs/clients.md's
/// Python examples as written, and RedLock over five servers with some
/// stopped.
fn examples_docs_and_redlock(venv: &Path, scratch: &Path, tests: &Path) {
    let server = Server::start();
    let cluster = Cluster::start();
    let examples = root().join("clients/python/examples");
    let cluster_port = cluster.nodes[0].port;
    for script in ["every_kind.py", "every_kind_async.py"] {
        for (port, extra) in [(server.port, None), (cluster_port, Some("cluster"))] {
            let mut cmd = python(venv, scratch);
            cmd.arg(examples.join(script)).arg(port.to_string());
            if let Some(e) = extra {
                cmd.arg(e);
            }
            let out = run(&format!("{script} {port} {extra:?}"), &mut cmd);
            assert!(
                out.contains("tokens "),
                "{script} printed its tokens:\n{out}"
            );
        }
    }

    // The README's and docs/clients.md's Python examples, as written.
    let readme = std::fs::read_to_string(root().join("clients/python/README.md")).expect("README");
    let docs = std::fs::read_to_string(root().join("docs/clients.md")).expect("docs");
    let start = docs
        .find("## Python (redis-py): the package")
        .expect("the Python section");
    let end = docs[start + 3..]
        .find("\n## ")
        .map_or(docs.len(), |e| start + 3 + e);
    let blocks: Vec<String> = runnable_blocks(&readme)
        .into_iter()
        .chain(runnable_blocks(&docs[start..end]))
        .collect();
    assert!(
        blocks.len() >= 4,
        "the README and docs have runnable examples"
    );
    for (i, block) in blocks.iter().enumerate() {
        let file = scratch.join(format!("example_{i}.py"));
        std::fs::write(&file, block).expect("write the example");
        let out = run(
            &format!("example {i}:\n{block}"),
            python(venv, scratch)
                .arg(&file)
                .env("REDIS_LOCK_PORT", server.port.to_string()),
        );
        assert!(
            out.contains("ok"),
            "example {i} printed ok:\n{block}\n{out}"
        );
    }

    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let ports: Vec<String> = servers.iter().map(|s| s.port.to_string()).collect();
    for down in [0, 2, 3] {
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        run(
            &format!("RedLock with {down} of 5 servers stopped"),
            python(venv, tests)
                .args(["-m", "unittest", "-v", "test_redlock"])
                .env("REDLOCK_PORTS", ports.join(","))
                .env("REDLOCK_DOWN", down.to_string()),
        );
    }
}
