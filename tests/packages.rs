//! The client packages, installed as a user installs them, against real
//! servers: `clients/python` with `pip install ./clients/python` into a fresh
//! virtualenv (redis-py comes from PyPI), then its unittest suite (blocking
//! and asyncio, on `Redis` and `RedisCluster`), the 10-line scripts taking
//! every lock kind, and RedLock over five servers with two, then three,
//! stopped. A server, a 3-master cluster and five RedLock servers, all on
//! 127.0.0.1, started here.

mod common;

use common::cluster::Cluster;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

/// A fresh virtualenv with the package installed as `pip install
/// ./clients/python` does (a copy of the source, not an editable link).
fn venv_with_package() -> PathBuf {
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "venv-{}-{}",
        std::process::id(),
        now_ms()
    ));
    run(
        "python3 -m venv (make client-deps installs python3-venv)",
        Command::new("python3").arg("-m").arg("venv").arg(&dir),
    );
    run(
        "pip install ./clients/python",
        Command::new(dir.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
            ])
            .arg(root().join("clients/python"))
            .env("PIP_NO_CACHE_DIR", "0"),
    );
    dir
}

/// The virtualenv's python: it imports the installed package (the tests'
/// folder holds no copy of it).
fn python(venv: &Path) -> Command {
    let mut c = Command::new(venv.join("bin/python"));
    c.current_dir(venv).env("PYTHONDONTWRITEBYTECODE", "1");
    c
}

#[test]
fn python_package_in_a_fresh_virtualenv_every_kind_sync_and_asyncio_single_and_cluster() {
    let venv = venv_with_package();
    let server = Server::start();
    let cluster = Cluster::start();
    let cluster_port = cluster.nodes[0].port;
    let tests = root().join("clients/python/tests");
    let out = run(
        "the package's unittest suite",
        python(&venv)
            .args(["-m", "unittest", "-v", "test_sync", "test_async"])
            .current_dir(&tests)
            .env("REDIS_LOCK_PORT", server.port.to_string())
            .env("REDIS_LOCK_CLUSTER_PORT", cluster_port.to_string()),
    );
    assert!(
        !out.contains("skipped"),
        "every test ran, none skipped:\n{out}"
    );
    for script in ["every_kind.py", "every_kind_async.py"] {
        let path = root().join("clients/python/examples").join(script);
        for (port, extra) in [(server.port, None), (cluster_port, Some("cluster"))] {
            let mut cmd = python(&venv);
            cmd.arg(&path).arg(port.to_string());
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
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let ports: Vec<String> = servers.iter().map(|s| s.port.to_string()).collect();
    for down in [0, 2, 3] {
        // The last `down` servers are stopped.
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        run(
            &format!("RedLock with {down} of 5 servers stopped"),
            python(&venv)
                .args(["-m", "unittest", "-v", "test_redlock"])
                .current_dir(&tests)
                .env("REDLOCK_PORTS", ports.join(","))
                .env("REDLOCK_DOWN", down.to_string()),
        );
    }
    let _ = std::fs::remove_dir_all(&venv);
}
