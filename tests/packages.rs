//! The client packages, installed as a user installs them, against real
//! servers: `clients/python` with `pip install ./clients/python` into a fresh
//! virtualenv (redis-py comes from PyPI), then its unittest suite (blocking
//! and asyncio, on `Redis` and `RedisCluster`), the 10-line scripts taking
//! every lock kind, and RedLock over five servers with two, then three,
//! stopped; `clients/node` built (`npm run build`) and installed with `npm
//! install ./clients/node` into a fresh npm project beside ioredis and
//! node-redis, then a TypeScript script (clients/node/test/test.ts) compiled
//! with tsc and run: every kind with both clients, single server and
//! cluster, and RedLock. A server, a 3-master cluster and five RedLock
//! servers, all on 127.0.0.1, started here.

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

fn npm(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new("npm");
    c.args(args)
        .args(["--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(dir);
    c
}

/// The script's last line is "N passed, 0 failed" with N > 0.
#[track_caller]
fn all_passed(what: &str, out: &str) {
    let last = out.lines().rfind(|l| l.contains(" passed, ")).unwrap_or("");
    let ok = last
        .strip_suffix(" passed, 0 failed")
        .and_then(|n| n.trim().parse::<u32>().ok())
        .is_some_and(|n| n > 0);
    assert!(ok, "{what}: not every test passed\n{out}");
}

#[test]
fn node_package_installed_with_npm_every_kind_from_typescript_single_and_cluster() {
    let pkg = root().join("clients/node");
    run(
        "npm install (the package's build tools)",
        &mut npm(&pkg, &["install"]),
    );
    run("npm run build (tsc)", &mut npm(&pkg, &["run", "build"]));
    let project = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "npm-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&project).expect("project dir");
    run("npm init", &mut npm(&project, &["init", "-y"]));
    run(
        "npm install ./clients/node beside ioredis and node-redis",
        npm(&project, &["install"]).arg(&pkg).args([
            "ioredis@5.11.1",
            "redis@4.7.1",
            "typescript@5.9.3",
            "@types/node@20.19.1",
        ]),
    );
    std::fs::copy(pkg.join("test/test.ts"), project.join("test.ts")).expect("copy the script");
    run(
        "tsc test.ts",
        Command::new(project.join("node_modules/.bin/tsc"))
            .args([
                "--strict",
                "--esModuleInterop",
                "--skipLibCheck",
                "--target",
                "ES2020",
                "--module",
                "commonjs",
                "test.ts",
            ])
            .current_dir(&project),
    );
    let server = Server::start();
    let cluster = Cluster::start();
    let out = run(
        "the TypeScript script against a server and a cluster",
        Command::new("node")
            .arg("test.js")
            .current_dir(&project)
            .env("REDIS_LOCK_PORT", server.port.to_string())
            .env("REDIS_LOCK_CLUSTER_PORT", cluster.nodes[0].port.to_string()),
    );
    all_passed("node test.js", &out);
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let ports: Vec<String> = servers.iter().map(|s| s.port.to_string()).collect();
    for down in [0, 2, 3] {
        for s in servers.iter_mut().skip(5 - down) {
            if s.is_running() {
                s.kill9();
            }
        }
        let out = run(
            &format!("RedLock with {down} of 5 servers stopped"),
            Command::new("node")
                .arg("test.js")
                .current_dir(&project)
                .env("REDIS_LOCK_PORT", server.port.to_string())
                .env("REDLOCK_PORTS", ports.join(","))
                .env("REDLOCK_DOWN", down.to_string()),
        );
        all_passed("node test.js (RedLock)", &out);
        assert!(out.contains("ok   RedLock"), "the RedLock test ran:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&project);
}
