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
    "shared/journeys/src",
    "shared/api/src",
    "command-service/src",
    "query-service/src",
    "projector/src",
];

type Module = Vec<String>;

/// Every `.rs` file under `folder`.
pub(crate) fn sources(folder: &Path, found: &mut Vec<PathBuf>) {
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

/// A path a file names, from its anchor: `crate`, `super`, `self`, or, first, a name the
/// file's own module resolves (a child module in a `use`; otherwise another crate).
type Named = Vec<String>;

/// The paths a source names inline after `crate::`, `super::` or `self::` (a call, a type),
/// each with its anchor as the first segment.
fn paths(code: &str) -> Vec<Named> {
    let mut found = Vec::new();
    for anchor in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(anchor) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + anchor.len()..];
            let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).unwrap_or(rest.len());
            let mut path = vec![anchor.trim_end_matches(':').to_owned()];
            path.extend(rest[..end].split("::").filter(|segment| !segment.is_empty()).map(str::to_owned));
            found.push(path);
        }
    }
    found
}

/// One leaf of a `use` declaration: its whole path (the anchor first, as written), the name it
/// binds (`None` for a glob), and whether it is a re-export (`pub`, `pub(crate)`, ...).
#[derive(Debug, PartialEq)]
struct Use {
    public: bool,
    path: Named,
    bound: Option<String>,
}

/// Every leaf of every `use` declaration of `code`, its brace groups expanded:
/// `use crate::{a, b::{c, d as e}};` names `crate::a`, `crate::b::c` and `crate::b::d` (bound
/// as `e`).
fn uses(code: &str) -> Vec<Use> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("use") {
        let before = code[..at].chars().next_back();
        let after = code[at + 3..].chars().next();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '"')
            || !after.is_some_and(char::is_whitespace)
        {
            continue;
        }
        let Some(length) = code[at..].find(';') else { continue };
        let head = code[..at].trim_end();
        let public = head.ends_with("pub")
            || head
                .strip_suffix(')')
                .and_then(|head| head.rsplit_once('('))
                .is_some_and(|(head, _)| head.trim_end().ends_with("pub"));
        // A declaration starts an item or a statement (after an attribute, a visibility, a
        // block or another item); `use` anywhere else is a word of a string.
        if !(public || head.is_empty() || head.ends_with([';', '{', '}', ']'])) {
            continue;
        }
        let tokens = tokens(&code[at + 3..at + length]);
        let mut leaves = Vec::new();
        tree(&tokens, 0, Vec::new(), &mut leaves);
        found.extend(leaves.into_iter().map(|(path, bound)| Use { public, path, bound }));
    }
    found
}

/// The tokens of a use tree: names, `::`, braces, commas and `*`.
fn tokens(text: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut name = c.to_string();
            while let Some(&next) = chars.peek().filter(|next| next.is_alphanumeric() || **next == '_') {
                name.push(next);
                chars.next();
            }
            tokens.push(name);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            tokens.push("::".to_owned());
        } else if "{},*".contains(c) {
            tokens.push(c.to_string());
        }
    }
    tokens
}

/// Expands the use tree at `tokens[at..]` under `prefix` into `leaves`; returns where it ends.
fn tree(tokens: &[String], mut at: usize, mut path: Named, leaves: &mut Vec<(Named, Option<String>)>) -> usize {
    while let Some(token) = tokens.get(at) {
        match token.as_str() {
            "{" => {
                at += 1;
                while let Some(token) = tokens.get(at) {
                    match token.as_str() {
                        "}" => return at + 1,
                        "," => at += 1,
                        _ => at = tree(tokens, at, path.clone(), leaves),
                    }
                }
                return at;
            }
            "*" => {
                leaves.push((path, None));
                return at + 1;
            }
            "::" => at += 1,
            "}" | "," => break,
            name => {
                path.push(name.to_owned());
                at += 1;
                if tokens.get(at).is_some_and(|next| next == "::") {
                    continue;
                }
                let mut bound = path.iter().rev().find(|segment| *segment != "self").cloned();
                if tokens.get(at).is_some_and(|next| next == "as") {
                    bound = tokens.get(at + 1).cloned();
                    at += 2;
                }
                leaves.push((path, bound));
                return at;
            }
        }
    }
    at
}

/// What the import graph reads of one module file: the paths it names, and what it re-exports
/// (a bound name, and the path it names).
struct Source {
    named: Vec<Named>,
    reexports: BTreeMap<String, Named>,
}

impl Source {
    fn read(text: &str) -> Self {
        let code = code(text);
        let uses = uses(&code);
        let reexports = uses
            .iter()
            .filter(|found| found.public)
            .filter_map(|found| found.bound.clone().map(|bound| (bound, found.path.clone())))
            .collect();
        let mut named: Vec<Named> = uses.into_iter().map(|found| found.path).collect();
        named.extend(paths(&code));
        Self { named, reexports }
    }
}

/// The module file a path named from module `from` leads to: the deepest module it passes
/// through, following the re-exports of the module that holds a named item (`crate::Engaged`,
/// re-exported by the crate root from `engaged`, leads to `engaged`). `None` for another crate.
fn resolve(sources: &BTreeMap<Module, Source>, from: &Module, path: &[String], depth: usize) -> Option<Module> {
    let (first, rest) = path.split_first()?;
    let mut at: Module = match first.as_str() {
        "crate" => Vec::new(),
        // `super` of `a/b.rs` is `a`; of `a/b/mod.rs` (module `a::b`) also `a`.
        "super" => from[..from.len().saturating_sub(1)].to_vec(),
        // `self` of `a/b.rs` and of `a/b/mod.rs` is `a::b`.
        "self" => from.clone(),
        // A first name of a `use`: a child module of the file's own, or another crate.
        name => {
            let mut child = from.clone();
            child.push(name.to_owned());
            if !sources.contains_key(&child) {
                return None;
            }
            return resolve(sources, from, &[&["self".to_owned()], path].concat(), depth);
        }
    };
    for segment in rest {
        match segment.as_str() {
            "super" => {
                at.pop();
                continue;
            }
            "self" => continue,
            _ => {}
        }
        let mut candidate = at.clone();
        candidate.push(segment.clone());
        if sources.contains_key(&candidate) {
            at = candidate;
            continue;
        }
        // An item of `at`: defined there, or re-exported from where it is.
        let reexported = sources.get(&at).and_then(|source| source.reexports.get(segment));
        if let Some(reexported) = reexported.filter(|_| depth < 8) {
            return resolve(sources, &at, reexported, depth + 1).or(Some(at));
        }
        return Some(at);
    }
    Some(at)
}

/// The file-level import graph of one crate: which module files each module file names.
fn graph(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    sources(root, &mut files);
    let texts = files
        .iter()
        .map(|file| (module_of(root, file), std::fs::read_to_string(file).expect("a source file")))
        .collect();
    graph_of(&texts)
}

/// The import graph of modules given by their source text.
fn graph_of(texts: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let sources: BTreeMap<Module, Source> =
        texts.iter().map(|(module, text)| (module.clone(), Source::read(text))).collect();
    let mut graph = BTreeMap::new();
    for (module, source) in &sources {
        let targets = source
            .named
            .iter()
            .filter_map(|path| resolve(&sources, module, path, 0))
            // A module naming its own folder's parents is structure, not an import cycle.
            .filter(|target| target != module && !module.starts_with(target))
            .collect();
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
    let mut cycles = Vec::new();
    for folder in CRATES {
        let mut graph = graph(&workspace.join(folder));
        assert!(!graph.is_empty(), "{folder} was not read");
        // Every cycle, one at a time: each found is reported and its last edge set aside.
        while let Some(cycle) = cycle(&graph) {
            let named: Vec<String> = cycle.iter().map(|module| module.join("::")).collect();
            cycles.push(format!("{folder}: {}", named.join(" -> ")));
            let (last, first) = (&cycle[cycle.len() - 1], &cycle[0]);
            graph.get_mut(last).map(|targets| targets.remove(first));
        }
    }
    assert!(cycles.is_empty(), "import cycles between files:\n{}", cycles.join("\n"));
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
    assert_eq!(paths[0], ["crate", "records", "write"]);
    assert_eq!(paths[1], ["super", "store", "load"]);
    assert_eq!(module_of(&root, &root.join("records/mod.rs")), module("records"));
}

/// Groups and re-exports: a loop through the crate root's re-export, written with brace
/// groups, the shape a scan of `crate::a::b` paths alone could not see.
#[test]
fn the_import_graph_reads_use_groups_and_follows_re_exports() {
    let leaves = |code: &str| {
        uses(code).into_iter().map(|found| (found.public, found.path.join("::"), found.bound)).collect::<Vec<_>>()
    };
    assert_eq!(
        leaves("pub(crate) use crate::{a, b::{c, d as e, self}, f::*};"),
        [
            (true, "crate::a".to_owned(), Some("a".to_owned())),
            (true, "crate::b::c".to_owned(), Some("c".to_owned())),
            (true, "crate::b::d".to_owned(), Some("e".to_owned())),
            (true, "crate::b::self".to_owned(), Some("b".to_owned())),
            (true, "crate::f".to_owned(), None),
        ]
    );
    assert_eq!(
        leaves("fn f() { use super::x::Y; let user = 1; }")[0],
        (false, "super::x::Y".to_owned(), Some("Y".to_owned()))
    );
    assert_eq!(leaves("let because = \"we use it\"; reuse(x);"), []);

    let module = |name: &str| if name.is_empty() { Vec::new() } else { vec![name.to_owned()] };
    let mut texts = BTreeMap::from([
        (module(""), "mod engaged;\nmod json;\npub use engaged::{Engaged, Window};\n".to_owned()),
        (module("engaged"), "use crate::json::json_kind;\npub struct Engaged;\n".to_owned()),
        (module("json"), "use crate::{\n    Engaged,\n    Window,\n};\npub fn json_kind() {}\n".to_owned()),
    ]);
    let graph = graph_of(&texts);
    assert_eq!(graph[&module("json")], BTreeSet::from([module("engaged")]), "the re-export is followed");
    assert!(cycle(&graph).is_some(), "the loop through the crate root is seen");
    texts.insert(module("engaged"), "pub struct Engaged;\n".to_owned());
    assert_eq!(cycle(&graph_of(&texts)), None);
}

/// `cargo tree` for `package` (normal dependencies, the package's own features only), as it
/// resolves it from the lock file: each line's depth and crate name.
fn cargo_tree(package: &str) -> Vec<(usize, String)> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "depth", "-p", package])
        .current_dir(workspace)
        .output()
        .expect("cargo tree runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let name = line.trim_start_matches(|c: char| c.is_ascii_digit());
            let depth = line[..line.len() - name.len()].parse().ok()?;
            Some((depth, name.split_whitespace().next()?.to_owned()))
        })
        .collect()
}

/// The crates a package links, by name.
fn linked(package: &str) -> BTreeSet<String> {
    cargo_tree(package).into_iter().map(|(_, name)| name).collect()
}

/// The crates that link `wanted` directly in `package`'s tree.
fn parents_of(package: &str, wanted: &str) -> BTreeSet<String> {
    let mut path: Vec<String> = Vec::new();
    let mut parents = BTreeSet::new();
    for (depth, name) in cargo_tree(package) {
        path.truncate(depth);
        if name == wanted
            && let Some(parent) = path.last()
        {
            parents.insert(parent.clone());
        }
        path.push(name);
    }
    parents
}

/// What reaches out (a runtime, a database client or pool, an HTTP framework or client, the
/// platform's IO) is not in the tree `domain` and the `kernel` link, so a rule cannot open a
/// connection, sleep, or call a helper that does: the compiler holds it, not a word list. The
/// one random number generator in the tree is below `postgres-protocol` (the SCRAM nonce of the
/// value encoding the kernel's guards use), which neither crate can name.
#[test]
fn domain_and_the_kernel_link_no_runtime_database_client_http_or_platform() {
    for package in ["kernel", "domain"] {
        let linked = linked(package);
        assert!(linked.contains("serde_json"), "the tree of {package} was read: {linked:?}");
        for crate_name in
            ["tokio", "tokio-postgres", "deadpool-postgres", "actix-web", "actix-rt", "reqwest", "platform", "figment"]
        {
            assert!(!linked.contains(crate_name), "{package} links {crate_name}");
        }
        let parents = parents_of(package, "rand");
        assert!(
            parents.iter().all(|parent| parent == "postgres-protocol"),
            "{package} links rand other than through postgres-protocol: {parents:?}"
        );
    }
    assert!(linked("platform").contains("tokio-postgres"), "the check can see a crate that is linked");
    assert!(parents_of("platform", "rand").contains("platform"), "the check can see who links rand");
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
