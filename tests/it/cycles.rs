//! No crate of the tree has an import circle among its modules: the
//! module's shell (`src/`), `lock-core`, the Rust package and the bench.
//! Each module's references to its siblings are read from its source
//! (`use crate::x`, `crate::x::…`, a grouped `use crate::{x, …}`, and
//! `super::x` outside inline modules); two modules that reach each other,
//! through any number of others, fail here with the circle named. The
//! modules are whatever `.rs` files each crate holds: none is listed here.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates' source folders and their root files (which declare the
/// modules, so are no module of their own).
const CRATES: [(&str, &str); 5] = [
    ("src", "lib.rs"),
    ("lock-core/src", "lib.rs"),
    ("lock-core/model/src", "lib.rs"),
    ("clients/rust/src", "lib.rs"),
    ("benches/lockbench", "main.rs"),
];

/// Module -> the sibling modules it refers to.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// Every `.rs` file below `dir`, with the module it belongs to: a file's
/// stem at the top, the first folder's name below it.
fn sources(dir: &Path, root: &str) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(dir).expect("below the crate's folder");
            if rel == Path::new(root) {
                continue;
            }
            let first = rel.components().next().expect("a file name");
            let module = Path::new(first.as_os_str())
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("a UTF-8 file name")
                .to_string();
            out.push((module, path));
        }
    }
    out
}

/// The text without `//` comments (a doc link is no import).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text with the bodies of inline modules (`mod tests { … }`, as
/// rustfmt lays them out) blanked: there `super::` is the file's own module.
fn outside_inline_modules(text: &str) -> String {
    let mut out = Vec::new();
    let mut closing: Option<String> = None;
    for line in text.lines() {
        if let Some(end) = &closing {
            if line == end {
                closing = None;
            }
            continue;
        }
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let decl = body
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        if decl.starts_with("mod ") && decl.ends_with('{') {
            closing = Some(format!("{indent}}}"));
            continue;
        }
        out.push(line);
    }
    out.join("\n")
}

/// The first identifier of `s`.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The names a path prefix (`crate::`, `super::`) leads to in `text`: the
/// name after it, or each name at the top of a `{…}` group after it.
fn after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(prefix) {
        let at = from + i;
        from = at + prefix.len();
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `my_crate::`, not `crate::`
        }
        let rest = &text[from..];
        if !rest.starts_with('{') {
            out.push(ident(rest).to_string());
            continue;
        }
        // A group: the first name of each top-level item.
        let mut depth = 0;
        let mut item_start = true;
        for (j, c) in rest.char_indices() {
            match c {
                '{' => {
                    depth += 1;
                    item_start = depth == 1;
                }
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => item_start = true,
                c if item_start && depth == 1 && !c.is_whitespace() => {
                    out.push(ident(&rest[j..]).to_string());
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    out.retain(|n| !n.is_empty());
    out
}

/// The sibling modules a module's source refers to.
fn references(text: &str) -> Vec<String> {
    let text = code(text);
    let mut names = after(&text, "crate::");
    names.extend(after(&outside_inline_modules(&text), "super::"));
    names
}

/// The crate in `dir`: its modules and their references to each other.
fn graph(dir: &Path, root: &str) -> Graph {
    let files = sources(dir, root);
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut g: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (module, path) in &files {
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for used in references(&text) {
            if used != *module && modules.contains(&used) {
                g.entry(module.clone()).or_default().insert(used);
            }
        }
    }
    g
}

/// The graph's strongly connected parts of two or more modules (Kosaraju).
fn tangles(g: &Graph) -> Vec<BTreeSet<String>> {
    fn finish<'a>(
        g: &'a Graph,
        m: &'a str,
        seen: &mut BTreeSet<&'a str>,
        order: &mut Vec<&'a str>,
    ) {
        if !seen.insert(m) {
            return;
        }
        for next in g.get(m).into_iter().flatten() {
            finish(g, next, seen, order);
        }
        order.push(m);
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for m in g.keys() {
        finish(g, m, &mut seen, &mut order);
    }
    let mut back: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, tos) in g {
        for to in tos {
            back.entry(to.as_str()).or_default().push(from.as_str());
        }
    }
    let mut placed = BTreeSet::new();
    let mut out = Vec::new();
    for &start in order.iter().rev() {
        if placed.contains(start) {
            continue;
        }
        let mut part = BTreeSet::new();
        let mut todo = vec![start];
        while let Some(m) = todo.pop() {
            if !placed.insert(m) {
                continue;
            }
            part.insert(m.to_string());
            todo.extend(back.get(m).into_iter().flatten().copied());
        }
        if part.len() > 1 {
            out.push(part);
        }
    }
    out
}

/// A shortest circle through the first module of `part`: `a -> b -> a`.
fn circle(g: &Graph, part: &BTreeSet<String>) -> String {
    let start = part.first().expect("a module");
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut todo = VecDeque::from([start.as_str()]);
    while let Some(m) = todo.pop_front() {
        for next in g.get(m).into_iter().flatten() {
            if !part.contains(next) {
                continue;
            }
            if next == start {
                let mut path = vec![start.as_str(), m];
                let mut at = m;
                while at != start {
                    at = came_from[at];
                    path.push(at);
                }
                path.reverse();
                return path.join(" -> ");
            }
            if !came_from.contains_key(next.as_str()) {
                came_from.insert(next, m);
                todo.push_back(next);
            }
        }
    }
    unreachable!("a strongly connected part has a circle through each module")
}

/// Every circle of `g`, one line each.
fn circles(g: &Graph) -> Vec<String> {
    let mut out: Vec<String> = tangles(g).iter().map(|part| circle(g, part)).collect();
    out.sort();
    out
}

#[test]
fn no_crate_has_an_import_circle() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut problems = Vec::new();
    for (dir, root) in CRATES {
        let g = graph(&top.join(dir), root);
        assert!(g.len() >= 2, "{dir}: only {} modules found", g.len());
        let edges: usize = g.values().map(BTreeSet::len).sum();
        assert!(edges > 0, "{dir}: no module refers to another");
        for c in circles(&g) {
            problems.push(format!("{dir}: {c}"));
        }
    }
    assert!(
        problems.is_empty(),
        "modules that import each other:\n{}",
        problems.join("\n")
    );
}

/// The reading: plain, inline and grouped paths, `super::` outside inline
/// modules only, comments and other crates' names left out.
#[test]
fn references_are_read_as_written() {
    let text = "\
use crate::store;
use crate::{
    args::{self, Parsed},
    Error, timers,
};
use super::stats::Percentiles;
use my_crate::ignored;
// use crate::commented;
fn f() { crate::clock::now(); }

#[cfg(test)]
mod tests {
    use super::own_item;
}
";
    assert_eq!(
        references(text),
        ["store", "args", "Error", "timers", "clock", "stats"]
    );
}

/// The check itself names a circle of any length, and passes a tree.
#[test]
fn a_circle_is_named() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let tree = graph(&[("a", "b"), ("a", "c"), ("b", "c"), ("c", "d")]);
    assert!(circles(&tree).is_empty());
    let two = graph(&[
        ("profile", "throughput"),
        ("throughput", "profile"),
        ("x", "profile"),
    ]);
    assert_eq!(circles(&two), ["profile -> throughput -> profile"]);
    let three = graph(&[
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("e", "f"),
        ("f", "e"),
    ]);
    assert_eq!(circles(&three), ["a -> b -> c -> a", "e -> f -> e"]);
}
