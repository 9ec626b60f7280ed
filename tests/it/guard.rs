//! `LOCK.GUARD key owner [TOKEN token] CALL command [arg ...]`
//! (shared/CONTRACT.md, "Guarded commands (v3)"): the command runs, as one
//! atomic step, only while the owner holds the key; otherwise nothing runs,
//! nothing is replicated, and the reply begins `NOTHELD`. Cluster routing and
//! the live fuzz are in tests/cluster.rs and tests/live_fuzz.rs.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;

fn token(r: &Reply) -> i64 {
    match r {
        Reply::Int(t) if *t > 0 => *t,
        other => panic!("expected a token, got {other:?}"),
    }
}

fn digest(c: &mut Conn) -> Vec<u8> {
    c.cmd(&["DEBUG", "DIGEST"]).bulk().to_vec()
}

/// Sends `args`, which must be refused with an error beginning `prefix`,
/// and checks that nothing changed.
fn refused(c: &mut Conn, args: &[&str], prefix: &str) {
    let before = digest(c);
    let r = c.cmd(args);
    assert!(
        r.is_err() && r.err().starts_with(prefix),
        "{args:?}: expected {prefix}..., got {r:?}"
    );
    assert_eq!(digest(c), before, "{args:?} changed the data set");
}

#[test]
fn the_command_runs_only_while_the_owner_holds_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    let t = token(&c.acquire("job", "a", 60_000));
    // The command's own reply, whatever its type.
    c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "SET", "data", "1"])
        .ok();
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "INCR", "data"]);
    assert_eq!(r.int(), 2);
    let r = c.cmd(&["lock.guard", "job", "a", "call", "get", "data"]);
    assert_eq!(r.bulk(), b"2");
    c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "HSET", "h", "f", "v"]);
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "HGETALL", "h"]);
    assert_eq!(r.array().len(), 2);
    assert!(c
        .cmd(&["LOCK.GUARD", "job", "a", "CALL", "GET", "missing"])
        .is_nil());
    // Its errors are its own.
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "INCR", "h"]);
    assert!(r.err().starts_with("WRONGTYPE"), "{r:?}");
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "NOSUCHCOMMAND"]);
    assert!(r.err().starts_with("ERR unknown command"), "{r:?}");
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "SET", "data"]);
    assert!(
        r.err().starts_with("ERR wrong number of arguments"),
        "{r:?}"
    );
    // Under its token, and not under another.
    let ts = t.to_string();
    let other = (t + 1).to_string();
    c.cmd(&[
        "LOCK.GUARD",
        "job",
        "a",
        "TOKEN",
        &ts,
        "CALL",
        "SET",
        "data",
        "3",
    ])
    .ok();
    refused(
        &mut c,
        &[
            "LOCK.GUARD",
            "job",
            "a",
            "TOKEN",
            &other,
            "CALL",
            "SET",
            "data",
            "4",
        ],
        "NOTHELD",
    );
    // Someone else's, a key never locked, a key that is not a lock.
    refused(
        &mut c,
        &["LOCK.GUARD", "job", "b", "CALL", "SET", "data", "5"],
        "NOTHELD",
    );
    refused(
        &mut c,
        &["LOCK.GUARD", "free", "a", "CALL", "SET", "data", "5"],
        "NOTHELD",
    );
    refused(
        &mut c,
        &["LOCK.GUARD", "data", "a", "CALL", "SET", "data", "5"],
        "WRONGTYPE",
    );
    // Released, then expired.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "job", "a"]).int(), 1);
    refused(
        &mut c,
        &["LOCK.GUARD", "job", "a", "CALL", "SET", "data", "6"],
        "NOTHELD",
    );
    token(&c.acquire("short", "a", 50));
    sleep_ms(120);
    // Its lease ran out, and with it the key's TTL: the look drops the
    // key (before it, on a loaded machine Redis may not have yet, and the
    // refused command's own look would change the digest).
    assert_eq!(c.cmd(&["EXISTS", "short"]).int(), 0);
    refused(
        &mut c,
        &["LOCK.GUARD", "short", "a", "CALL", "SET", "data", "7"],
        "NOTHELD",
    );
    assert_eq!(c.cmd(&["GET", "data"]).bulk(), b"3");
}

#[test]
fn every_kind_of_holder_may_guard() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.cmd(&["LOCK.RACQUIRE", "r", "a", "60000"]));
    token(&c.cmd(&["LOCK.RACQUIRE", "r", "a", "60000"]));
    c.cmd(&["LOCK.GUARD", "r", "a", "CALL", "SET", "x", "r"])
        .ok();
    let t1 = token(&c.cmd(&["LOCK.READ", "rw", "reader1", "60000"]));
    let t2 = token(&c.cmd(&["LOCK.READ", "rw", "reader2", "60000"]));
    for (owner, t) in [("reader1", t1), ("reader2", t2)] {
        let t = t.to_string();
        let r = c.cmd(&["LOCK.GUARD", "rw", owner, "TOKEN", &t, "CALL", "GET", "x"]);
        assert_eq!(r.bulk(), b"r");
    }
    token(&c.cmd(&["LOCK.SEMAPHORE", "sem", "2", "p1", "60000"]));
    c.cmd(&["LOCK.GUARD", "sem", "p1", "CALL", "SET", "x", "p1"])
        .ok();
    refused(
        &mut c,
        &["LOCK.GUARD", "sem", "p2", "CALL", "SET", "x", "p2"],
        "NOTHELD",
    );
    assert_eq!(c.cmd(&["GET", "x"]).bulk(), b"p1");
}

#[test]
fn what_cannot_be_one_atomic_step_is_refused_and_nothing_runs() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.acquire("job", "a", 60_000));
    c.cmd(&["RPUSH", "q", "item"]);
    c.cmd(&["XADD", "s", "*", "f", "v"]);
    let g = |rest: &[&'static str]| {
        let mut v = vec!["LOCK.GUARD", "job", "a", "CALL"];
        v.extend_from_slice(rest);
        v
    };
    let cannot = "ERR LOCK.GUARD cannot run";
    for blocking in [
        &["BLPOP", "q", "0"][..],
        &["BLMOVE", "q", "q2", "LEFT", "LEFT", "0"],
        &["XREAD", "BLOCK", "0", "STREAMS", "s", "0"],
        &[
            "XREADGROUP",
            "GROUP",
            "g",
            "c",
            "BLOCK",
            "10",
            "STREAMS",
            "s",
            ">",
        ],
        &["WAIT", "0", "0"],
    ] {
        refused(&mut c, &g(blocking), cannot);
    }
    for no_script in [
        &["MULTI"][..],
        &["EXEC"],
        &["DISCARD"],
        &["WATCH", "q"],
        &["EVAL", "return redis.call('DEL', 'q')", "0"],
        &["FUNCTION", "FLUSH"],
    ] {
        refused(&mut c, &g(no_script), cannot);
    }
    refused(
        &mut c,
        &g(&["LOCK.GUARD", "job", "a", "CALL", "DEL", "q"]),
        cannot,
    );
    refused(
        &mut c,
        &g(&["LOCK.ACQUIRE", "other", "a", "1000", "WAIT", "10"]),
        cannot,
    );
    refused(
        &mut c,
        &g(&["LOCK.MACQUIRE", "2", "o1", "o2", "a", "1000", "WAIT", "0"]),
        cannot,
    );
    // A lock command without WAIT runs; so does a stream read without BLOCK.
    token(&c.cmd(&g(&["LOCK.ACQUIRE", "other", "a", "1000"])));
    let r = c.cmd(&g(&["XREAD", "COUNT", "1", "STREAMS", "s", "0"]));
    assert_eq!(r.array().len(), 1, "{r:?}");
    assert_eq!(c.cmd(&["LLEN", "q"]).int(), 1);
}

#[test]
fn bad_input_gets_an_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.acquire("job", "a", 60_000));
    for (args, prefix) in [
        (
            &["LOCK.GUARD", "job", "a", "SET", "x", "1"][..],
            "ERR syntax error",
        ),
        (
            &["LOCK.GUARD", "job", "", "CALL", "SET", "x", "1"],
            "ERR owner",
        ),
        (
            &["LOCK.GUARD", "job", "a", "TOKEN", "1", "CALL"],
            "ERR wrong number",
        ),
        (&["LOCK.GUARD", "job", "a", "CALL"], "ERR wrong number"),
    ] {
        refused(&mut c, args, prefix);
    }
    for bad in ["0", "-3", "x"] {
        let args = [
            "LOCK.GUARD",
            "job",
            "a",
            "TOKEN",
            bad,
            "CALL",
            "SET",
            "x",
            "1",
        ];
        refused(&mut c, &args, "ERR TOKEN");
    }
}

#[test]
fn a_guard_works_inside_multi_exec_and_scripts() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.acquire("job", "a", 60_000));
    c.cmd(&["MULTI"]).ok();
    c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "INCR", "n"]);
    c.cmd(&["LOCK.GUARD", "job", "b", "CALL", "INCR", "n"]);
    let r = c.cmd(&["EXEC"]);
    let replies = r.array();
    assert_eq!(replies[0].int(), 1);
    assert!(replies[1].err().starts_with("NOTHELD"), "{r:?}");
    let script = "return redis.call('LOCK.GUARD', KEYS[1], ARGV[1], 'CALL', 'INCR', KEYS[2])";
    let r = c.cmd(&["EVAL", script, "2", "job", "n", "a"]);
    assert_eq!(r.int(), 2);
    let r = c.cmd(&["EVAL", script, "2", "job", "n", "b"]);
    assert!(r.err().contains("NOTHELD"), "{r:?}");
    assert_eq!(c.cmd(&["GET", "n"]).bulk(), b"2");
}

#[test]
fn the_command_runs_as_the_callers_acl_user() {
    let s = Server::start();
    let mut c = s.conn();
    c.cmd(&[
        "ACL",
        "SETUSER",
        "worker",
        "on",
        ">pw",
        "~job:*",
        "+@all",
        "-flushall",
        "-del",
    ])
    .ok();
    c.cmd(&["SET", "secret", "s"]).ok();
    let mut w = s.conn();
    w.cmd(&["AUTH", "worker", "pw"]).ok();
    token(&w.acquire("job:lock", "a", 60_000));
    w.cmd(&[
        "LOCK.GUARD",
        "job:lock",
        "a",
        "CALL",
        "SET",
        "job:data",
        "1",
    ])
    .ok();
    let cases = [
        // A key outside the user's patterns (seen by Redis's own check of
        // the guard: its keys are the command's).
        &["LOCK.GUARD", "job:lock", "a", "CALL", "SET", "secret", "x"][..],
        // Commands the user may not run.
        &["LOCK.GUARD", "job:lock", "a", "CALL", "FLUSHALL"],
        &["LOCK.GUARD", "job:lock", "a", "CALL", "DEL", "job:data"],
    ];
    for args in cases {
        let before = digest(&mut c);
        let r = w.cmd(args);
        assert!(
            r.is_err() && r.err().starts_with("NOPERM"),
            "{args:?}: {r:?}"
        );
        assert_eq!(digest(&mut c), before, "{args:?} changed the data set");
    }
    assert_eq!(c.cmd(&["GET", "secret"]).bulk(), b"s");
}

#[test]
fn out_of_memory_refuses_a_guarded_write_as_it_refuses_a_direct_one() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.acquire("job", "a", 60_000));
    c.cmd(&["SET", "data", "1"]).ok();
    c.cmd(&["CONFIG", "SET", "maxmemory", "1"]).ok();
    let direct = c.cmd(&["SET", "data", "2"]);
    assert!(direct.err().starts_with("OOM"), "{direct:?}");
    refused(
        &mut c,
        &["LOCK.GUARD", "job", "a", "CALL", "SET", "data", "2"],
        "OOM",
    );
    // A read still runs; so does a write that frees memory.
    let r = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "GET", "data"]);
    assert_eq!(r.bulk(), b"1");
    assert_eq!(
        c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "DEL", "data"])
            .int(),
        1
    );
    c.cmd(&["CONFIG", "SET", "maxmemory", "0"]).ok();
}

/// Every file of the server's AOF, concatenated.
fn aof_text(dir: &Path) -> String {
    let mut text = String::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).expect("data dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.to_string_lossy().contains(".aof") {
                text.push_str(&String::from_utf8_lossy(&fs::read(&path).expect("aof")));
            }
        }
    }
    text
}

#[test]
fn replicas_and_the_aof_get_the_command_alone() {
    let mut master = Server::builder()
        .config("appendonly yes")
        .config("appendfsync always")
        .config("aof-use-rdb-preamble no")
        .start();
    let replica = Server::start();
    replica.replicaof(&master);
    wait_for_sync(&master, &replica);
    let mut c = master.conn();
    token(&c.acquire("job", "a", 60_000));
    c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "SET", "data", "1"])
        .ok();
    c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "INCRBY", "data", "41"]);
    let _ = c.cmd(&["LOCK.GUARD", "job", "b", "CALL", "SET", "data", "refused"]);
    let _ = c.cmd(&["LOCK.GUARD", "job", "a", "CALL", "BLPOP", "q", "0"]);
    wait_for_sync(&master, &replica);
    let mut r = replica.conn();
    assert_eq!(r.cmd(&["GET", "data"]).bulk(), b"42");
    assert_eq!(digest(&mut r), digest(&mut c));
    let stats = r.info("commandstats").to_lowercase();
    assert!(
        !stats.contains("lock.guard"),
        "the replica ran LOCK.GUARD:\n{stats}"
    );
    let aof = aof_text(&master.dir).to_lowercase();
    assert!(aof.contains("incrby"), "the AOF lacks the guarded write");
    assert!(!aof.contains("lock.guard"), "the AOF holds LOCK.GUARD");
    assert!(!aof.contains("refused"), "the AOF holds a refused write");
    drop(c);
    master.kill9();
    master.restart();
    let mut c = master.conn();
    assert_eq!(c.cmd(&["GET", "data"]).bulk(), b"42");
}

#[test]
fn command_getkeys_lists_the_lock_and_the_commands_keys() {
    let s = Server::start();
    let mut c = s.conn();
    let r = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.GUARD",
        "job",
        "a",
        "TOKEN",
        "7",
        "CALL",
        "MSET",
        "k1",
        "v",
        "k2",
        "v",
    ]);
    let keys: Vec<String> = r.array().iter().map(Reply::str).collect();
    assert_eq!(keys, ["job", "k1", "k2"]);
    let info = c.cmd(&["COMMAND", "INFO", "lock.guard"]);
    assert_eq!(info.array()[0].array()[1].int(), -5, "{info:?}");
}

#[test]
fn a_bound_holder_whose_connection_closed_guards_nothing() {
    let s = Server::start();
    let mut holder = s.conn();
    let id = holder.cmd(&["CLIENT", "ID"]).int().to_string();
    token(&holder.cmd(&["LOCK.ACQUIRE", "job", "a", "60000", "BIND"]));
    let mut c = s.conn();
    // In one write: nothing of the timer's cleaning up has run yet.
    c.send(&["CLIENT", "KILL", "ID", &id]).expect("send");
    c.send(&["LOCK.GUARD", "job", "a", "CALL", "SET", "data", "late"])
        .expect("send");
    assert_eq!(c.read_reply().expect("reply").int(), 1);
    let r = c.read_reply().expect("reply");
    assert!(r.err().starts_with("NOTHELD"), "{r:?}");
    assert!(c.cmd(&["GET", "data"]).is_nil());
}

/// The story the guard is for: holder A pauses (SIGSTOP) past its lease, B
/// takes the lock and writes, A continues. A's guarded write is refused;
/// the same write unguarded (the control) overwrites B's.
#[test]
fn a_holder_paused_past_its_lease_cannot_overwrite_the_next_holders_write() {
    let s = Server::start();
    let dir = s.dir.join("holder-a");
    fs::create_dir_all(&dir).expect("dir");
    let d = dir.display();
    let cli = format!("redis-cli -p {}", s.port);
    let script = format!(
        "{cli} LOCK.ACQUIRE job A 500 > {d}/acquired.tmp && mv {d}/acquired.tmp {d}/acquired
         while [ ! -e {d}/go ]; do sleep 0.01; done
         {cli} LOCK.GUARD job A CALL SET data from-A > {d}/guarded 2>&1
         {cli} SET control from-A > {d}/control 2>&1"
    );
    let mut a = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdout(Stdio::null())
        .spawn()
        .expect("holder A");
    let pid = a.id().to_string();
    wait_until(Duration::from_secs(10), "A's grant", || {
        dir.join("acquired").exists()
    });
    let a_token: i64 = fs::read_to_string(dir.join("acquired"))
        .expect("A's token")
        .trim()
        .parse()
        .expect("A was granted a token");
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    fs::write(dir.join("go"), b"").expect("go");
    // B waits for the lock: granted when A's lease ends, A still paused.
    let mut b = s.conn();
    let b_token = token(&b.cmd(&["LOCK.ACQUIRE", "job", "B", "60000", "WAIT", "10000"]));
    assert!(b_token > a_token);
    b.cmd(&["LOCK.GUARD", "job", "B", "CALL", "SET", "data", "from-B"])
        .ok();
    b.cmd(&["SET", "control", "from-B"]).ok();
    signal("-CONT");
    let status = a.wait().expect("A ends");
    assert!(status.success());
    let guarded = fs::read_to_string(dir.join("guarded")).expect("A's guarded reply");
    assert!(guarded.contains("NOTHELD"), "A's guarded write: {guarded}");
    assert_eq!(b.cmd(&["GET", "data"]).bulk(), b"from-B");
    // The control: unguarded, A's late write lands over B's.
    assert_eq!(b.cmd(&["GET", "control"]).bulk(), b"from-A");
}

/// docs/commands.md's LOCK.GUARD example, replayed through redis-cli.
#[test]
fn the_documented_example_runs() {
    let doc = markdown("docs/commands.md");
    let section = section(&doc, "## LOCK.GUARD");
    let blocks = fenced_blocks(&[("commands.md LOCK.GUARD ", section)], "");
    assert!(!blocks.is_empty(), "no example in the LOCK.GUARD section");
    for (_, block) in blocks {
        replay_cli_transcript(&block);
    }
}

/// A `BIND` inside a guard binds to the connection that sent the guard, and
/// ends with it (the called command's own client is a temporary one).
#[test]
fn a_bind_inside_a_guard_binds_to_the_guards_connection() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.acquire("job", "a", 60_000));
    let mut sender = s.conn();
    let id = sender.cmd(&["CLIENT", "ID"]).int().to_string();
    token(&sender.cmd(&[
        "LOCK.GUARD",
        "job",
        "a",
        "CALL",
        "LOCK.ACQUIRE",
        "bound",
        "a",
        "600000",
        "BIND",
    ]));
    assert!(c.lock_info("bound").is_some(), "granted");
    c.cmd(&["CLIENT", "KILL", "ID", &id]);
    assert!(
        c.lock_info("bound").is_none(),
        "ended with the guard's connection"
    );
    // A script's guard has no connection of its own to bind to.
    let script = "return redis.call('LOCK.GUARD', 'job', 'a', 'CALL', 'LOCK.ACQUIRE', 'b2', 'a', '1000', 'BIND')";
    let r = c.cmd(&["EVAL", script, "0"]);
    assert!(r.err().contains("BIND is not allowed"), "{r:?}");
    assert!(c.lock_info("b2").is_none());
}

/// Issue 38.3: `LOCK.KEEPALIVE` through `LOCK.GUARD` renews the holders
/// bound to the guard's sender (the called command's own client is a
/// temporary one, which holds nothing).
#[test]
fn keepalive_through_the_guard_renews_the_senders_bound_holders() {
    let s = Server::start();
    let mut c = s.conn();
    token(&c.cmd(&["LOCK.ACQUIRE", "g", "me", "5000", "BIND"]));
    token(&c.cmd(&["LOCK.ACQUIRE", "other", "me", "5000", "BIND"]));
    let r = c.cmd(&["LOCK.GUARD", "g", "me", "CALL", "LOCK.KEEPALIVE", "600000"]);
    assert_eq!(r, Reply::Int(2), "both bound holders renewed");
    for key in ["g", "other"] {
        let ttl = c.lock_info(key).unwrap().holder("me").ttl;
        assert!(ttl > 60_000, "{key}: renewed to about 600 s, left {ttl}");
    }
    // Another connection's guard renews its own bound holders: none.
    let mut d = s.conn();
    let r = d.cmd(&["LOCK.GUARD", "g", "me", "CALL", "LOCK.KEEPALIVE", "1000"]);
    assert_eq!(r, Reply::Int(0));
}
