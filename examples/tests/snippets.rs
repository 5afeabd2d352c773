//! Every `rust` code block of the README and the guides compiles: each one
//! must appear verbatim (once its common indentation is removed) in the
//! `snippets` example (`docs/snippets/`), which `cargo test` and clippy
//! build. A block edited on
//! the page alone, or one whose code no longer compiles, fails here or
//! there. Blocks marked `ignore` are exempt; the README and the guides
//! have one (docs/guide/fencing.md's sqlx block, whose calls are
//! volcano-fence's first doctest, in fence/src/lib.rs), and `.ci/agree`
//! lists it with its reason. The SDK's build script makes each block a
//! doctest inside its snippet (`volcano::guide`).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `rust` blocks of a markdown page, with the line each starts on.
fn rust_blocks(page: &str) -> Vec<(usize, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, Vec<String>)> = None;
    for (n, line) in page.lines().enumerate() {
        let fence = line.trim_start();
        match current.take() {
            None if fence.starts_with("```") => {
                let info = fence.trim_start_matches('`').trim();
                let is_rust = info.split(',').next() == Some("rust");
                // Another language, or an ignored block: line 0, skipped to
                // its closing fence.
                let start = if is_rust && !info.split(',').any(|tag| tag == "ignore") {
                    n + 1
                } else {
                    0
                };
                current = Some((start, Vec::new()));
            }
            None => {}
            // A skipped block (line 0) ends here too, unrecorded.
            Some(block) if fence.starts_with("```") && block.0 != 0 => blocks.push(block),
            Some(_) if fence.starts_with("```") => {}
            Some((start, mut lines)) => {
                lines.push(line.to_owned());
                current = Some((start, lines));
            }
        }
    }
    blocks
}

/// Whether `block` is a run of `source`'s lines at one indentation.
fn contains(source: &[&str], block: &[String]) -> bool {
    let first = block[0].as_str();
    (0..source.len()).any(|i| {
        let Some(indent) = source[i].strip_suffix(first) else {
            return false;
        };
        if !indent.chars().all(|c| c == ' ') || i + block.len() > source.len() {
            return false;
        }
        block.iter().enumerate().all(|(j, line)| {
            let there = source[i + j];
            if line.trim().is_empty() {
                there.trim().is_empty()
            } else {
                there.strip_prefix(indent) == Some(line.as_str())
            }
        })
    })
}

#[test]
fn every_rust_block_of_the_readme_guides_and_testing_guide_is_compiled() {
    let root = root();
    let mut source = String::new();
    for entry in std::fs::read_dir(root.join("docs/snippets")).unwrap() {
        source += &std::fs::read_to_string(entry.unwrap().path()).unwrap();
        source.push('\n');
    }
    let source: Vec<&str> = source.lines().collect();
    let mut pages = vec![root.join("README.md")];
    let mut guides: Vec<PathBuf> = std::fs::read_dir(root.join("docs/guide"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    guides.sort();
    pages.extend(guides);
    pages.push(root.join("docs/testing.md"));

    let mut checked = 0;
    let mut missing = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for (line, block) in rust_blocks(&text) {
            checked += 1;
            if block.is_empty() || !contains(&source, &block) {
                missing.push(format!("{}:{line}", page.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "these rust blocks are not in docs/snippets/ as written: {missing:?}"
    );
    // The README alone has ten: a parser that found none would pass anything.
    assert!(checked >= 10, "only {checked} rust blocks found");
}

#[test]
fn the_check_finds_an_edited_block() {
    let source = ["fn f() {", "    let a = 1;", "    let b = 2;", "}"];
    let block = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    assert!(contains(&source, &block(&["let a = 1;", "let b = 2;"])));
    assert!(!contains(&source, &block(&["let a = 1;", "let b = 3;"])));
    let page = "text\n```rust\nlet a = 1;\n```\n```sh\nls\n```\n```rust,ignore\nx\n```\n";
    let blocks = rust_blocks(page);
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].1, vec!["let a = 1;".to_owned()]);
}

/// The testing guide's complete test, "A 503 in the middle of a job", is
/// `tests/testing_guide.rs`, verbatim: it runs as the guide shows it.
#[test]
fn the_testing_guides_recipe_is_a_test() {
    let root = root();
    let guide = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let recipe = &guide[guide.find("### A 503 in the middle of a job").unwrap()..];
    let start = recipe.find("```rust\n").unwrap() + "```rust\n".len();
    let block: Vec<String> = recipe[start..]
        .lines()
        .take_while(|line| !line.starts_with("```"))
        .map(str::to_owned)
        .collect();
    assert!(block.len() > 20, "the recipe was not found whole");
    let test = std::fs::read_to_string(root.join("tests/testing_guide.rs")).unwrap();
    let test: Vec<&str> = test.lines().collect();
    assert!(
        contains(&test, &block),
        "docs/testing.md's 503 recipe differs from tests/testing_guide.rs"
    );
}
