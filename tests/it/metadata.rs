//! Command metadata: COMMAND INFO, COMMAND DOCS, COMMAND GETKEYS, COMMAND COUNT
//! and MODULE LIST.

use crate::common::*;

const GRANTS: [&str; 4] = [
    "lock.acquire",
    "lock.racquire",
    "lock.read",
    "lock.semaphore",
];
/// The commands with one key (LOCK.KEEPALIVE has none, LOCK.MACQUIRE takes
/// numkeys: their own tests).
const ALL: [&str; 7] = [
    "lock.acquire",
    "lock.racquire",
    "lock.read",
    "lock.semaphore",
    "lock.release",
    "lock.renew",
    "lock.info",
];

fn arity(cmd: &str) -> i64 {
    match cmd {
        "lock.acquire" | "lock.racquire" | "lock.read" => -4,
        "lock.semaphore" => -5,
        "lock.release" => -3,
        "lock.renew" => -4,
        "lock.info" => -2,
        other => panic!("unknown command {other}"),
    }
}

fn strings(r: &Reply) -> Vec<String> {
    r.array().iter().map(|x| x.str().to_lowercase()).collect()
}

#[test]
fn command_info_for_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    for cmd in ALL {
        let r = c.cmd(&["COMMAND", "INFO", cmd]);
        let entries = r.array();
        assert_eq!(entries.len(), 1, "COMMAND INFO {cmd}: {r:?}");
        assert!(!entries[0].is_nil(), "COMMAND INFO {cmd}: unknown command");
        let e = entries[0].array();
        assert!(
            e.len() >= 10,
            "COMMAND INFO {cmd} has 10 fields in 7.0: {r:?}"
        );
        assert_eq!(e[0].str().to_lowercase(), cmd, "name");
        assert_eq!(e[1].int(), arity(cmd), "{cmd}: arity");
        let flags = strings(&e[2]);
        let has = |f: &str| flags.iter().any(|x| x == f);
        if cmd == "lock.info" {
            assert!(has("readonly"), "{cmd}: flags {flags:?}");
            assert!(!has("write"), "{cmd}: flags {flags:?}");
        } else {
            assert!(has("write"), "{cmd}: flags {flags:?}");
            assert!(!has("readonly"), "{cmd}: flags {flags:?}");
        }
        if GRANTS.contains(&cmd) {
            assert!(has("denyoom"), "{cmd}: flags {flags:?}");
        }
        if cmd == "lock.release" {
            assert!(
                !has("denyoom"),
                "RELEASE must work when memory is full: {flags:?}"
            );
        }
        if GRANTS.contains(&cmd) {
            // They may block (WAIT): flagged as Redis flags BLPOP and XREAD.
            assert!(has("blocking"), "{cmd}: flags {flags:?}");
            assert!(!has("fast"), "{cmd}: flags {flags:?}");
        } else {
            assert!(has("fast"), "{cmd}: flags {flags:?}");
            assert!(!has("blocking"), "{cmd}: flags {flags:?}");
        }
        assert_eq!(e[3].int(), 1, "{cmd}: first key");
        assert_eq!(e[4].int(), 1, "{cmd}: last key");
        assert_eq!(e[5].int(), 1, "{cmd}: step");
        // Key specs (field 9).
        let specs = e[8].array();
        assert_eq!(specs.len(), 1, "{cmd}: one key spec: {:?}", e[8]);
        let spec = &specs[0];
        let spec_flags: Vec<String> = spec
            .get("flags")
            .unwrap_or_else(|| panic!("{cmd}: key spec without flags: {spec:?}"))
            .array()
            .iter()
            .map(|f| f.str())
            .collect();
        if cmd == "lock.info" {
            assert!(
                spec_flags.iter().any(|f| f == "RO"),
                "{cmd}: {spec_flags:?}"
            );
            assert!(
                !spec_flags.iter().any(|f| f == "RW"),
                "{cmd}: {spec_flags:?}"
            );
        } else {
            assert!(
                spec_flags.iter().any(|f| f == "RW"),
                "{cmd}: {spec_flags:?}"
            );
        }
        let begin = spec.get("begin_search").expect("begin_search");
        assert_eq!(
            begin.get("type").map(|t| t.str()).as_deref(),
            Some("index"),
            "{cmd}: {begin:?}"
        );
        let spec_idx = begin.get("spec").expect("begin_search spec");
        assert_eq!(
            spec_idx.get("index"),
            Some(Reply::Int(1)),
            "{cmd}: {begin:?}"
        );
        let find = spec.get("find_keys").expect("find_keys");
        assert_eq!(
            find.get("type").map(|t| t.str()).as_deref(),
            Some("range"),
            "{cmd}: {find:?}"
        );
        let range = find.get("spec").expect("find_keys spec");
        assert_eq!(range.get("lastkey"), Some(Reply::Int(0)), "{cmd}: {find:?}");
    }
    // Upper case names work too.
    let r = c.cmd(&["COMMAND", "INFO", "LOCK.ACQUIRE"]);
    assert!(!r.array()[0].is_nil());
}

/// Every argument name in a COMMAND DOCS argument list, nested blocks included,
/// with its token (if any) and whether it is optional.
fn collect_args(args: &Reply, out: &mut Vec<(String, Option<String>, bool)>) {
    for a in args.array() {
        let name = a.get("name").map(|n| n.str()).unwrap_or_default();
        let token = a.get("token").map(|t| t.str());
        let optional = a
            .get("flags")
            .map(|f| strings(&f).iter().any(|x| x == "optional"))
            .unwrap_or(false);
        out.push((name.to_lowercase(), token, optional));
        if let Some(inner) = a.get("arguments") {
            collect_args(&inner, out);
        }
    }
}

#[test]
fn command_docs_for_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    for cmd in ALL {
        let r = c.cmd(&["COMMAND", "DOCS", cmd]);
        let pairs = r.pairs();
        assert_eq!(pairs.len(), 1, "COMMAND DOCS {cmd}: {r:?}");
        assert_eq!(pairs[0].0.to_lowercase(), cmd);
        let doc = &pairs[0].1;
        let summary = doc
            .get("summary")
            .unwrap_or_else(|| panic!("{cmd}: no summary: {doc:?}"));
        assert!(!summary.str().trim().is_empty(), "{cmd}: empty summary");
        let args = doc
            .get("arguments")
            .unwrap_or_else(|| panic!("{cmd}: no arguments: {doc:?}"));
        let mut names = Vec::new();
        collect_args(&args, &mut names);
        let has = |n: &str| names.iter().any(|(x, _, _)| x == n);
        assert!(has("key"), "{cmd}: arguments {names:?}");
        if cmd != "lock.info" {
            assert!(has("owner"), "{cmd}: arguments {names:?}");
        }
        if GRANTS.contains(&cmd) || cmd == "lock.renew" {
            assert!(has("ttl"), "{cmd}: arguments {names:?}");
        }
        let wait = names.iter().find(|(n, t, _)| {
            n == "wait" || t.as_deref().map(|t| t.eq_ignore_ascii_case("WAIT")) == Some(true)
        });
        if GRANTS.contains(&cmd) {
            let (_, _, optional) =
                wait.unwrap_or_else(|| panic!("{cmd}: no WAIT argument: {names:?}"));
            assert!(optional, "{cmd}: WAIT is optional: {names:?}");
            assert!(
                names.iter().any(|(n, t, _)| n == "ms"
                    && t.as_deref().map(|t| t.eq_ignore_ascii_case("WAIT")) == Some(true)),
                "{cmd}: the argument `WAIT ms`, as the docs write it: {names:?}"
            );
            assert!(
                names.iter().any(|(n, t, optional)| n == "bind"
                    && *optional
                    && t.as_deref() == Some("BIND")),
                "{cmd}: the optional BIND token: {names:?}"
            );
        } else {
            assert!(wait.is_none(), "{cmd}: no WAIT here: {names:?}");
        }
        // RELEASE and RENEW take `[TOKEN token]` (v4), an optional integer.
        if cmd == "lock.release" || cmd == "lock.renew" {
            assert!(
                names.iter().any(|(n, t, optional)| n == "token"
                    && *optional
                    && t.as_deref() == Some("TOKEN")),
                "{cmd}: the optional `TOKEN token`: {names:?}"
            );
        }
        // The key argument is tied to the key spec.
        let first = &args.array()[0];
        assert_eq!(
            first.get("type").map(|t| t.str()).as_deref(),
            Some("key"),
            "{cmd}: {first:?}"
        );
    }
    // Each command says which version added it.
    for (cmd, since) in [("lock.acquire", "0.1.0"), ("lock.semaphore", "0.2.0")] {
        let r = c.cmd(&["COMMAND", "DOCS", cmd]);
        let doc = &r.pairs()[0].1;
        assert_eq!(
            doc.get("since").map(|v| v.str()).as_deref(),
            Some(since),
            "{cmd}"
        );
    }
    // In RESP3 it is a map.
    let mut c3 = s.conn();
    c3.hello3();
    let r = c3.cmd(&["COMMAND", "DOCS", "lock.acquire"]);
    assert!(matches!(r, Reply::Map(_)), "{r:?}");
}

#[test]
fn keepalive_has_no_key_and_is_a_write_not_fast() {
    let s = Server::start();
    let mut c = s.conn();
    let r = c.cmd(&["COMMAND", "INFO", "lock.keepalive"]);
    let e = r.array()[0].array();
    assert_eq!(e[1].int(), 2, "arity");
    let flags = strings(&e[2]);
    // O(B), B the holders bound to the connection: not `fast`.
    assert!(
        flags.contains(&"write".to_string()) && !flags.contains(&"fast".to_string()),
        "{flags:?}"
    );
    assert_eq!((e[3].int(), e[4].int(), e[5].int()), (0, 0, 0), "no keys");
    assert!(e[8].array().is_empty(), "no key spec: {:?}", e[8]);
    let r = c.cmd(&["COMMAND", "DOCS", "lock.keepalive"]);
    let doc = &r.pairs()[0].1;
    let mut names = Vec::new();
    collect_args(&doc.get("arguments").expect("arguments"), &mut names);
    assert_eq!(names, vec![("ttl".to_string(), None, false)]);
    assert!(c
        .cmd(&["COMMAND", "GETKEYS", "LOCK.KEEPALIVE", "1000"])
        .is_err());
}

#[test]
fn macquire_finds_its_keys_from_numkeys() {
    let s = Server::start();
    let mut c = s.conn();
    let r = c.cmd(&["COMMAND", "INFO", "lock.macquire"]);
    let e = r.array()[0].array();
    assert_eq!(e[1].int(), -5, "arity");
    let flags = strings(&e[2]);
    for f in ["write", "denyoom", "blocking", "movablekeys"] {
        assert!(flags.contains(&f.to_string()), "{f}: {flags:?}");
    }
    let specs = e[8].array();
    assert_eq!(specs.len(), 1, "{:?}", e[8]);
    let find = specs[0].get("find_keys").expect("find_keys");
    assert_eq!(find.get("type").map(|t| t.str()).as_deref(), Some("keynum"));
    let spec = find.get("spec").expect("spec");
    assert_eq!(
        (
            spec.get("keynumidx"),
            spec.get("firstkey"),
            spec.get("keystep")
        ),
        (
            Some(Reply::Int(0)),
            Some(Reply::Int(1)),
            Some(Reply::Int(1))
        )
    );
    let r = c.cmd(&["COMMAND", "DOCS", "lock.macquire"]);
    let doc = &r.pairs()[0].1;
    let mut names = Vec::new();
    collect_args(&doc.get("arguments").expect("arguments"), &mut names);
    let names: Vec<&str> = names.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["numkeys", "key", "owner", "ttl", "ms", "bind", "id"]
    );
    for (args, keys) in [
        (vec!["1", "a", "o", "10"], vec!["a"]),
        (
            vec!["3", "a", "b", "c", "o", "10", "WAIT", "0", "BIND"],
            vec!["a", "b", "c"],
        ),
    ] {
        let mut full = vec!["COMMAND", "GETKEYS", "LOCK.MACQUIRE"];
        full.extend(&args);
        let r = c.cmd(&full);
        assert_eq!(r.array().iter().map(Reply::str).collect::<Vec<_>>(), keys);
    }
}

#[test]
fn command_getkeys_returns_the_key() {
    let s = Server::start();
    let mut c = s.conn();
    for args in [
        vec!["LOCK.ACQUIRE", "the-key", "o", "1000"],
        vec!["LOCK.ACQUIRE", "the-key", "o", "1000", "WAIT", "10"],
        vec!["LOCK.RACQUIRE", "the-key", "o", "1000"],
        vec!["LOCK.READ", "the-key", "o", "1000", "WAIT", "0"],
        vec!["LOCK.SEMAPHORE", "the-key", "3", "o", "1000", "BIND"],
        vec!["LOCK.RELEASE", "the-key", "o"],
        vec!["LOCK.RENEW", "the-key", "o", "1000"],
        vec!["LOCK.INFO", "the-key"],
    ] {
        let mut full = vec!["COMMAND", "GETKEYS"];
        full.extend(&args);
        let r = c.cmd(&full);
        assert_eq!(
            r,
            Reply::Array(vec![Reply::Bulk(b"the-key".to_vec())]),
            "{args:?}"
        );
    }
    // COMMAND GETKEYSANDFLAGS tells the access.
    let r = c.cmd(&["COMMAND", "GETKEYSANDFLAGS", "LOCK.INFO", "k"]);
    let e = r.array()[0].array();
    assert!(strings(&e[1]).contains(&"ro".to_string()), "{r:?}");
    let r = c.cmd(&["COMMAND", "GETKEYSANDFLAGS", "LOCK.ACQUIRE", "k", "o", "10"]);
    let e = r.array()[0].array();
    assert!(strings(&e[1]).contains(&"rw".to_string()), "{r:?}");
}

#[test]
fn command_count_grows_and_module_list_shows_lock() {
    let plain = Server::builder().without_module().start();
    let with = Server::start();
    let base = plain.conn().cmd(&["COMMAND", "COUNT"]).int();
    let n = with.conn().cmd(&["COMMAND", "COUNT"]).int();
    assert!(
        n >= base + 6,
        "COMMAND COUNT {n} with the module, {base} without"
    );
    let r = with.conn().cmd(&["MODULE", "LIST"]);
    let names: Vec<String> = r
        .array()
        .iter()
        .map(|m| m.get("name").expect("module name").str())
        .collect();
    assert!(names.iter().any(|n| n == "lock"), "MODULE LIST: {r:?}");
    let ver = r
        .array()
        .iter()
        .find(|m| m.get("name").map(|n| n.str()).as_deref() == Some("lock"))
        .and_then(|m| m.get("ver"))
        .expect("MODULE LIST ver")
        .int();
    let part = |s: &str| s.parse::<i64>().unwrap();
    let want = part(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"));
    assert_eq!(ver, want, "MODULE LIST ver is the crate's version");
    // Every command is listed by COMMAND LIST FILTERBY MODULE.
    let r = with
        .conn()
        .cmd(&["COMMAND", "LIST", "FILTERBY", "MODULE", "lock"]);
    let listed: Vec<String> = strings(&r);
    for cmd in ALL {
        assert!(listed.contains(&cmd.to_string()), "{cmd} not in {listed:?}");
    }
}

#[test]
fn acl_key_patterns_follow_the_key_specs() {
    let s = Server::start();
    let mut admin = s.conn();
    admin
        .cmd(&[
            "ACL",
            "SETUSER",
            "reader",
            "on",
            ">pw",
            "%R~lock:*",
            "+@all",
        ])
        .ok();
    admin
        .cmd(&["ACL", "SETUSER", "writer", "on", ">pw", "~lock:*", "+@all"])
        .ok();
    let t = admin.acquire("lock:a", "o", 60_000).int();
    admin.acquire("other:a", "o", 60_000).int();

    // Read-only key access: LOCK.INFO only.
    let mut r = s.conn();
    r.cmd(&["AUTH", "reader", "pw"]).ok();
    let info = r
        .lock_info("lock:a")
        .expect("LOCK.INFO allowed by %R~lock:*");
    assert_eq!(info.holder("o").token, t);
    for args in [
        vec!["LOCK.ACQUIRE", "lock:b", "o", "1000"],
        vec!["LOCK.RACQUIRE", "lock:b", "o", "1000"],
        vec!["LOCK.READ", "lock:b", "o", "1000"],
        vec!["LOCK.RELEASE", "lock:a", "o"],
        vec!["LOCK.RENEW", "lock:a", "o", "1000"],
        vec!["LOCK.INFO", "other:a"],
    ] {
        let reply = r.cmd(&args);
        assert!(
            matches!(&reply, Reply::Error(e) if e.starts_with("NOPERM")),
            "{args:?} as reader: {reply:?}"
        );
    }
    // Full access to lock:* only.
    let mut w = s.conn();
    w.cmd(&["AUTH", "writer", "pw"]).ok();
    assert!(w.acquire("lock:b", "o", 1_000).int() > t);
    assert_eq!(w.release("lock:b", "o").int(), 1);
    let reply = w.acquire("other:b", "o", 1_000);
    assert!(
        matches!(&reply, Reply::Error(e) if e.starts_with("NOPERM")),
        "{reply:?}"
    );
    assert_eq!(
        admin
            .lock_info("lock:a")
            .expect("unchanged")
            .holder("o")
            .token,
        t
    );
}

#[test]
fn scan_finds_lock_keys_by_type() {
    let s = Server::start();
    let mut c = s.conn();
    c.acquire("l1", "o", 60_000).int();
    c.read("l2", "o", 60_000).int();
    c.cmd(&["SET", "str", "v"]).ok();
    let r = c.cmd(&["SCAN", "0", "COUNT", "1000", "TYPE", TYPE_NAME]);
    let mut keys: Vec<String> = r.array()[1].array().iter().map(|k| k.str()).collect();
    keys.sort();
    assert_eq!(keys, ["l1", "l2"]);
}

/// Loading the module logs no warning (Redis marks warnings with `#`): the
/// defrag-callback warning the redis-module macro logged on every start of a
/// server without global defrag callbacks is gone.
#[test]
fn the_module_loads_without_a_warning() {
    let s = Server::start();
    let log = s.log_tail(200);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("<lock>") || l.contains("<module>"))
        .filter(|l| l.contains(" # "))
        .collect();
    assert!(warnings.is_empty(), "warnings at load: {warnings:?}");
    assert!(log.contains("Module 'lock' loaded"), "{log}");
}

/// docs/design.md, "Adding a command": a command registered by the module
/// (the server's own list, not a list kept here) has its section and its
/// table row in docs/commands.md, a summary in COMMAND DOCS, and a use in
/// every client package. Internal commands (their summary says so) are
/// exempt from the clients.
#[test]
fn every_registered_command_is_documented_and_in_every_client() {
    let s = Server::start();
    let mut c = s.conn();
    let names = strings(&c.cmd(&["COMMAND", "LIST", "FILTERBY", "MODULE", "lock"]));
    assert!(names.len() >= 10, "the module's commands: {names:?}");
    let doc = markdown("docs/commands.md");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sources = |dir: &str, ext: &str| -> String {
        let mut text = String::new();
        let mut dirs = vec![root.join(dir)];
        while let Some(d) = dirs.pop() {
            for entry in std::fs::read_dir(&d).expect("client sources").flatten() {
                let path = entry.path();
                let name = path.to_string_lossy().into_owned();
                if path.is_dir() && !name.ends_with("node_modules") && !name.ends_with("/dist") {
                    dirs.push(path);
                } else if name.ends_with(ext) && !name.ends_with("_test.go") {
                    text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        text
    };
    let clients = [
        ("Python", sources("clients/python/src", ".py")),
        ("Node", sources("clients/node/src", ".ts")),
        ("Rust", sources("clients/rust/src", ".rs")),
        ("Go", sources("clients/go", ".go")),
    ];
    for name in names {
        let upper = name.to_uppercase();
        let docs = c.cmd(&["COMMAND", "DOCS", &name]);
        let summary = docs.array()[1]
            .get("summary")
            .map(|s| s.str())
            .unwrap_or_default();
        assert!(!summary.is_empty(), "{upper}: no COMMAND DOCS summary");
        // A subcommand (`LOCK.SESSION|OPEN`) is documented, and offered,
        // with its container.
        let upper = upper.split('|').next().unwrap_or_default().to_string();
        if summary.starts_with("Internal:") {
            assert!(
                doc.contains(&format!("## Internal: {upper}")),
                "{upper}: no section"
            );
            continue;
        }
        assert!(
            doc.contains(&format!("\n## {upper} ")) || doc.contains(&format!("\n### {upper} ")),
            "{upper}: no section in docs/commands.md"
        );
        assert!(
            doc.contains(&format!("| `{upper} ")),
            "{upper}: no row in docs/commands.md's table"
        );
        if let Some((_, why)) = SERVER_ONLY.iter().find(|(n, _)| *n == upper) {
            // Said, and checked to be still true: the day a package gains
            // it, it leaves this list.
            for (client, text) in &clients {
                assert!(
                    !text.contains(&upper),
                    "{upper} is in the {client} package now: take it off SERVER_ONLY ({why})"
                );
            }
            continue;
        }
        for (client, text) in &clients {
            assert!(
                text.contains(&upper),
                "{upper}: not in the {client} package"
            );
        }
    }
}

/// Commands the server has and the packages do not offer yet, each with
/// why. docs/clients.md says the same.
const SERVER_ONLY: &[(&str, &str)] = &[];

/// `COMMAND DOCS` says when `LOCK.INFO`'s `WAITERS` came (an argument
/// added to a command that existed), and `LOCK.SYNC`'s summary describes
/// the effect form this version sends and writes to the AOF (0.3:
/// `mode:holds:token:deadline owner`), the 0.2 form as still applied.
#[test]
fn command_docs_give_waiters_its_since_and_lock_sync_its_current_form() {
    let s = Server::start();
    let mut c = s.conn();
    let r = c.cmd(&["COMMAND", "DOCS", "lock.info"]);
    let args = r.pairs()[0].1.get("arguments").expect("arguments");
    let waiters = args
        .array()
        .iter()
        .find(|a| a.get("name").map(|n| n.str()).as_deref() == Some("waiters"))
        .unwrap_or_else(|| panic!("no WAITERS argument: {args:?}"));
    assert_eq!(
        waiters.get("since").map(|v| v.str()).as_deref(),
        Some("0.2.0"),
        "{waiters:?}"
    );
    let r = c.cmd(&["COMMAND", "DOCS", "lock.sync"]);
    let summary = r.pairs()[0].1.get("summary").expect("summary").str();
    assert!(
        summary.contains("mode:holds:token:deadline[:limit] owner"),
        "{summary}"
    );
    // And that is the form the AOF holds: what a grant writes.
    let s = Server::builder().config("appendonly yes").start();
    let mut c = s.conn();
    let token = c.acquire("k", "o", 60000).int();
    let aof = aof_text(&s);
    let form = format!("exclusive:1:{token}:");
    assert!(aof.contains(&form), "the AOF has the 0.3 form: {aof}");
    assert!(!aof.contains("\r\nSET\r\n"), "no 0.2 form: {aof}");
}

/// The AOF's text: every file of the server's `appendonlydir`.
fn aof_text(s: &Server) -> String {
    let dir = s.dir.join("appendonlydir");
    let mut out = String::new();
    for e in std::fs::read_dir(&dir).expect("appendonlydir") {
        let bytes = std::fs::read(e.expect("entry").path()).expect("read");
        out.push_str(&String::from_utf8_lossy(&bytes));
    }
    out
}
