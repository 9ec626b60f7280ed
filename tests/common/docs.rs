//! The code blocks of the project's Markdown, for tests that run the docs'
//! examples.

/// The Markdown file at `path` under the repository.
pub fn markdown(path: &str) -> String {
    std::fs::read_to_string(super::repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The section of `markdown` that starts at the `## ` heading `heading`,
/// up to the next `## ` heading.
pub fn section<'a>(markdown: &'a str, heading: &str) -> &'a str {
    let start = markdown
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let section = &markdown[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    &section[..end]
}

/// Every ```` ```lang ```` block of each `(label, text)`, in order, named
/// by its label and its number among all of them.
pub fn fenced_blocks(texts: &[(&str, &str)], lang: &str) -> Vec<(String, String)> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    for (label, text) in texts {
        let mut rest = *text;
        while let Some(i) = rest.find(&fence) {
            let body = &rest[i + fence.len()..];
            let j = body.find("```").expect("a closed block");
            out.push((format!("{label}{}", out.len()), body[..j].to_string()));
            rest = &body[j..][3..];
        }
    }
    out
}

/// Replays a redis-cli transcript (`127.0.0.1:6379> command` lines, each
/// followed by its output) against a fresh server, one redis-cli per
/// command (a transcript must not rely on a connection's state), and
/// compares the output. Tokens (integers of 13 digits or more) may differ
/// from the transcript's, but consistently (the same token where the
/// transcript repeats one, in replies and in the commands that quote one)
/// and increasing; other integers of 4 digits or more are remaining times,
/// within 5 s of the transcript's; everything else is compared exactly.
pub fn replay_cli_transcript(text: &str) {
    let s = super::server::Server::start();
    replay_cli_transcript_on(s.port, text);
}

/// [`replay_cli_transcript`] against the server listening on `port` (one
/// started as the docs start it).
pub fn replay_cli_transcript_on(port: u16, text: &str) {
    const PROMPT: &str = "127.0.0.1:6379> ";
    let mut steps: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        match (line.strip_prefix(PROMPT), steps.last_mut()) {
            (Some(cmd), _) => steps.push((cmd, Vec::new())),
            (None, Some((_, out))) => out.push(line),
            (None, None) => panic!("output before any command: {line:?}"),
        }
    }
    // (the transcript's, the actual)
    let mut tokens: Vec<(i64, i64)> = Vec::new();
    for (cmd, expected) in steps {
        let mut sent = cmd.to_string();
        for (w, h) in &tokens {
            sent = sent.replace(&w.to_string(), &h.to_string());
        }
        let got = redis_cli(port, &sent);
        let got: Vec<&str> = got.lines().collect();
        let show = || format!("{cmd}\n--- expected ---\n{expected:#?}\n--- got ---\n{got:#?}");
        assert_eq!(got.len(), expected.len(), "line count\n{}", show());
        for (want, have) in expected.iter().zip(&got) {
            if want == have {
                continue;
            }
            let split = |l: &str| {
                let at = l.find("(integer) ")?;
                let n: i64 = l[at + 10..].parse().ok()?;
                Some((l[..at].to_string(), n))
            };
            let (Some((wp, w)), Some((hp, h))) = (split(want), split(have)) else {
                panic!("{want:?} vs {have:?}\n{}", show());
            };
            assert_eq!(wp, hp, "{}", show());
            if w >= 1_000_000_000_000 {
                match tokens.iter().find(|(tw, _)| *tw == w) {
                    Some((_, th)) => assert_eq!(h, *th, "the same token\n{}", show()),
                    None => {
                        if let Some((_, last)) = tokens.last() {
                            assert!(h > *last, "tokens increase\n{}", show());
                        }
                        tokens.push((w, h));
                    }
                }
            } else if w >= 1000 {
                assert!((w - h).abs() <= 5000, "{w} vs {h}\n{}", show());
            } else {
                panic!("{want:?} vs {have:?}\n{}", show());
            }
        }
    }
}

/// What redis-cli prints for one command line (its quoting rules).
fn redis_cli(port: u16, line: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("redis-cli")
        .args(["--no-raw", "-h", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-cli (install redis-tools): {e}"));
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(format!("{line}\n").as_bytes())
        .expect("write the command");
    drop(stdin);
    let out = child.wait_with_output().expect("redis-cli output");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
