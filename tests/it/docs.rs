//! The docs checked against the module and the repository (issue 43): what
//! README.md, redis.conf.example and docs/ tell a newcomer holds.
//!
//! - The settings: `CONFIG GET lock.*` on a server against
//!   redis.conf.example (each setting, commented out at its default) and
//!   docs/commands.md (its table and its `CONFIG GET` example).
//! - The example config: a server started from it as the README's quick
//!   start (`make run`) and the config's own header start it, in a temporary
//!   directory, answers the quick start's transcript, and writes nothing
//!   into the current directory; .gitignore covers what it writes.
//! - Links: every link of the README, docs/ and the packages' READMEs stays
//!   in the repository and points to a file (and heading) that exists.
//! - Errors: every error text of docs/commands.md's table is produced here
//!   (or, for the few that need a cluster, asserted by another area's test).
//! - INFO lock: every field in commands.md's table and its example.
//! - The grant commands' redis-cli examples in commands.md replay.
//! - Figures: measured figures live in docs/benchmarks.md; a ratio, an
//!   instruction count or a time with a fraction or in µs that README.md,
//!   docs/design.md or docs/commands.md states is one benchmarks.md states.
//! - `lock_bindings_memory`: the estimate commands.md gives.
//!
//! The lists come from the sources (the server's settings, the table, the
//! files), so a setting, an error row or a doc added elsewhere is checked
//! without a change here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `CONFIG GET lock.*`: each setting's name and value.
fn server_settings(c: &mut Conn) -> BTreeMap<String, String> {
    let r = c.cmd(&["CONFIG", "GET", "lock.*"]);
    let settings: BTreeMap<String, String> = r
        .pairs()
        .into_iter()
        .map(|(name, value)| (name, value.str()))
        .collect();
    assert!(!settings.is_empty(), "CONFIG GET lock.*: {r:?}");
    settings
}

/// The inline code spans of a line (`code`), in order.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

#[test]
fn the_settings_are_the_servers_in_the_example_config_and_the_docs() {
    let s = Server::start();
    let mut c = s.conn();
    let settings = server_settings(&mut c);

    // docs/commands.md: the table lists every setting, with its default.
    let commands = markdown("docs/commands.md");
    let config = section(&commands, "## Configuration");
    let table: BTreeMap<String, String> = config
        .lines()
        .filter(|l| l.starts_with("| `lock."))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_string();
            let default: String = cells[2].chars().take_while(char::is_ascii_digit).collect();
            (name, default)
        })
        .collect();
    assert_eq!(
        table, settings,
        "docs/commands.md's settings table (name, default) against CONFIG GET lock.*"
    );
    // Its CONFIG GET example shows every setting.
    let example = config
        .split("```")
        .find(|b| b.contains("CONFIG GET lock.*"))
        .expect("a CONFIG GET lock.* example in docs/commands.md");
    let shown: BTreeSet<String> = example
        .lines()
        .filter_map(|l| l.split('"').nth(1))
        .filter(|n| n.starts_with("lock."))
        .map(str::to_string)
        .collect();
    let names: BTreeSet<String> = settings.keys().cloned().collect();
    assert_eq!(shown, names, "docs/commands.md's CONFIG GET lock.* example");

    // redis.conf.example: each setting described in its list and shown,
    // commented out, at its default; nothing else named `lock.`.
    let conf = read(&root().join("redis.conf.example"));
    for (name, default) in &settings {
        let short = name.trim_start_matches("lock.");
        assert!(
            conf.lines().any(|l| l
                .strip_prefix("#   ")
                .is_some_and(|d| d.split_whitespace().next() == Some(short))),
            "redis.conf.example does not describe {name} in its settings list"
        );
        let line = format!("# {name} {default}");
        assert!(
            conf.lines().any(|l| l.trim_end() == line),
            "redis.conf.example has no line `{line}` (the setting at its default)"
        );
    }
    for l in conf.lines() {
        if let Some(name) = l.trim_start_matches("# ").split_whitespace().next() {
            if name.starts_with("lock.") && !name.contains(',') {
                assert!(
                    settings.contains_key(name),
                    "redis.conf.example names {name}, which the server does not have"
                );
            }
        }
    }
}

/// A redis-server started the way a doc shows, in a directory of the
/// test's, killed on drop.
struct Started {
    child: Child,
    port: u16,
    /// Where its process ran (its current directory).
    cwd: PathBuf,
    /// The data dir it was given.
    data: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(self.cwd.parent().unwrap_or(&self.cwd));
        }
    }
}

/// A fresh directory with `cwd/` (where the server runs) and `data/`.
fn scratch(label: &str) -> (PathBuf, PathBuf) {
    let base = std::env::temp_dir().join("redis-lock-tests").join(format!(
        "docs-{label}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    let (cwd, data) = (base.join("cwd"), base.join("data"));
    fs::create_dir_all(&cwd).expect("create cwd");
    fs::create_dir_all(&data).expect("create data");
    (cwd, data)
}

/// Runs `argv` (its words, the doc's placeholders replaced by `fill`) as
/// the server, from a directory of its own, and waits for it to answer.
fn start_as(label: &str, argv: &[String], fill: impl Fn(&str, &Path, u16) -> String) -> Started {
    // A relative REDIS_SERVER is the test's, not the started directory's.
    let binary = server_binary();
    let binary = if binary.is_relative() && binary.components().count() > 1 {
        std::env::current_dir().expect("cwd").join(binary)
    } else {
        binary
    };
    let mut failures = Vec::new();
    // Another test may take the free port first: a few attempts.
    for attempt in 0..5 {
        let (cwd, data) = scratch(&format!("{label}-{attempt}"));
        let port = free_port();
        let words: Vec<String> = argv.iter().map(|w| fill(w, &data, port)).collect();
        let (program, args) = words.split_first().expect("a command");
        assert_eq!(program, "redis-server", "{label}: {argv:?}");
        let log_path = data.parent().expect("base").join("server.log");
        let log = fs::File::create(&log_path).expect("log");
        let child = Command::new(&binary)
            .args(args)
            .current_dir(&cwd)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{label}: cannot start {program}: {e}"));
        let mut started = Started {
            child,
            port,
            cwd,
            data,
        };
        for _ in 0..1500 {
            if started.child.try_wait().ok().flatten().is_some() {
                break;
            }
            let ours = Conn::try_connect(port).ok().and_then(|mut c| {
                let dir = c.try_cmd(&["CONFIG", "GET", "dir"]).ok()?;
                let dir = dir.pairs().first().map(|(_, v)| v.str())?;
                Some(fs::canonicalize(dir).ok()? == fs::canonicalize(&started.data).ok()?)
            });
            if ours == Some(true) {
                return started;
            }
            sleep_ms(10);
        }
        failures.push(format!("{words:?}:\n{}", read(&log_path)));
    }
    panic!("{label}: no server answered:\n{}", failures.join("\n"));
}

/// The quick start's redis-cli transcript, from README.md.
fn quick_start() -> String {
    let readme = markdown("README.md");
    let section = section(&readme, "## Quick start");
    let block = code_blocks(section)
        .into_iter()
        .find(|b| b.contains("127.0.0.1:6379> "))
        .expect("a redis-cli transcript in the README's quick start");
    let from = block.find("127.0.0.1:6379> ").unwrap_or(0);
    block[from..].to_string()
}

/// Checks a server started from redis.conf.example: it has the module, it
/// keeps its files in the data dir given and nothing in its current
/// directory, the README's quick start runs on it, and .gitignore covers
/// what it wrote wherever the docs run it.
fn check_started(label: &str, s: &Started) {
    let mut c = Conn::connect(s.port);
    let dir = c.cmd(&["CONFIG", "GET", "dir"]).pairs()[0].1.str();
    assert_eq!(
        fs::canonicalize(&dir).ok(),
        fs::canonicalize(&s.data).ok(),
        "{label}: the data dir"
    );
    replay_cli_transcript_on(s.port, &quick_start());
    assert!(c.cmd(&["SAVE"]).is("OK"));
    let in_cwd: Vec<_> = fs::read_dir(&s.cwd)
        .expect("cwd")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        in_cwd.is_empty(),
        "{label}: the server wrote {in_cwd:?} into its current directory"
    );
    let mut written = Vec::new();
    for e in fs::read_dir(&s.data).expect("data") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if e.path().is_dir() {
            for f in fs::read_dir(e.path()).expect("subdir") {
                let f = f.expect("entry").file_name().to_string_lossy().into_owned();
                written.push(format!("{name}/{f}"));
            }
        } else {
            written.push(name);
        }
    }
    assert!(
        written.iter().any(|w| w.starts_with("appendonlydir/")),
        "{label}: the example's AOF: {written:?}"
    );
    // Where `make run` keeps them (target/run) and where a user running
    // the example by hand in a checkout would (its top directory).
    for w in &written {
        for path in [format!("target/run/{w}"), w.clone()] {
            let ignored = Command::new("git")
                .args(["check-ignore", "-q", "--no-index", &path])
                .current_dir(root())
                .status();
            if let Ok(status) = ignored {
                assert!(
                    status.code() != Some(1),
                    ".gitignore does not cover {path}, which {label} writes"
                );
            }
        }
    }
}

/// The README's quick start (`make run`: the Makefile's recipe) and the
/// example config's own header line start a server from
/// redis.conf.example; each is started as written, from an empty directory,
/// with the module of this build and a data dir of the test's.
#[test]
fn the_example_config_starts_the_quick_starts_server_in_its_data_dir() {
    let module = module_path();
    let conf = root().join("redis.conf.example");
    let fill = |w: &str, data: &Path, port: u16| -> String {
        match w {
            "redis.conf.example" => conf.to_string_lossy().into_owned(),
            "$(PORT)" => port.to_string(),
            "target/run" | "/path/to/data" => data.to_string_lossy().into_owned(),
            "$(CURDIR)/$(RELEASE_SO)" | "/path/to/libredis_lock.so" => {
                module.to_string_lossy().into_owned()
            }
            other => other.to_string(),
        }
    };

    // `make run`'s recipe, its continuation lines joined.
    let makefile = read(&root().join("Makefile"));
    let recipe = makefile
        .split("\nrun:")
        .nth(1)
        .expect("a run target in the Makefile");
    let mut command = String::new();
    for line in recipe.lines().skip(1) {
        let line = line.trim();
        if command.is_empty() && !line.starts_with("redis-server") {
            continue;
        }
        command.push_str(line.trim_end_matches('\\'));
        command.push(' ');
        if !line.ends_with('\\') {
            break;
        }
    }
    let argv: Vec<String> = command.split_whitespace().map(str::to_string).collect();
    assert!(
        argv.iter().any(|w| w == "--dir"),
        "make run gives the server a data dir: {argv:?}"
    );
    let s = start_as("make-run", &argv, fill);
    check_started("make run", &s);
    drop(s);

    // The header of redis.conf.example: `redis-server redis.conf.example ...`.
    let text = read(&conf);
    let line = text
        .lines()
        .find_map(|l| {
            l.trim_start_matches('#')
                .trim()
                .starts_with("redis-server redis.conf.example")
                .then(|| l.trim_start_matches('#').trim().to_string())
        })
        .expect("redis.conf.example shows how to start a server with it");
    let mut argv: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    argv.extend(["--port".to_string(), "$(PORT)".to_string()]);
    let s = start_as("example-header", &argv, fill);
    check_started("redis.conf.example's header", &s);
}

/// The Markdown files a reader opens: the README, docs/, and every README
/// of the packages and examples.
fn doc_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    for dir in ["docs"] {
        for e in fs::read_dir(root.join(dir)).expect("docs/") {
            let p = e.expect("entry").path();
            if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "node_modules" && name != "target" {
                    walk(&p, out);
                }
            } else if name == "README.md" {
                out.push(p);
            }
        }
    }
    for dir in ["clients", "examples"] {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    files
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The fenced code blocks of `text`, whatever their language.
fn code_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            match open.take() {
                Some(block) => blocks.push(block),
                None => open = Some(String::new()),
            }
        } else if let Some(block) = open.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    blocks
}

/// A line without its inline code spans.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the Markdown links of `text`: `[text](target)` and
/// `[label]: target`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push((n, after[..end].trim().to_string()));
            rest = &after[end..];
        }
        if let Some(def) = line.trim_start().strip_prefix('[') {
            if let Some((_, target)) = def.split_once("]: ") {
                out.push((n, target.trim().to_string()));
            }
        }
        for scheme in ["http://", "https://"] {
            if line.contains(scheme) && !out.iter().any(|(l, t)| *l == n && t.contains(scheme)) {
                out.push((n, scheme.to_string()));
            }
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every heading's anchor in `text` (a repeated heading gets `-1`, `-2`).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

#[test]
fn every_link_stays_in_the_repository_and_resolves() {
    let root = fs::canonicalize(root()).expect("the repository");
    let mut bad = Vec::new();
    let files = doc_files();
    assert!(files.len() > 8, "the docs: {files:?}");
    for file in &files {
        let text = read(file);
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        let dir = file.parent().expect("a file's dir");
        for (line, target) in links(&text) {
            let at = format!("{shown}:{line}: ({target})");
            if target.contains("://") || target.starts_with("mailto:") || target.starts_with("//") {
                bad.push(format!("{at}: leaves the repository"));
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            let Ok(resolved) = fs::canonicalize(&resolved) else {
                bad.push(format!("{at}: no such file"));
                continue;
            };
            if !resolved.starts_with(&root) {
                bad.push(format!("{at}: leaves the repository"));
                continue;
            }
            if !anchor.is_empty() {
                let has = resolved.extension().is_some_and(|x| x == "md")
                    && anchors(&read(&resolved)).contains(anchor);
                if !has {
                    bad.push(format!("{at}: no heading #{anchor} there"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// One piece of a documented error text.
#[derive(Debug)]
enum Piece {
    Text(String),
    /// `N`: a number.
    Number,
    /// `...` or `xxx`: anything.
    Any,
}

/// A documented error text as pieces: `N` stands for a number, `...` and
/// `xxx` for anything.
fn pattern(doc: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let chars: Vec<char> = doc.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let word_edge = |j: usize| j >= chars.len() || !chars[j].is_alphanumeric();
        let before_edge = i == 0 || !chars[i - 1].is_alphanumeric();
        if chars[i] == 'N' && before_edge && word_edge(i + 1) {
            out.push(Piece::Text(std::mem::take(&mut text)));
            out.push(Piece::Number);
            i += 1;
        } else if doc[doc.char_indices().nth(i).map_or(0, |(b, _)| b)..].starts_with("...")
            || (before_edge && chars[i..].starts_with(&['x', 'x', 'x']) && word_edge(i + 3))
        {
            out.push(Piece::Text(std::mem::take(&mut text)));
            out.push(Piece::Any);
            i += 3;
        } else {
            text.push(chars[i]);
            i += 1;
        }
    }
    out.push(Piece::Text(text));
    out
}

fn matches(pieces: &[Piece], s: &str) -> bool {
    match pieces.split_first() {
        None => s.is_empty(),
        Some((Piece::Text(t), rest)) => {
            s.strip_prefix(t.as_str()).is_some_and(|r| matches(rest, r))
        }
        Some((Piece::Number, rest)) => {
            let digits = s.chars().take_while(char::is_ascii_digit).count();
            digits > 0 && matches(rest, &s[digits..])
        }
        Some((Piece::Any, rest)) => (0..=s.len())
            .filter(|i| s.is_char_boundary(*i))
            .any(|i| matches(rest, &s[i..])),
    }
}

/// The error texts of docs/commands.md's error table, each with the row's
/// first cell. A row's `... tail` spans are variants of its first text
/// (its error code, anything, the tail).
fn documented_errors() -> Vec<(String, Vec<Piece>)> {
    let doc = markdown("docs/commands.md");
    let table = section(&doc, "## Errors");
    let mut out = Vec::new();
    for line in table.lines().filter(|l| l.starts_with("| `")) {
        let first = line.split(" | ").next().unwrap_or(line);
        let spans = code_spans(first);
        let Some(main) = spans.first() else { continue };
        out.push((main.to_string(), pattern(main)));
        let code = main.split_whitespace().next().unwrap_or("");
        for alt in &spans[1..] {
            if let Some(tail) = alt.strip_prefix("... ") {
                out.push((alt.to_string(), pattern(&format!("{code} ...{tail}..."))));
            }
        }
    }
    assert!(out.len() > 20, "the error table: {out:?}");
    out
}

fn error_of(r: Reply) -> String {
    match r {
        Reply::Error(e) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// Errors the module answers, produced against a live server (and its
/// replica): what each row of the table says happens.
fn produce_errors() -> Vec<String> {
    let s = Server::start();
    let mut c = s.conn();
    let mut errors = Vec::new();
    let mut run = |c: &mut Conn, cmds: &[&[&str]]| {
        let mut last = Reply::Nil;
        for cmd in cmds {
            last = c.cmd(cmd);
        }
        errors.push(error_of(last));
    };
    run(&mut c, &[&["LOCK.ACQUIRE", "k"]]);
    run(&mut c, &[&["LOCK.ACQUIRE", "k", "o", "0"]]);
    run(&mut c, &[&["LOCK.ACQUIRE", "k", "o", "1000", "WAIT", "-1"]]);
    run(&mut c, &[&["LOCK.ACQUIRE", "k", "o", "1000", "FOO"]]);
    run(&mut c, &[&["LOCK.ACQUIRE", "k", "", "1000"]]);
    run(
        &mut c,
        &[
            &["LOCK.READ", "rw", "o", "60000"],
            &["LOCK.ACQUIRE", "rw", "o", "60000"],
        ],
    );
    run(
        &mut c,
        &[
            &["LOCK.ACQUIRE", "wr", "o", "60000"],
            &["LOCK.READ", "wr", "o", "60000"],
        ],
    );
    c.cmd(&["LOCK.ACQUIRE", "q", "holder", "60000"]);
    c.cmd(&["CONFIG", "SET", "lock.max-waiters", "0"]);
    run(
        &mut c,
        &[&["LOCK.ACQUIRE", "q", "o", "60000", "WAIT", "1000"]],
    );
    c.cmd(&["CONFIG", "SET", "lock.max-waiters", "10000"]);
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "1"]);
    run(
        &mut c,
        &[
            &["LOCK.READ", "mh", "a", "60000"],
            &["LOCK.READ", "mh", "b", "60000"],
        ],
    );
    c.cmd(&["CONFIG", "SET", "lock.max-holders", "1000"]);
    run(
        &mut c,
        &[&["SET", "str", "v"], &["LOCK.ACQUIRE", "str", "o", "1000"]],
    );
    run(
        &mut c,
        &[&[
            "EVAL",
            "return redis.pcall('LOCK.ACQUIRE', KEYS[1], 'o', '1000', 'BIND')",
            "1",
            "sk",
        ]],
    );
    run(&mut c, &[&["LOCK.SEMAPHORE", "sem", "0", "o", "1000"]]);
    run(
        &mut c,
        &[
            &["LOCK.SEMAPHORE", "sem", "2", "a", "60000"],
            &["LOCK.SEMAPHORE", "sem", "3", "b", "60000"],
        ],
    );
    run(&mut c, &[&["LOCK.ACQUIRE", "sem", "c", "60000"]]);
    run(
        &mut c,
        &[
            &["LOCK.ACQUIRE", "lk", "a", "60000"],
            &["LOCK.SEMAPHORE", "lk", "2", "b", "60000"],
        ],
    );
    run(&mut c, &[&["LOCK.MACQUIRE", "0", "k", "o", "1000"]]);
    run(&mut c, &[&["LOCK.MACQUIRE", "2", "m", "m", "o", "1000"]]);
    run(
        &mut c,
        &[&["LOCK.GUARD", "g", "nobody", "CALL", "GET", "x"]],
    );
    c.cmd(&["LOCK.ACQUIRE", "g", "o", "60000"]);
    for inner in [
        &["BLPOP", "list", "0"][..],
        &["MULTI"][..],
        &["WAIT", "0", "0"][..],
        &["LOCK.GUARD", "g", "o", "CALL", "GET", "x"][..],
        &["LOCK.ACQUIRE", "g2", "o", "1000", "WAIT", "10"][..],
    ] {
        let mut cmd = vec!["LOCK.GUARD", "g", "o", "CALL"];
        cmd.extend_from_slice(inner);
        run(&mut c, &[&cmd]);
    }
    run(
        &mut c,
        &[&["LOCK.GUARD", "g", "o", "TOKEN", "0", "CALL", "GET", "x"]],
    );
    run(&mut c, &[&["LOCK.GUARD", "str", "o", "CALL", "GET", "x"]]);
    // A user who may not SET, through the guard.
    c.cmd(&["ACL", "SETUSER", "u", "on", ">p", "+@all", "-set", "~*"]);
    let mut u = s.conn();
    assert!(u.cmd(&["AUTH", "u", "p"]).is("OK"));
    run(
        &mut u,
        &[&["LOCK.GUARD", "g", "o", "CALL", "SET", "x", "1"]],
    );

    // More holds than a hold count takes: a lock restored with the most.
    let token = c.cmd(&["LOCK.ACQUIRE", "holds", "o", "60000"]).int();
    let payload = c.cmd(&["DUMP", "holds"]).bulk().to_vec();
    let (body, version) = dump_parts(&payload);
    let holder = OldHolder {
        owner: b"o".to_vec(),
        holds: u64::from(u32::MAX),
        token: token as u64,
        deadline: (now_ms() + 60_000) as u64,
    };
    let forged = dump_with_footer(&old_lock_body(body, 2, 0, None, &[holder]), version);
    c.cmd(&["DEL", "holds"]);
    c.cmdv(&[
        b"RESTORE".to_vec(),
        b"holds".to_vec(),
        b"0".to_vec(),
        forged,
    ])
    .ok();
    run(&mut c, &[&["LOCK.RACQUIRE", "holds", "o", "60000"]]);

    // A cycle of waits: a holds x and waits for y, b holds y and asks for x.
    c.cmd(&["LOCK.ACQUIRE", "dx", "a", "60000"]);
    c.cmd(&["LOCK.ACQUIRE", "dy", "b", "60000"]);
    let mut waiter = s.conn();
    waiter
        .send(&["LOCK.ACQUIRE", "dy", "a", "60000", "WAIT", "5000"])
        .unwrap();
    wait_until(Duration::from_secs(5), "a's request to wait", || {
        c.info_field("lock", "lock_waiters") == "1"
    });
    run(
        &mut c,
        &[&["LOCK.ACQUIRE", "dx", "b", "60000", "WAIT", "5000"]],
    );

    // A replica refuses every lock command that writes, even writable:
    // the grants, RELEASE, RENEW, KEEPALIVE, and LOCK.GUARD around a read.
    let replica = Server::builder().config("replica-read-only no").start();
    replica.replicaof(&s);
    wait_for_sync(&s, &replica);
    let mut r = replica.conn();
    for cmd in [
        &["LOCK.ACQUIRE", "rk", "o", "1000"][..],
        &["LOCK.READ", "rk", "o", "1000"][..],
        &["LOCK.SEMAPHORE", "rk", "2", "o", "1000"][..],
        &["LOCK.MACQUIRE", "1", "rk", "o", "1000"][..],
        &["LOCK.RELEASE", "g", "o"][..],
        &["LOCK.RENEW", "g", "o", "1000"][..],
        &["LOCK.KEEPALIVE", "1000"][..],
        &["LOCK.GUARD", "g", "o", "CALL", "GET", "x"][..],
    ] {
        let e = error_of(r.cmd(cmd));
        assert_eq!(e, LockError::Replica.message(), "{cmd:?} on a replica");
        errors.push(e);
    }
    assert!(r.lock_info("g").is_some(), "LOCK.INFO answers on a replica");
    errors
}

/// A row no test here produces (it needs a cluster) must be asserted by
/// another area's test: its text's head is a `LockError`'s message in
/// src/redis/errors.rs, and that variant is named by a test in tests/it
/// (not by this file, nor by the live fuzz's list of allowed errors).
fn produced_elsewhere(doc: &str) -> bool {
    let errors = read(&root().join("src/redis/errors.rs"));
    let head: String = doc
        .split(" N")
        .next()
        .unwrap_or(doc)
        .split("...")
        .next()
        .unwrap_or(doc)
        .chars()
        .skip_while(|c| *c != ' ')
        .skip(1)
        .collect();
    if head.len() < 10 {
        return false;
    }
    let Some(at) = errors.find(&head) else {
        return false;
    };
    let Some(arm) = errors[..at].rfind("LockError::") else {
        return false;
    };
    let variant: String = errors[arm..]
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == ':' || *c == '_')
        .collect();
    let dir = root().join("tests/it");
    fs::read_dir(&dir).expect("tests/it").flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name != "docs.rs"
            && name != "live_fuzz.rs"
            && read(&e.path()).contains(&format!("{variant}.message()"))
    })
}

#[test]
fn every_error_in_the_table_is_produced() {
    let produced = produce_errors();
    let documented = documented_errors();
    // What nothing can produce: a bug caught before it reached Redis.
    let unproducible = ["ERR internal error in the lock module (see the server log)"];
    let mut missing = Vec::new();
    for (doc, pieces) in &documented {
        if unproducible.contains(&doc.as_str()) {
            continue;
        }
        let here = produced.iter().any(|e| matches(pieces, e));
        if !here && !produced_elsewhere(doc) {
            missing.push(doc.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "documented errors no test produces: {missing:#?}\nproduced here: {produced:#?}"
    );
    // And everything produced here is documented (texts exactly).
    for e in &produced {
        assert!(
            documented.iter().any(|(_, p)| matches(p, e)),
            "{e:?} is not in docs/commands.md's error table"
        );
    }
}

/// The figures a doc states that look measured: ratios (`0.93x`),
/// instruction counts (`9,163 instructions`) and times with a fraction or
/// in µs (`9.1 ms`, `13 µs`).
fn measured_figures(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let words: Vec<&str> = line.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            let w = w.trim_matches(|c: char| "(),;:".contains(c));
            let number = |s: &str| {
                !s.is_empty()
                    && s.chars().next().is_some_and(|c| c.is_ascii_digit())
                    && s.chars()
                        .all(|c| c.is_ascii_digit() || c == ',' || c == '.')
            };
            if let Some(ratio) = w.strip_suffix('x') {
                if number(ratio) && ratio.contains('.') {
                    out.push((n, w.to_string()));
                }
            }
            let unit = words
                .get(i + 1)
                .map(|x| x.trim_end_matches(|c: char| "(),;:.".contains(c)));
            if number(w) && unit.is_some_and(|x| x.starts_with("instructions")) {
                out.push((n, w.to_string()));
            }
            // Times with a fraction (`9.1 ms`) and any in µs are measured.
            let time = unit.is_some_and(|u| ["ms", "s", "µs"].contains(&u));
            if number(w) && time && (w.contains('.') || unit == Some("µs")) {
                out.push((n, format!("{w} {}", unit.unwrap_or_default())));
            }
        }
    }
    out
}

#[test]
fn measured_figures_are_benchmarks_mds() {
    let bench = read(&root().join("docs/benchmarks.md"));
    let mut stray = Vec::new();
    for doc in ["README.md", "docs/design.md", "docs/commands.md"] {
        for (line, figure) in measured_figures(&read(&root().join(doc))) {
            let plain = figure.replace(',', "");
            if !bench.contains(&figure) && !bench.contains(&plain) {
                stray.push(format!("{doc}:{line}: {figure}"));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "figures not in docs/benchmarks.md (cite its rows instead):\n{}",
        stray.join("\n")
    );
}

/// `lock_bindings_memory` is what docs/commands.md's INFO table says: a
/// fixed size per binding (the number the row gives), plus the key's and
/// the owner's lengths when together they pass the slot's room (62 bytes).
#[test]
fn the_bindings_memory_estimate_is_the_documented_one() {
    let doc = markdown("docs/commands.md");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `lock_bindings_memory` |"))
        .expect("lock_bindings_memory's row");
    let fixed: i64 = row
        .split_whitespace()
        .zip(row.split_whitespace().skip(1))
        .filter(|(_, unit)| unit.starts_with("bytes"))
        .find_map(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("a fixed size in bytes in: {row}"));
    let room: usize = 62;
    assert!(row.contains(&format!("{room} bytes")), "{row}");
    let s = Server::start();
    let mut c = s.conn();
    let memory = |c: &mut Conn| -> i64 {
        c.info_field("lock", "lock_bindings_memory")
            .parse()
            .unwrap()
    };
    c.cmd(&["LOCK.ACQUIRE", "short", "owner", "60000", "BIND"])
        .int();
    assert_eq!(memory(&mut c), fixed, "one binding whose key and owner fit");
    let (key, owner) = ("k".repeat(100), "o".repeat(136));
    assert!(key.len() + owner.len() > room);
    c.cmd(&["LOCK.ACQUIRE", &key, &owner, "60000", "BIND"])
        .int();
    assert_eq!(
        memory(&mut c),
        2 * fixed + (key.len() + owner.len()) as i64,
        "and one whose key and owner do not"
    );
}

/// `INFO lock`'s fields are docs/commands.md's: each in its table (the
/// buckets between a row's first and last by its `...`), each row's field
/// in the server's section, and the example shows every field.
#[test]
fn every_info_lock_field_is_documented() {
    let s = Server::start();
    let mut c = s.conn();
    let info = c.cmd(&["INFO", "lock"]).str();
    let fields: BTreeSet<String> = info
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, _)| k.to_string())
        .filter(|k| k.starts_with("lock_"))
        .collect();
    assert!(fields.len() > 20, "INFO lock: {info}");
    let doc = markdown("docs/commands.md");
    let section = section(&doc, "## INFO lock");
    let mut named = BTreeSet::new();
    let mut families = BTreeSet::new();
    for line in section.lines().filter(|l| l.starts_with("| `lock_")) {
        let first = line.split(" | ").next().unwrap_or(line);
        for span in code_spans(first) {
            named.insert(span.to_string());
            if first.contains("...") {
                families.insert(
                    span.trim_end_matches(|c: char| c.is_ascii_digit())
                        .to_string(),
                );
            }
        }
    }
    for f in &fields {
        let family = f.trim_end_matches(|c: char| c.is_ascii_digit());
        assert!(
            named.contains(f) || families.contains(family),
            "INFO lock's {f} is not in docs/commands.md's INFO table"
        );
    }
    for n in &named {
        assert!(
            fields.contains(n),
            "docs/commands.md's INFO table names {n}, which INFO lock does not have"
        );
    }
    let example = code_blocks(section)
        .into_iter()
        .find(|b| b.contains("INFO lock"))
        .expect("an INFO lock example");
    let shown: BTreeSet<String> = example
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, _)| k.to_string())
        .filter(|k| k.starts_with("lock_"))
        .collect();
    assert_eq!(shown, fields, "docs/commands.md's INFO lock example");
}

/// docs/commands.md's redis-cli examples of the grant commands, each
/// section's in order on a server of its own (LOCK.GUARD's are replayed by
/// guard::; the others need waiting clients, a connection of their own or
/// a setting the transcript does not show).
#[test]
fn the_grant_examples_of_commands_md_replay() {
    let doc = markdown("docs/commands.md");
    for heading in [
        "## LOCK.RACQUIRE",
        "## LOCK.READ",
        "## LOCK.SEMAPHORE",
        "## LOCK.MACQUIRE",
    ] {
        let blocks: Vec<String> = code_blocks(section(&doc, heading))
            .into_iter()
            .filter(|b| b.starts_with("127.0.0.1:6379> "))
            .collect();
        assert!(!blocks.is_empty(), "{heading}: no example");
        let s = Server::start();
        for block in blocks {
            replay_cli_transcript_on(s.port, &block);
        }
    }
}
