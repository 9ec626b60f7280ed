//! The shell's layers only look down (docs/design.md, "Layers"): `src/` is a
//! few folders, lowest first, and a folder's files use only files of the
//! folders below it or of lower lines of their own folder. Every file of
//! `src/` is in the table there. A change that adds an import upwards,
//! between folders or inside one, or a file nobody placed, fails here.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// Where a file sits: its folder's rank (lowest first) and its line in
/// the folder.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Place {
    folder: usize,
    line: usize,
}

/// The table: `folder/file` (`./file` at the top) -> its place, and the
/// folders in order.
struct Layers {
    places: HashMap<String, Place>,
    folders: Vec<String>,
}

fn parse(table: &str) -> Layers {
    let mut places = HashMap::new();
    let mut folders: Vec<String> = Vec::new();
    for line in table.lines() {
        let line = line.trim();
        if let Some(folder) = line.strip_suffix('/') {
            if !folder.is_empty() && !folder.contains(' ') {
                folders.push(folder.to_string());
            }
            continue;
        }
        let Some((n, names)) = line.split_once(':') else {
            continue;
        };
        let Ok(n) = n.trim().parse::<usize>() else {
            continue;
        };
        let folder = folders
            .len()
            .checked_sub(1)
            .expect("a line before any folder");
        for name in names.split_whitespace() {
            let key = format!("{}/{name}", folders[folder]);
            let place = Place { folder, line: n };
            assert!(
                places.insert(key.clone(), place).is_none(),
                "{key} listed twice"
            );
        }
    }
    assert!(!places.is_empty(), "no layer found");
    Layers { places, folders }
}

fn layers() -> Layers {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let start = design
        .find("<!-- layers")
        .expect("the layers table in docs/design.md");
    let end = design
        .find("<!-- /layers -->")
        .expect("the end of the layers table");
    parse(&design[start..end])
}

/// The files `text` uses, as `folder/file`: `crate::folder::file` anywhere,
/// or `crate::file` for a file at the top (`./file`). A grouped
/// `use crate::{...}` or `use crate::folder::{...}` is refused, and so is a
/// folder used as a whole, so that every use is seen.
fn uses(text: &str, folders: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let first = word(rest);
        assert!(!first.is_empty(), "use one `use crate::x` line per module");
        if folders.contains(&first) {
            let after = &rest[first.len()..];
            let second = after.strip_prefix("::").map(word).unwrap_or_default();
            assert!(
                !second.is_empty(),
                "name a file of `{first}`: one `use crate::{first}::x` line per file"
            );
            out.push(format!("{first}/{second}"));
        } else {
            out.push(format!("./{first}"));
        }
    }
    out
}

/// What is wrong with `files` (`folder/file` -> text) against `layers`.
fn problems(layers: &Layers, files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (module, text) in files {
        let Some(&mine) = layers.places.get(module) else {
            out.push(format!("src/{module}.rs is in no layer of docs/design.md"));
            continue;
        };
        for used in uses(text, &layers.folders) {
            if used == *module {
                continue;
            }
            match layers.places.get(&used) {
                Some(theirs) if theirs.folder < mine.folder => {}
                Some(theirs) if theirs.folder == mine.folder && theirs.line < mine.line => {}
                Some(theirs) if theirs.folder > mine.folder => out.push(format!(
                    "{module} (folder {}) uses {used} (folder {}, above it)",
                    layers.folders[mine.folder], layers.folders[theirs.folder]
                )),
                Some(theirs) => out.push(format!(
                    "{module} (line {}) uses {used} (line {} of the same folder)",
                    mine.line, theirs.line
                )),
                None => out.push(format!("{module} uses {used}, which is in no layer")),
            }
        }
    }
    out
}

/// Every `.rs` file of `src/` as `folder/file` (a folder's `mod.rs`, which
/// only lists its files, is left out).
fn sources(src: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(src).expect("src/").flatten() {
        let path = entry.path();
        let (folder, files) = if path.is_dir() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let files: Vec<_> = fs::read_dir(&path).expect("a folder").flatten().collect();
            (name, files.into_iter().map(|e| e.path()).collect())
        } else {
            (".".to_string(), vec![path])
        };
        for file in files {
            if file.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
            if stem == "mod" && folder != "." {
                let text = fs::read_to_string(&file).unwrap();
                assert!(
                    !text.contains("crate::") && !text.contains("fn "),
                    "src/{folder}/mod.rs should only list its files"
                );
                continue;
            }
            let text = fs::read_to_string(&file).unwrap();
            out.push((format!("{folder}/{stem}"), text));
        }
    }
    out
}

#[test]
fn every_module_uses_only_lower_layers() {
    let layers = layers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = sources(&src);
    let mut problems = problems(&layers, &files);
    for name in layers.places.keys() {
        if !src.join(format!("{name}.rs")).exists() {
            problems.push(format!(
                "docs/design.md lists {name}, but src/{name}.rs does not exist"
            ));
        }
    }
    assert!(files.len() > 10, "only {} modules found", files.len());
    assert!(
        layers.folders.len() <= 7,
        "src/ in at most six folders (and the top)"
    );
    assert!(
        problems.is_empty(),
        "layers broken:\n{}",
        problems.join("\n")
    );
}

/// The check itself catches an upward use, between folders and inside
/// one, on a planted file.
#[test]
fn an_upward_use_is_caught() {
    let layers = parse("low/\n0: a\n1: b\nhigh/\n0: c\n./\n0: top\n");
    let found = uses(
        "use crate::low::a;\nfn f() { crate::high::c::g(); crate::top::h(); }",
        &layers.folders,
    );
    assert_eq!(found, ["low/a", "high/c", "./top"]);
    let planted = |module: &str, text: &str| problems(&layers, &[(module.into(), text.into())]);
    // Down between folders and inside one: fine.
    assert!(planted("high/c", "use crate::low::b;").is_empty());
    assert!(planted("low/b", "use crate::low::a;").is_empty());
    // Up between folders, up inside one, and sideways: each caught.
    let up = planted("low/b", "use crate::high::c;");
    assert!(up[0].contains("above it"), "{up:?}");
    let inside = planted("low/a", "use crate::low::b;");
    assert!(inside[0].contains("same folder"), "{inside:?}");
    assert_eq!(planted("low/a", "use crate::top;").len(), 1);
    assert_eq!(planted("nowhere/x", "").len(), 1);
    // The real tree with a planted upward import between folders fails.
    let real = self::layers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = sources(&src);
    let keys = files.iter_mut().find(|(m, _)| m == "state/keys").unwrap();
    keys.1.push_str("\nuse crate::commands::lock;\n");
    let found = problems(&real, &files);
    assert_eq!(
        found,
        ["state/keys (folder state) uses commands/lock (folder commands, above it)"]
    );
}
