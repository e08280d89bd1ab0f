//! What Cargo cannot hold: no two source files of a crate import each other, directly or
//! through others. (Which crate may use which is each crate's `Cargo.toml`; which file of a
//! capability may know HTTP or do IO, each service's own test.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every library crate of the workspace, by its source folder.
const CRATES: &[&str] = &[
    "shared/platform/src",
    "shared/filter/src",
    "shared/domain/src",
    "shared/reads/src",
    "shared/ai-provider/src",
    "shared/import-file/src",
    "shared/mail/src",
    "shared/api/src",
    "command-service/src",
    "query-service/src",
    "projector/src",
];

type Module = Vec<String>;

fn sources(folder: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(folder).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// The module a file is: `records/http.rs` is `records::http`, `records/mod.rs` is `records`.
fn module_of(root: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(root).expect("under the root").with_extension("");
    let mut parts: Module = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|last| ["lib", "main", "mod"].contains(&last.as_str())) {
        parts.pop();
    }
    parts
}

/// The source without its unit tests and line comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// The paths a source names after `crate::`, `super::` or `self::`, as (anchor, segments).
fn paths(code: &str) -> Vec<(&str, Vec<&str>)> {
    let mut found = Vec::new();
    for anchor in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(anchor) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + anchor.len()..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let segments = rest[..end].split("::").filter(|segment| !segment.is_empty()).collect();
            found.push((anchor.trim_end_matches(':'), segments));
        }
    }
    found
}

/// The file-level import graph of one crate: which module files each module file names.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let modules: BTreeMap<Module, PathBuf> = files.iter().map(|file| (module_of(root, file), file.clone())).collect();
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).expect("a source file");
        let mut targets = BTreeSet::new();
        for (anchor, segments) in paths(&code(&text)) {
            let mut at: Module = match anchor {
                "crate" => Vec::new(),
                // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` (module `a::b`) also `a`.
                "super" => module[..module.len().saturating_sub(1)].to_vec(),
                // `self` of `a/b.rs` and of `a/b/mod.rs` is `a::b`.
                _ => module.clone(),
            };
            let mut target = None;
            for segment in segments {
                if segment == "super" {
                    at.pop();
                    continue;
                }
                let mut candidate = at.clone();
                candidate.push(segment.to_owned());
                if !modules.contains_key(&candidate) {
                    break;
                }
                at = candidate;
                target = Some(at.clone());
            }
            // A module naming its own folder's parents is structure, not an import cycle.
            if let Some(target) = target.filter(|target| target != module && !module.starts_with(target)) {
                targets.insert(target);
            }
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

/// The modules on a cycle, if any: a path back to a module from itself.
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    for start in graph.keys() {
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((module, path)) = stack.pop() {
            for next in graph.get(&module).into_iter().flatten() {
                if next == start {
                    return Some(path.clone());
                }
                if seen.insert(next.clone()) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push((next.clone(), longer));
                }
            }
        }
    }
    None
}

#[test]
fn no_two_files_of_a_crate_import_each_other() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    for folder in CRATES {
        let graph = graph(&workspace.join(folder));
        assert!(!graph.is_empty(), "{folder} was not read");
        if let Some(cycle) = cycle(&graph) {
            let named: Vec<String> = cycle.iter().map(|module| module.join("::")).collect();
            panic!("{folder}: an import cycle between files: {}", named.join(" -> "));
        }
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let module = |name: &str| vec![name.to_owned()];
    let mut graph = BTreeMap::new();
    graph.insert(module("pipeline"), BTreeSet::from([module("templates")]));
    graph.insert(module("templates"), BTreeSet::from([module("records")]));
    graph.insert(module("records"), BTreeSet::from([module("pipeline")]));
    graph.insert(module("edge"), BTreeSet::new());
    assert!(cycle(&graph).is_some());
    graph.insert(module("records"), BTreeSet::from([module("edge")]));
    assert_eq!(cycle(&graph), None);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").join("command-service/src");
    let paths = paths("use crate::records::write::{Write};\nlet x = super::store::load(a);");
    assert_eq!(paths[0], ("crate", vec!["records", "write"]));
    assert_eq!(paths[1], ("super", vec!["store", "load"]));
    assert_eq!(module_of(&root, &root.join("records/mod.rs")), module("records"));
}

/// The crates a package links (normal dependencies, its own features only), by name, as
/// `cargo tree` resolves them from the lock file.
fn linked(package: &str) -> BTreeSet<String> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "-p", package])
        .current_dir(workspace)
        .output()
        .expect("cargo tree runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// `domain` is the rules: no runtime, database, HTTP client, randomness, file format or bot
/// list in its manifest (the reads are `reads`', the AI provider `ai-provider`'s, an import
/// file's reading `import-file`'s, a hit's request signals the command service's). And the
/// query service, which answers GETs, links none of what only writes and workers use.
#[test]
fn domain_holds_rules_only_and_the_query_service_links_no_client_file_reader_or_bot_list() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let manifest = std::fs::read_to_string(workspace.join("shared/domain/Cargo.toml")).expect("domain's manifest");
    let dependencies = manifest.split("[dependencies]").nth(1).expect("a dependencies table");
    let dependencies = dependencies.split("\n[").next().unwrap_or_default();
    let named: BTreeSet<&str> = dependencies
        .lines()
        .filter_map(|line| line.split(['=', '.']).next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(named.contains("serde_json"), "the manifest was read: {named:?}");
    for crate_name in
        ["tokio", "tokio-postgres", "deadpool-postgres", "reqwest", "actix-web", "rand", "csv", "encoding_rs", "isbot"]
    {
        assert!(!named.contains(crate_name), "domain depends on {crate_name}");
    }
    let query_service = linked("query-service");
    assert!(query_service.contains("actix-web"), "the tree was read: {} crates", query_service.len());
    for crate_name in ["reqwest", "csv", "isbot", "indicatif", "ai-provider", "import-file"] {
        assert!(!query_service.contains(crate_name), "the query service links {crate_name}");
    }
    assert!(linked("command-service").contains("isbot"), "the check can see a crate that is linked");
}

/// The workspace denies `unsafe` (rather than forbidding it) for one reviewed exception: the
/// allocator tunable set at process start. Any other `unsafe` fails here, in every crate,
/// binary and test of the workspace.
#[test]
fn unsafe_code_is_allowed_in_one_place_only() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut files = Vec::new();
    for folder in ["shared", "command-service", "query-service", "projector", "deploy", "tests"] {
        sources(&workspace.join(folder), &mut files);
    }
    assert!(files.len() > 100, "the tree was read: {} files", files.len());
    let mut allowed = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let count = text.matches(&["allow(", "unsafe_code)"].concat()).count();
        if count > 0 {
            allowed.push((file.strip_prefix(workspace).expect("in the workspace").display().to_string(), count));
        }
    }
    assert_eq!(allowed, [("shared/platform/src/process.rs".to_owned(), 1)], "where unsafe code is allowed");
}
