//! The guides (`docs/guide/*.md`) as the crate's documentation, versioned
//! with it: `volcano::guide` includes each page from `OUT_DIR`, where this
//! script writes it with two changes. Each `rust` block becomes a `no_run`
//! doctest: the lines the page shows, inside the `snippet_*` function of
//! `docs/snippets/` that holds them (found as `examples/tests/snippets.rs`
//! finds them), with the snippets' helpers, all hidden. And each link to
//! another guide points at its module; a link to any other file of the
//! repository, at that file in the release's tag. The testing guide
//! (`docs/testing.md`, `volcano::mock`'s page) is made the same way, and
//! the README's blocks become doctests (`ReadmeDoctests`, in doctest
//! builds only).
//!
//! The pages on GitHub stay as they are: one source. A block the snippets
//! do not hold (a page edited alone) is written `ignore` here, and the
//! snippets test fails.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// The guides, by file and module name (`src/lib.rs`, `pub mod guide`).
const GUIDES: [(&str, &str); 13] = [
    ("README.md", ""),
    ("jobs.md", "jobs"),
    ("leader.md", "leader"),
    ("semaphore.md", "semaphore"),
    ("observe.md", "observe"),
    ("ttl-and-clocks.md", "ttl_and_clocks"),
    ("fencing.md", "fencing"),
    ("outcomes.md", "outcomes"),
    ("waiting.md", "waiting"),
    ("cli.md", "cli"),
    ("tower.md", "tower"),
    ("observability.md", "observability"),
    ("tls-http.md", "tls_http"),
];

const REPOSITORY: &str = "https://github.com/volcano-locks/volcano";

fn main() {
    let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    for watched in [
        "docs/guide",
        "docs/snippets",
        "docs/testing.md",
        "README.md",
    ] {
        println!("cargo::rerun-if-changed={watched}");
    }
    let snippets = Snippets::read(&root.join("docs/snippets"));
    let tag = format!("v{}", env::var("CARGO_PKG_VERSION").expect("cargo sets it"));
    fs::create_dir_all(out.join("guide")).expect("OUT_DIR is writable");
    for (file, module) in GUIDES {
        let page = fs::read_to_string(root.join("docs/guide").join(file)).unwrap_or_default();
        let here: &[&str] = if module.is_empty() {
            &["guide"]
        } else {
            &["guide", module]
        };
        let page = links(&page, "docs/guide", here, &tag);
        let page = doctests(&page, &snippets);
        fs::write(out.join("guide").join(file), page).expect("OUT_DIR is writable");
    }
    let testing = fs::read_to_string(root.join("docs/testing.md")).unwrap_or_default();
    let testing = doctests(&links(&testing, "docs", &["mock"], &tag), &snippets);
    fs::write(out.join("testing.md"), testing).expect("OUT_DIR is writable");
    let readme = fs::read_to_string(root.join("README.md")).unwrap_or_default();
    fs::write(out.join("README.md"), doctests(&readme, &snippets)).expect("OUT_DIR is writable");
}

/// The snippets' sources: their lines, and the helpers every doctest
/// takes (`main.rs` up to its modules, without its own docs).
struct Snippets {
    lines: Vec<String>,
    helpers: Vec<String>,
}

impl Snippets {
    fn read(dir: &Path) -> Snippets {
        let mut lines = Vec::new();
        let mut helpers = Vec::new();
        let mut uses: Vec<String> = Vec::new();
        let Ok(entries) = fs::read_dir(dir) else {
            return Snippets { lines, helpers };
        };
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for path in files {
            let text = fs::read_to_string(&path).unwrap_or_default();
            let main = path.file_name().is_some_and(|n| n == "main.rs");
            for line in text.lines() {
                lines.push(line.to_owned());
                // Each file's top-level imports, once: the doctest is one
                // scope.
                if line.starts_with("use ") && line != "use super::*;" {
                    if !uses.iter().any(|u| u == line) {
                        uses.push(line.to_owned());
                    }
                    continue;
                }
                let module_file = line.starts_with("mod ") && line.ends_with(';');
                if main && !line.starts_with("//!") && !module_file {
                    if line.starts_with("fn main()") {
                        continue;
                    }
                    helpers.push(line.to_owned());
                }
            }
        }
        // The crate attribute first (rustdoc keeps it at the top).
        let (attrs, rest): (Vec<String>, Vec<String>) =
            helpers.into_iter().partition(|l| l.starts_with("#!["));
        let helpers = attrs.into_iter().chain(uses).chain(rest).collect();
        Snippets { lines, helpers }
    }

    /// The function of the snippets that holds `block` at one indentation:
    /// its lines before the block and after it.
    fn around(&self, block: &[&str]) -> Option<(Vec<String>, Vec<String>)> {
        let first = *block.first()?;
        let start = (0..self.lines.len()).find(|&i| {
            let Some(indent) = self.lines[i].strip_suffix(first) else {
                return false;
            };
            indent.chars().all(|c| c == ' ')
                && i + block.len() <= self.lines.len()
                && block.iter().enumerate().all(|(j, line)| {
                    let there = &self.lines[i + j];
                    if line.trim().is_empty() {
                        there.trim().is_empty()
                    } else {
                        there.strip_prefix(indent) == Some(*line)
                    }
                })
        })?;
        let head = (0..start).rev().find(|&i| {
            let line = &self.lines[i];
            line.starts_with("async fn ") || line.starts_with("fn ") || line.starts_with("mod ")
        })?;
        let end = start + block.len();
        let tail = (end..self.lines.len()).find(|&i| self.lines[i] == "}")?;
        Some((
            self.lines[head..start].to_vec(),
            self.lines[end..=tail].to_vec(),
        ))
    }
}

/// The page with each `rust` block (not `ignore`) made a `no_run` doctest
/// inside its snippet; one the snippets do not hold is made `ignore`.
fn doctests(page: &str, snippets: &Snippets) -> String {
    let mut out = String::with_capacity(page.len() * 2);
    let lines: Vec<&str> = page.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let info = line.trim_start().strip_prefix("```").map(str::trim);
        let Some(info) = info.filter(|info| info.split(',').next() == Some("rust")) else {
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        };
        let close = (i + 1..lines.len())
            .find(|&j| lines[j].trim_start().starts_with("```"))
            .unwrap_or(lines.len());
        let block = &lines[i + 1..close];
        if info.split(',').any(|tag| tag == "ignore") {
            out.push_str(line);
            out.push('\n');
            for l in block {
                out.push_str(l);
                out.push('\n');
            }
        } else {
            let indent = &line[..line.len() - line.trim_start().len()];
            let unindented: Vec<&str> = block
                .iter()
                .map(|l| l.strip_prefix(indent).unwrap_or(l))
                .collect();
            match snippets.around(&unindented) {
                Some((before, after)) => {
                    out.push_str(&format!("{indent}```rust,no_run\n"));
                    let hidden = |out: &mut String, l: &str| {
                        out.push_str(indent);
                        out.push('#');
                        if !l.is_empty() {
                            out.push(' ');
                            out.push_str(l);
                        }
                        out.push('\n');
                    };
                    for l in &snippets.helpers {
                        hidden(&mut out, l);
                    }
                    let text =
                        [before.join("\n"), unindented.join("\n"), after.join("\n")].join("\n");
                    for feature in ["tower", "mock"] {
                        let needs = match feature {
                            "tower" => text.contains("volcano::tower"),
                            _ => text.contains("volcano::mock") || text.contains("for_mock"),
                        };
                        if needs {
                            hidden(&mut out, &format!("#[cfg(feature = \"{feature}\")]"));
                        }
                    }
                    for l in &before {
                        hidden(&mut out, l);
                    }
                    for l in block {
                        out.push_str(l);
                        out.push('\n');
                    }
                    for l in &after {
                        hidden(&mut out, l);
                    }
                    // Items at the top, as in the snippets: rustdoc adds no
                    // `main` of its own around them.
                    hidden(&mut out, "fn main() {}");
                }
                None => {
                    out.push_str(&format!("{indent}```rust,ignore\n"));
                    for l in block {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
            }
        }
        if close < lines.len() {
            out.push_str(lines[close]);
            out.push('\n');
        }
        i = close + 1;
    }
    out
}

/// The page with its relative links made to work from its module (`here`,
/// its path below the crate's root: `["guide", "jobs"]`): another guide's
/// page is its module, the README the crate's root, the testing guide
/// `volcano::mock`'s page; any other file of the repository (`dir` is the
/// page's folder) is that file in the release's tag.
fn links(page: &str, dir: &str, here: &[&str], tag: &str) -> String {
    let mut out = String::with_capacity(page.len());
    let mut rest = page;
    while let Some(at) = rest.find("](") {
        let (before, after) = rest.split_at(at + 2);
        out.push_str(before);
        let end = after.find(')').unwrap_or(after.len());
        out.push_str(&link(&after[..end], dir, here, tag));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn link(target: &str, dir: &str, here: &[&str], tag: &str) -> String {
    if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
        return target.to_owned();
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, format!("#{anchor}")),
        None => (target, String::new()),
    };
    // The file's path from the repository's root.
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for segment in path.split('/') {
        match segment {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            other => parts.push(other),
        }
    }
    let file = parts.join("/");
    match module_of(&file) {
        Some(module) => {
            let mut href = "../".repeat(here.len());
            for part in &module {
                href.push_str(part);
                href.push('/');
            }
            format!("{href}index.html{anchor}")
        }
        None => format!("{REPOSITORY}/blob/{tag}/{file}{anchor}"),
    }
}

/// The module whose page a file of the repository is, if one is.
fn module_of(file: &str) -> Option<Vec<&'static str>> {
    match file {
        "README.md" => Some(vec![]),
        "docs/testing.md" => Some(vec!["mock"]),
        _ => {
            let name = file.strip_prefix("docs/guide/")?;
            let (_, module) = GUIDES.iter().find(|(f, _)| *f == name)?;
            Some(if module.is_empty() {
                vec!["guide"]
            } else {
                vec!["guide", module]
            })
        }
    }
}
