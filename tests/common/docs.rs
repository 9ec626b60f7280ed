//! The code blocks of the project's Markdown, for tests that run the docs'
//! examples.

use std::path::Path;

/// The Markdown file at `path` under the repository.
pub fn markdown(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
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
