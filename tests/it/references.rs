//! Comments and docs/design.md send readers to code by name: `store::update`,
//! `waiting::settle`. A name that no longer exists sends them nowhere. Every
//! `module::item` reference in backticks, in the comments of the module
//! shell (src/) and of lock-core, and in docs/design.md, must name a module
//! that exists and an item defined in it; every backticked `f()`, a
//! function defined somewhere in either.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::Path;

/// Every `.rs` file under `dir` (recursively): path and text.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).expect("source dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = fs::read_to_string(&path).expect("source");
                out.push((path.display().to_string(), text));
            }
        }
    }
    out
}

/// The names a file defines: functions, types, traits, constants, statics,
/// modules, macros, enum variants and struct fields (a word followed by
/// `(`, `{`, `,` or `:` at the start of a line counts: generous on purpose,
/// the test is after names that are gone).
fn defined(text: &str) -> HashSet<String> {
    const KEYWORDS: [&str; 9] = [
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "const ",
        "static ",
        "type ",
        "mod ",
        "macro_rules! ",
    ];
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = HashSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        for kw in KEYWORDS {
            let mut rest = line;
            while let Some(i) = rest.find(kw) {
                let before = rest[..i].chars().last();
                rest = &rest[i + kw.len()..];
                if before.is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_') {
                    let name = ident(rest);
                    if !name.is_empty() {
                        names.insert(name);
                    }
                }
            }
        }
        let line = line.strip_prefix("pub ").unwrap_or(line);
        let line = line.strip_prefix("pub(crate) ").unwrap_or(line);
        let name = ident(line);
        if !name.is_empty() && line[name.len()..].starts_with(['(', '{', ',', ':', ' ']) {
            names.insert(name);
        }
    }
    names
}

/// The backticked `a::b` references in `text` (only in comments, for Rust).
fn references(text: &str, rust: bool) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let prose = match rust {
            true => match line.find("//") {
                Some(i) => &line[i..],
                None => continue,
            },
            false => line,
        };
        let mut parts = prose.split('`');
        parts.next();
        while let Some(code) = parts.next() {
            // `a::b`, or `f()`: a call of a function by its bare name.
            let call = code.ends_with("()");
            let path = code.trim_end_matches("()");
            let well_formed = (path.contains("::") || call)
                && path.split("::").all(|s| {
                    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                });
            if well_formed {
                out.push((n + 1, path.to_string()));
            }
            parts.next();
        }
    }
    out
}

#[test]
fn every_named_module_and_item_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shell = sources(&root.join("src"));
    let core = sources(&root.join("lock-core/src"));
    let module_of = |path: &str| -> String {
        Path::new(path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    // Module name -> what it defines; the core's modules under their own
    // names and, all together, as `lock_core` / `crate` (inside the core).
    let mut modules: HashMap<String, HashSet<String>> = HashMap::new();
    let mut whole_core = HashSet::new();
    for (path, text) in &core {
        let names = defined(text);
        whole_core.extend(names.iter().cloned());
        modules.entry(module_of(path)).or_default().extend(names);
    }
    let mut shell_modules: HashMap<String, HashSet<String>> = HashMap::new();
    for (path, text) in &shell {
        shell_modules.insert(module_of(path), defined(text));
    }
    let mut missing = Vec::new();
    let mut check = |file: &str, line: usize, path: &str, in_core: bool| {
        let segments: Vec<&str> = path.split("::").collect();
        let (first, last) = (segments[0], segments[segments.len() - 1]);
        if segments.len() == 1 {
            let known = whole_core.contains(first)
                || shell_modules.values().any(|names| names.contains(first));
            if !known {
                missing.push(format!("{file}:{line}: `{path}()` (not found)"));
            }
            return;
        }
        let scope = match first {
            "lock_core" => Some(&whole_core),
            "crate" if in_core => Some(&whole_core),
            name if !in_core && shell_modules.contains_key(name) => shell_modules.get(name),
            name if modules.contains_key(name) => modules.get(name),
            // Another crate's (std, redis_module, ...): not ours to check.
            _ => None,
        };
        if let Some(names) = scope {
            // Every segment after the module must be defined in it (a type,
            // then its method or variant).
            let gone: Vec<&&str> = segments[1..]
                .iter()
                .filter(|s| !names.contains(**s))
                .collect();
            if !gone.is_empty() {
                missing.push(format!("{file}:{line}: `{path}` ({last} not found)"));
            }
        }
    };
    for (path, text) in &shell {
        for (line, reference) in references(text, true) {
            check(path, line, &reference, false);
        }
    }
    for (path, text) in &core {
        for (line, reference) in references(text, true) {
            check(path, line, &reference, true);
        }
    }
    let design = fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    for (line, reference) in references(&design, false) {
        check("docs/design.md", line, &reference, false);
    }
    assert!(
        missing.is_empty(),
        "references to code that does not exist:\n{}",
        missing.join("\n")
    );
}
