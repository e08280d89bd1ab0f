//! ARCHITECTURE.md's code map held to the tree: every file or folder it names exists, and its
//! table of which crate uses which is exactly what the crates' `Cargo.toml` files list. And
//! files one reader can hold: no source file's code runs past 800 lines unless its top says
//! why.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// The text of a `## ` section of ARCHITECTURE.md, up to the next one.
fn section(title: &str) -> String {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let start = text.find(&format!("\n## {title}\n")).unwrap_or_else(|| panic!("a section {title:?}"));
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |end| end + 3);
    rest[..end].to_owned()
}

/// The code spans of `text`.
fn spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether a code span names a file or folder: a relative path of plain characters ending in
/// `/` or a known extension.
fn names_a_path(span: &str) -> bool {
    let plain = !span.is_empty() && span.chars().all(|c| c.is_ascii_alphanumeric() || "._/-".contains(c));
    let extension = [".rs", ".sql", ".toml", ".sh", ".proto", ".template", ".md", ".json"];
    plain && !span.starts_with(['.', '/']) && (span.ends_with('/') || extension.iter().any(|ext| span.ends_with(ext)))
}

/// Every file and folder under `root`, as paths relative to it.
fn tree(root: &Path, prefix: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        let relative = prefix.join(&name);
        found.push(relative.clone());
        if entry.path().is_dir() {
            tree(&entry.path(), &relative, found);
        }
    }
}

/// The code map's bullets: each one's folder (from its first span, nested bullets under their
/// parent's) and the spans of its text, up to the next bullet.
fn bullets(map: &str) -> Vec<(String, Vec<String>)> {
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    let mut parents: Vec<(usize, String)> = Vec::new();
    for line in map.lines() {
        let depth = line.len() - line.trim_start().len();
        if let Some(item) = line.trim_start().strip_prefix("- `") {
            let head = item.split('`').next().unwrap_or_default().to_owned();
            parents.retain(|(parent, _)| *parent < depth);
            let folder = match parents.last() {
                Some((_, parent)) if head.ends_with('/') => format!("{parent}{head}"),
                Some((_, parent)) => parent.clone(),
                None => head.clone(),
            };
            if head.ends_with('/') {
                parents.push((depth, folder.clone()));
            }
            found.push((folder, Vec::new()));
        }
        let bullet = line.trim_start().starts_with("- `");
        if let Some((_, named)) = found.last_mut() {
            // A bullet's own head is its folder, not a path named under it.
            let spans = spans(line).into_iter().skip(usize::from(bullet));
            named.extend(spans.filter(|span| names_a_path(span)).map(str::to_owned));
        }
    }
    found
}

#[test]
fn every_path_the_code_map_names_exists() {
    let workspace = workspace();
    let map = section("Code map");
    let bullets = bullets(&map);
    assert!(bullets.len() >= 10, "the code map's bullets were read: {bullets:?}");
    let mut missing = Vec::new();
    let mut checked = 0;
    for (folder, named) in &bullets {
        let root = workspace.join(folder);
        assert!(root.is_dir(), "the code map's folder {folder} does not exist");
        for path in named {
            let wanted = Path::new(path.trim_end_matches('/'));
            // Under the bullet's folder (or its crate's `src/`), or a path from the
            // repository's root; a bare name from the root (`decide.rs`) would pass wherever
            // some file of that name exists, so it must be under the folder.
            let exists = root.join(wanted).exists()
                || root.join("src").join(wanted).exists()
                || (path.contains('/') && workspace.join(wanted).exists());
            if !exists {
                missing.push(format!("{path} (under {folder})"));
            }
            checked += 1;
        }
    }
    assert!(checked > 100, "the code map's paths were read: {checked}");
    assert!(missing.is_empty(), "the code map names paths that do not exist: {missing:?}");
}

/// The workspace crates' folders, by package name.
fn crates() -> BTreeMap<String, PathBuf> {
    let workspace = workspace();
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).expect("the workspace manifest");
    let members = manifest.split("members = [").nth(1).and_then(|rest| rest.split(']').next()).expect("members");
    members
        .split(',')
        .map(|member| member.trim().trim_matches('"'))
        .filter(|member| !member.is_empty())
        .map(|member| {
            let text = std::fs::read_to_string(workspace.join(member).join("Cargo.toml")).expect("a member manifest");
            let name = text
                .lines()
                .find_map(|line| line.strip_prefix("name = "))
                .map(|name| name.trim_matches('"').to_owned())
                .expect("a package name");
            (name, workspace.join(member))
        })
        .collect()
}

/// The workspace crates a manifest lists under `[dependencies]`.
fn uses(folder: &Path, crates: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let text = std::fs::read_to_string(folder.join("Cargo.toml")).expect("a manifest");
    let dependencies = text.split("\n[dependencies]\n").nth(1).unwrap_or_default();
    let dependencies = dependencies.split("\n[").next().unwrap_or_default();
    dependencies
        .lines()
        .filter_map(|line| line.split(['.', '=', ' ']).next())
        .filter(|name| crates.contains_key(*name))
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_code_maps_crate_table_is_what_the_manifests_list() {
    let crates = crates();
    assert!(crates.contains_key("domain") && crates.contains_key("query-service"), "{crates:?}");
    let map = section("Code map");
    let mut table: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in map.lines().map(str::trim).filter(|line| line.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let [name, used] = cells[..] else { panic!("a row of two cells: {line}") };
        let name = spans(name).first().map(|name| (*name).to_owned()).expect("a crate's name");
        table.insert(name, spans(used).into_iter().map(str::to_owned).collect());
    }
    let expected: BTreeSet<&String> = crates.keys().filter(|name| *name != "tests").collect();
    assert_eq!(table.keys().collect::<BTreeSet<_>>(), expected, "the table has a row for every crate but the tests'");
    for (name, used) in &table {
        assert_eq!(&uses(&crates[name], &crates), used, "what {name} uses, by its Cargo.toml");
    }
}

#[test]
fn the_checks_see_a_missing_path_and_a_wrong_edge() {
    let bullets = bullets("- `shared/` — crates\n  - `domain/` — `catalog.rs` and `gone.rs`\n- `tests/` — `a/`");
    assert_eq!(bullets[1], ("shared/domain/".to_owned(), vec!["catalog.rs".to_owned(), "gone.rs".to_owned()]));
    assert_eq!(bullets[2].0, "tests/");
    assert!(!workspace().join("shared/domain/src/gone.rs").exists());
    let crates = crates();
    assert!(!uses(&crates["filter"], &crates).contains("platform"), "filter uses nothing of ours");
    assert!(uses(&crates["query-service"], &crates).contains("reads"));
    assert!(!uses(&crates["projector"], &crates).contains("mail-parser"), "a crate of ours only");
}

/// ARCHITECTURE.md is a bird's-eye map one can read whole: the detail is in module docs.
const ARCHITECTURE_LINES: usize = 400;

#[test]
fn architecture_md_is_short_and_every_test_its_invariants_name_exists() {
    let text = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lines = text.lines().count();
    assert!(lines <= ARCHITECTURE_LINES, "ARCHITECTURE.md has {lines} lines (at most {ARCHITECTURE_LINES})");
    let invariants = section("Invariants");
    let mut named = 0;
    for span in spans(&invariants) {
        let is_name = |part: &str| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        // `module::test_name`: a test of the integration binary; a bare `test_name`: a unit test
        // the sentence names with its file, looked for in every source file.
        let (file, name) = match span.split_once("::") {
            Some((module, name))
                if is_name(module)
                    && is_name(name)
                    && workspace().join(format!("tests/tests/api/{module}.rs")).is_file() =>
            {
                (Some(workspace().join(format!("tests/tests/api/{module}.rs"))), name)
            }
            None if is_name(span) && span.contains('_') && span.len() > 20 => (None, span),
            _ => continue,
        };
        let wanted = format!("fn {name}()");
        let found = match file {
            Some(file) => std::fs::read_to_string(&file).unwrap_or_default().contains(&wanted),
            None => {
                let mut files = Vec::new();
                for folder in ["shared", "command-service", "query-service", "projector"] {
                    tree(&workspace().join(folder), Path::new(folder), &mut files);
                }
                files
                    .iter()
                    .filter(|file| file.extension().is_some_and(|extension| extension == "rs"))
                    .any(|file| std::fs::read_to_string(workspace().join(file)).unwrap_or_default().contains(&wanted))
            }
        };
        assert!(found, "ARCHITECTURE.md's invariants name {span}, which is no test");
        named += 1;
    }
    assert!(named >= 20, "the invariants' tests were read: {named}");
}

/// Lines of code a source file may hold (its unit tests not counted) without saying why.
const LONGEST: usize = 800;

/// What a longer file's top says (in its first 20 lines): `Long because …`.
const LONG_BECAUSE: &str = "Long because";

/// The lines of `text` before its unit tests.
fn code_lines(text: &str) -> usize {
    text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default().lines().count()
}

#[test]
fn no_source_file_runs_past_800_lines_of_code_unless_its_top_says_why() {
    let workspace = workspace();
    let mut files = Vec::new();
    for folder in ["shared", "command-service", "query-service", "projector", "deploy"] {
        tree(&workspace.join(folder), Path::new(folder), &mut files);
    }
    let sources: Vec<&PathBuf> = files
        .iter()
        .filter(|file| file.extension().is_some_and(|extension| extension == "rs"))
        .filter(|file| file.file_name().is_some_and(|name| name != "tests.rs"))
        .collect();
    assert!(sources.len() > 200, "the tree was read: {} files", sources.len());
    let mut long = Vec::new();
    for file in sources {
        let text = std::fs::read_to_string(workspace.join(file)).expect("a source file");
        let lines = code_lines(&text);
        let says_why = text.lines().take(20).any(|line| line.contains(LONG_BECAUSE));
        if lines > LONGEST && !says_why {
            long.push(format!("{} ({lines} lines)", file.display()));
        }
    }
    assert!(long.is_empty(), "files past {LONGEST} lines of code whose top does not say why: {long:?}");
}

#[test]
fn a_files_code_is_counted_without_its_unit_tests() {
    let text = "fn a() {}\nfn b() {}\n#[cfg(test)]\nmod tests {\n    fn c() {}\n}\n";
    assert_eq!(code_lines(text), 2);
    assert_eq!(code_lines("fn a() {}\n"), 1);
}
