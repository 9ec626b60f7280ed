//! The Node package, installed as a user installs it, against real servers
//! (the Python package: tests/python_package.rs; Rust: tests/rust_package.rs):
//! `clients/node` packed as `npm pack` makes it from a clean copy
//! (its `prepare` builds) and the tarball installed into fresh npm projects
//! beside ioredis and node-redis, then TypeScript scripts
//! (clients/node/test/test.ts, session.ts, stall.ts, durable.ts) compiled
//! with tsc, once a client set (one project each, which the tests share:
//! they only run its scripts), and run: every kind with both clients, single server and
//! cluster, sessions, RedLock, and a SIGSTOPped server among three; the
//! client sets of a test run at once, each against its own servers (issue
//! 41: CI time); and the docs' Node examples compiled with
//! `tsc --init`'s defaults, ESM and CommonJS, and run. A server, a 3-master cluster and five RedLock
//! servers, all on 127.0.0.1, started here.

use crate::common::cluster::Cluster;
use crate::common::*;
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

/// The package as `npm pack` makes it from a clean copy of clients/node (no
/// `dist/`, no `node_modules/`): `npm ci` (whose `prepare` builds), then
/// `npm pack`. Made once for the tests of this file.
fn node_tarball() -> PathBuf {
    static TARBALL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TARBALL
        .get_or_init(|| {
            let src = root().join("clients/node");
            let pkg = temp_dir("npm-pkg");
            for f in [
                "package.json",
                "package-lock.json",
                "tsconfig.json",
                "README.md",
            ] {
                std::fs::copy(src.join(f), pkg.join(f)).expect("copy the package");
            }
            std::fs::create_dir_all(pkg.join("src")).expect("src");
            for f in std::fs::read_dir(src.join("src")).expect("clients/node/src") {
                let f = f.expect("a file of clients/node/src").path();
                if f.extension().is_some_and(|e| e == "ts") {
                    let name = f.file_name().expect("a file name");
                    std::fs::copy(&f, pkg.join("src").join(name)).expect("copy src");
                }
            }
            run(
                "npm ci (the package's build tools; prepare builds)",
                &mut npm(&pkg, &["ci"]),
            );
            let out = run("npm pack", &mut npm(&pkg, &["pack"]));
            let name = out
                .lines()
                .find(|l| l.trim_end().ends_with(".tgz"))
                .unwrap_or_else(|| panic!("npm pack named its tarball:\n{out}"))
                .trim()
                .to_string();
            let tarball = pkg.join(name);
            let list = run(
                "tar tzf the tarball",
                Command::new("tar").arg("tzf").arg(&tarball),
            );
            for f in [
                "package/dist/index.js",
                "package/dist/index.d.ts",
                "package/package.json",
            ] {
                assert!(list.contains(f), "npm pack ships {f}:\n{list}");
            }
            tarball
        })
        .clone()
}

/// A fresh directory (a count as well as the time: tests make them at once).
fn temp_dir(what: &str) -> PathBuf {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "{what}-{}-{}-{n}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// The client libraries every Node test runs with, as `npm install` names
/// them: what the package's devDependencies pin (the oldest that its
/// `peerDependencies` accept), then the newest release of each further major
/// they accept (checked against package.json below).
const CLIENTS: [(&str, [&str; 2]); 3] = [
    ("ioredis 5, node-redis 4", ["ioredis@5.11.1", "redis@4.7.1"]),
    (
        "ioredis 5, node-redis 5",
        ["ioredis@5.11.1", "redis@5.12.1"],
    ),
    ("ioredis 6, node-redis 6", ["ioredis@6.0.0", "redis@6.3.1"]),
];

/// `peerDependencies` accepts exactly the majors the tests run (`^` each
/// tested version, nothing else), and the devDependencies are the first set.
#[test]
fn node_package_accepts_the_client_majors_it_is_tested_with() {
    let json =
        std::fs::read_to_string(root().join("clients/node/package.json")).expect("package.json");
    let block = |name: &str| {
        let from = json
            .find(&format!("\"{name}\""))
            .unwrap_or_else(|| panic!("{name} in package.json"));
        let end = json[from..].find('}').expect("the block ends") + from;
        &json[from..end]
    };
    let range = |block: &str, lib: &str| -> Vec<String> {
        let at = block
            .find(&format!("\"{lib}\": \""))
            .unwrap_or_else(|| panic!("{lib} in {block}"));
        let rest = &block[at + lib.len() + 5..];
        let mut alts: Vec<String> = rest[..rest.find('"').expect("a closing quote")]
            .split("||")
            .map(|a| a.trim().to_string())
            .collect();
        alts.sort();
        alts
    };
    for (i, lib) in ["ioredis", "redis"].into_iter().enumerate() {
        let mut tested: Vec<String> = CLIENTS
            .iter()
            .map(|(_, v)| format!("^{}", &v[i][lib.len() + 1..]))
            .collect();
        tested.sort();
        tested.dedup();
        assert_eq!(
            range(block("peerDependencies"), lib),
            tested,
            "{lib}: peerDependencies are the tested majors"
        );
        assert_eq!(
            range(block("devDependencies"), lib),
            vec![CLIENTS[0].1[i][lib.len() + 1..].to_string()],
            "{lib}: devDependencies pin the first set"
        );
    }
}

/// A fresh npm project of `module_type` ("commonjs" or "module") with the
/// tarball installed beside `clients` (ioredis and node-redis), TypeScript
/// and @types/node (pinned), and a tsconfig.json from `tsc --init` as it comes.
fn npm_project(module_type: &str, clients: &[&str; 2]) -> PathBuf {
    npm_project_in(
        temp_dir(&format!("npm-{module_type}")),
        module_type,
        clients,
    )
}

/// [`npm_project`] in the fresh directory `project`.
fn npm_project_in(project: PathBuf, module_type: &str, clients: &[&str; 2]) -> PathBuf {
    std::fs::write(
        project.join("package.json"),
        format!(
            "{{\"name\": \"redis-lock-user\", \"version\": \"1.0.0\", \"private\": true, \"type\": \"{module_type}\"}}\n"
        ),
    )
    .expect("package.json");
    run(
        "npm install the tarball beside ioredis and node-redis",
        npm(&project, &["install"])
            .arg(node_tarball())
            .args(clients)
            .args(["typescript@5.9.3", "@types/node@20.19.1"]),
    );
    run("tsc --init", &mut tsc(&project, &["--init"]));
    project
}

fn tsc(project: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(project.join("node_modules/.bin/tsc"));
    c.args(args).current_dir(project);
    c
}

/// clients/node/test/`names`.ts copied into `project` and compiled to
/// CommonJS with tsc (strict, ES2022, `await using`'s disposables), in one
/// run of tsc.
fn compile_test_scripts(project: &Path, names: &[&str]) {
    let scripts: Vec<String> = names.iter().map(|n| format!("{n}.ts")).collect();
    for script in &scripts {
        let from = root().join("clients/node/test").join(script);
        std::fs::copy(&from, project.join(script)).expect("copy the script");
    }
    run(
        &format!("tsc {}", scripts.join(" ")),
        tsc(
            project,
            &[
                "--strict",
                "--skipLibCheck",
                "--target",
                "ES2022",
                "--lib",
                "ES2022,ESNext.Disposable",
                "--module",
                "commonjs",
            ],
        )
        .args(&scripts),
    );
}

/// The CommonJS project of `CLIENTS[set]` with every script of
/// clients/node/test compiled: made once for the tests of this file, which
/// only run its scripts (each against servers of its own). Projects left by
/// earlier runs of the tests (their process gone) are removed first.
fn test_project(set: usize) -> PathBuf {
    static PROJECTS: [std::sync::OnceLock<PathBuf>; 3] = [const { std::sync::OnceLock::new() }; 3];
    PROJECTS[set]
        .get_or_init(|| {
            remove_stale_projects();
            let project = npm_project_in(temp_dir("npm-shared"), "commonjs", &CLIENTS[set].1);
            compile_test_scripts(&project, &["test", "session", "stall", "durable"]);
            project
        })
        .clone()
}

/// Removes the shared projects of test processes that are gone (their
/// directory names carry the process id: `temp_dir`).
fn remove_stale_projects() {
    let Ok(dirs) = std::fs::read_dir(std::env::temp_dir().join("redis-lock-tests")) else {
        return;
    };
    for dir in dirs.flatten() {
        let name = dir.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("npm-shared-") else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if pid != std::process::id().to_string() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }
}

#[test]
fn node_package_installed_from_its_tarball_every_kind_from_typescript_single_and_cluster() {
    every_kind_single_and_cluster(0);
}

#[test]
fn node_package_every_kind_with_node_redis_5() {
    every_kind_single_and_cluster(1);
}

#[test]
fn node_package_every_kind_with_the_newest_majors_ioredis_6_node_redis_6() {
    every_kind_single_and_cluster(2);
}

/// `f` for each client set of CLIENTS (its label and `test_project`), all
/// at once (a thread each, each starting its own servers); a failure of any
/// fails the test.
fn each_client_set_at_once(f: impl Fn(&str, PathBuf) + Sync) {
    std::thread::scope(|s| {
        for (set, (label, _)) in CLIENTS.iter().enumerate() {
            let f = &f;
            s.spawn(move || f(label, test_project(set)));
        }
    });
}

/// With `CLIENTS[set]`: clients/node/test/test.ts against a server and a
/// 3-master cluster; clients/node/test/session.ts (sessions) with ioredis
/// against another server and cluster, and with node-redis against a third
/// server; and test.ts's RedLock test alone (with REDLOCK_PORTS) over five
/// servers with none, two, then three stopped.
fn every_kind_single_and_cluster(set: usize) {
    let label = CLIENTS[set].0;
    println!("with {label}");
    let project = test_project(set);
    let project = &project;
    // The scripts at once, each against servers of its own (test.js kills
    // every normal connection of its server, session.js pauses its server):
    // they mostly wait, on the servers and on their leases.
    // `script` against a server and, when `cluster`, a 3-master cluster of
    // its own, with `env`; its output.
    let against_servers_of_its_own =
        |script: &str, what: &str, env: &[(&str, &str)], cluster: bool| -> String {
            let server = Server::start();
            let cluster = cluster.then(Cluster::start);
            let mut node = Command::new("node");
            node.arg(script)
                .current_dir(project)
                .env("REDIS_LOCK_PORT", server.port.to_string())
                .envs(env.iter().copied());
            if let Some(cluster) = &cluster {
                node.env("REDIS_LOCK_CLUSTER_PORT", cluster.nodes[0].port.to_string());
            }
            let out = run(what, &mut node);
            all_passed(&format!("node {script}"), &out);
            out
        };
    let script = &against_servers_of_its_own;
    std::thread::scope(|s| {
        s.spawn(move || {
            let out = script(
                "test.js",
                "the TypeScript script against a server and a cluster",
                &[],
                true,
            );
            // The notice latency of a lost lease, as the script measured it.
            for line in out.lines().filter(|l| l.contains(" told after ")) {
                println!("{}", line.trim());
            }
        });
        // The sessions script once a client library (ONLY), each about 20 s
        // of leases running out and connections killed; the cluster tests
        // with the first.
        for (only, cluster) in [("ioredis", true), ("node-redis", false)] {
            s.spawn(move || {
                let out = script(
                    "session.js",
                    &format!("the sessions script with {only}"),
                    &[("ONLY", only)],
                    cluster,
                );
                assert!(
                    out.contains(
                        "locks in a Session survive every connection of the holder killed"
                    ),
                    "the fault test ran:\n{out}"
                );
                for line in out.lines().filter(|l| l.contains(" killed in ")) {
                    println!("{label}: {}", line.trim());
                }
            });
        }
        s.spawn(move || {
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
                        .current_dir(project)
                        .env("REDLOCK_PORTS", ports.join(","))
                        .env("REDLOCK_DOWN", down.to_string()),
                );
                all_passed("node test.js (RedLock)", &out);
                assert!(out.contains("ok   RedLock"), "the RedLock test ran:\n{out}");
            }
        });
    });
}

/// Three servers, the third SIGSTOPped by the script for three lease
/// lengths (and SIGCONTed by it, and here again whatever happened): the
/// locks on the other two are kept, the stalled server's reported lost,
/// every call returns within its timeout; then the third killed by the
/// script (SIGKILL) under bound locks, told within 100 ms.
#[test]
fn node_package_a_stalled_server_stalls_nothing_else() {
    each_client_set_at_once(|label, project| {
        println!("with {label}");
        let mut servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
        let ports: Vec<String> = servers.iter().map(|s| s.port.to_string()).collect();
        let out = Command::new("node")
            .arg("stall.js")
            .current_dir(&project)
            .env("STALL_PORTS", ports.join(","))
            .env("STALL_PID", servers[2].pid().expect("pid").to_string())
            .output()
            .expect("node stall.js");
        if servers[2].is_running() {
            servers[2].resume(); // the script kills it at the end
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "node stall.js failed:\n{text}");
        all_passed("node stall.js", &text);
        for line in text.lines().filter(|l| l.contains(" told after ")) {
            println!("{label}: {}", line.trim());
        }
    });
}

/// Durable grants (`replicas`): a master with one replica; the script
/// (clients/node/test/durable.ts) SIGSTOPs the replica to stop its
/// acknowledgements (and SIGCONTs it; here again whatever happened): grants
/// and renewals acknowledged with the replica up; with it paused a grant
/// released and NotDurableError, or kept with `durable` false when asked,
/// and a renewal told through `onNotDurable`.
#[test]
fn node_package_replicas_wait_after_grant_and_renewal() {
    each_client_set_at_once(|label, project| {
        println!("with {label}");
        let master = Server::start();
        let replica = Server::start();
        replica.replicaof(&master);
        let out = Command::new("node")
            .arg("durable.js")
            .current_dir(&project)
            .env("DURABLE_PORT", master.port.to_string())
            .env(
                "DURABLE_REPLICA_PID",
                replica.pid().expect("pid").to_string(),
            )
            .output()
            .expect("node durable.js");
        replica.resume();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        println!("{label}:\n{text}");
        assert!(out.status.success(), "node durable.js failed:\n{text}");
        all_passed("node durable.js", &text);
    });
}

/// The ```ts blocks of clients/node/README.md and of the Node.js section of
/// docs/clients.md (those with `require(` are CommonJS, the others ESM).
fn node_doc_examples() -> Vec<(String, String)> {
    let readme = markdown("clients/node/README.md");
    let docs = markdown("docs/clients.md");
    let section = section(&docs, "## Node.js (ioredis, node-redis): the package");
    fenced_blocks(&[("README", &readme), ("docs", section)], "ts")
}

#[test]
fn node_docs_examples_compile_with_tsc_init_defaults_esm_and_commonjs_and_run() {
    let examples = node_doc_examples();
    assert!(
        examples.iter().any(|(_, e)| e.contains("require("))
            && examples.iter().any(|(_, e)| !e.contains("require(")),
        "the docs have ESM and CommonJS examples"
    );
    // The examples use ioredis (and bad.ts node-redis's types): the sets with
    // the two ioredis majors; node-redis 5's set would repeat the first. The
    // four projects at once, each against a server of its own.
    std::thread::scope(|s| {
        for ((label, clients), module_type) in [&CLIENTS[0], &CLIENTS[2]]
            .into_iter()
            .flat_map(|c| ["module", "commonjs"].map(|m| (c, m)))
        {
            let examples = &examples;
            s.spawn(move || {
                let server = Server::start();
                let url = format!("redis://127.0.0.1:{}", server.port);
                println!("{module_type} with {label}");
                let project = npm_project(module_type, clients);
                let mine: Vec<&(String, String)> = examples
                    .iter()
                    .filter(|(_, e)| e.contains("require(") == (module_type == "commonjs"))
                    .collect();
                for (name, text) in &mine {
                    std::fs::write(project.join(format!("{name}.ts")), text).expect("write");
                }
                // tsc --init's defaults (target esnext) type-check `await using` ...
                run(
                    &format!("tsc -p . ({module_type}, tsc --init defaults)"),
                    &mut tsc(&project, &["-p", "."]),
                );
                // ... and emit it as it is, which Node 20 cannot parse: es2022 rewrites it.
                run(
                    &format!("tsc -p . --target es2022 ({module_type})"),
                    &mut tsc(&project, &["-p", ".", "--target", "es2022"]),
                );
                for (name, _) in &mine {
                    let out = run(
                        &format!("node {name}.js ({module_type})"),
                        Command::new("node")
                            .arg(format!("{name}.js"))
                            .current_dir(&project)
                            .env("REDIS_URL", &url),
                    );
                    assert!(out.contains("token"), "{name} printed its tokens:\n{out}");
                }
                // What tsc must refuse: a Lock is not disposable (hold() is), typos in
                // options, and anything but a client where a client goes (lines 10-12).
                std::fs::write(
                    project.join("bad.ts"),
                    "import { Redis } from \"ioredis\";\nimport { createClient } from \"redis\";\n\
                     import { Lock, RedLock } from \"redis-native-lock\";\n\
                     const redis = new Redis();\n\
                     export async function f(): Promise<void> {\n  await using lock = Lock.exclusive(redis, \"k\");\n}\n\
                     Lock.exclusive(redis, \"k\", { wiat: 5 });\n\
                     const settings = { host: \"127.0.0.1\", port: 6379 };\n\
                     Lock.exclusive(settings, \"k\");\n\
                     Lock.reentrant(createClient().connect(), \"k\");\n\
                     new RedLock([redis, settings]);\n",
                )
                .expect("bad.ts");
                let bad = tsc(&project, &["-p", ".", "--noEmit"])
                    .output()
                    .expect("tsc");
                let text = String::from_utf8_lossy(&bad.stdout);
                assert!(
                    !bad.status.success() && text.contains("TS2851") && text.contains("TS2353"),
                    "tsc refuses `await using` of a Lock and a misspelt option:\n{text}"
                );
                for line in 10..=12 {
                    assert!(
                        text.lines()
                            .any(|l| l.starts_with(&format!("bad.ts({line},"))
                                && l.contains("'RedisClient'")),
                        "tsc refuses what is not a client (bad.ts line {line}):\n{text}"
                    );
                }
                let _ = std::fs::remove_dir_all(&project);
            });
        }
    });
}
