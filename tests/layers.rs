//! The shell's layers only look down (docs/design.md, "Layers"): every
//! module of `src/` is in the table there, and uses only modules of lower
//! layers. A change that adds an import upwards, or a module nobody placed,
//! fails here.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

fn layers() -> HashMap<String, usize> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let design = fs::read_to_string(root.join("docs/design.md")).expect("docs/design.md");
    let start = design
        .find("<!-- layers")
        .expect("the layers table in docs/design.md");
    let end = design
        .find("<!-- /layers -->")
        .expect("the end of the layers table");
    let mut map = HashMap::new();
    for line in design[start..end].lines() {
        let Some((n, names)) = line.split_once(':') else {
            continue;
        };
        let Ok(n) = n.trim().parse::<usize>() else {
            continue;
        };
        for name in names.split_whitespace() {
            assert!(
                map.insert(name.to_string(), n).is_none(),
                "{name} listed twice"
            );
        }
    }
    assert!(!map.is_empty(), "no layer found in docs/design.md");
    map
}

/// The crate modules `text` uses: `crate::name` anywhere (a grouped
/// `use crate::{...}` is refused, so that every use is seen).
fn uses(text: &str) -> Vec<String> {
    assert!(
        !text.contains("crate::{"),
        "use one `use crate::x` line per module"
    );
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

#[test]
fn every_module_uses_only_lower_layers() {
    let layers = layers();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut problems = Vec::new();
    let mut seen = 0;
    for entry in fs::read_dir(&src).expect("src/") {
        let path = entry.expect("a file").path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let module = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap()
            .to_string();
        let Some(&mine) = layers.get(&module) else {
            problems.push(format!("src/{module}.rs is in no layer of docs/design.md"));
            continue;
        };
        seen += 1;
        let text = fs::read_to_string(&path).unwrap();
        for used in uses(&text) {
            if used == module {
                continue;
            }
            match layers.get(&used) {
                Some(&theirs) if theirs < mine => {}
                Some(&theirs) => problems.push(format!(
                    "{module} (layer {mine}) uses {used} (layer {theirs})"
                )),
                None => problems.push(format!("{module} uses {used}, which is in no layer")),
            }
        }
    }
    for name in layers.keys() {
        if !src.join(format!("{name}.rs")).exists() {
            problems.push(format!(
                "docs/design.md lists {name}, but src/{name}.rs does not exist"
            ));
        }
    }
    assert!(seen > 10, "only {seen} modules found");
    assert!(
        problems.is_empty(),
        "layers broken:\n{}",
        problems.join("\n")
    );
}

/// The check itself catches an upward use.
#[test]
fn an_upward_use_is_caught() {
    let found = uses("use crate::store;\nfn f() { crate::timers::len(); }");
    assert_eq!(found, vec!["store".to_string(), "timers".to_string()]);
}
