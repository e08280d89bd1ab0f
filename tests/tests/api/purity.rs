//! The purity rule, checked in one place for every crate: a decision does no IO, knows no
//! HTTP and draws nothing (no clock, randomness, id source or keyring: the time and a `Fresh`
//! are given). For `domain` the compiler holds most of it: it stands on the `kernel` alone and
//! links no runtime, database client, HTTP crate or `platform` (`layering.rs`), so it cannot
//! reach `Drawn`, the keyring or `now_millis`. What the compiler cannot hold (the clock through
//! `chrono` or `std`, and every decision inside a service's crate) is held here by reading the
//! sources: every `decide.rs`, every file of a `decide/` folder, every file of `domain`, and
//! the few pure files named below. And the process's own source of ids and keys (`Drawn`) is
//! named only by the shells listed, which hand it to decisions.

use std::path::Path;

/// Pure files that are not named `decide`: the decision trait and its harness, the record
/// write assembly decisions call, and the query service's pure readers of windows and trails.
const PURE_ALSO: &[&str] = &[
    "command-service/src/decision.rs",
    "command-service/src/records/write.rs",
    "query-service/src/events/window.rs",
    "query-service/src/workflows/window.rs",
    "query-service/src/audit/trail.rs",
];

/// Crates whose decisions are checked, by source folder.
const CRATES: &[&str] = &[
    "shared/domain/src",
    "shared/mail/src",
    "shared/journeys/src",
    "command-service/src",
    "query-service/src",
    "projector/src",
];

/// What a decision may not name, and why.
const NOT_IN_A_DECISION: &[(&str, &str)] = &[
    (".await", "waiting is IO"),
    ("async ", "waiting is IO"),
    ("deadpool", "the database"),
    ("tokio", "the runtime or the database"),
    ("reqwest", "an HTTP client"),
    ("lettre", "the relay"),
    ("actix", "HTTP"),
    ("HttpRequest", "HTTP"),
    ("HttpResponse", "HTTP"),
    ("now_millis", "the clock: the time is given"),
    ("Utc::now", "the clock: the time is given"),
    ("SystemTime", "the clock: the time is given"),
    ("Instant::now", "the clock: the time is given"),
    ("rand::", "randomness: a `Fresh` is given"),
    ("random_bytes", "randomness: a `Fresh` is given"),
    ("new_id", "an id source: a `Fresh` is given"),
    ("Drawn", "the process's id and key source: a `Fresh` is given"),
    ("keyring", "the process's keyring: keys are loaded by the shell"),
    ("crypto::install", "the process's keyring"),
    ("keyed_digest", "a digest under the master key: loaded by the shell"),
    ("email_subject", "a digest under the master key: loaded by the shell"),
];

/// What a decision of a write may not name besides: the envelope. (The query service's pure
/// readers answer a query's refusal themselves.)
const NOT_IN_A_WRITES_DECISION: &[(&str, &str)] = &[
    ("StatusCode", "HTTP: a refusal's code carries its status"),
    ("ApiError", "the envelope: a refusal is its own type (`platform::refusal::Refusal`)"),
    ("api::", "the HTTP crate: a reply is a document or a page, which the shell renders"),
];

/// The shells that may name `Drawn` (beside `platform::fresh`, which defines it), and why.
const DRAWN_IN: &[(&str, &str)] = &[
    ("shared/platform/src/fresh.rs", "where it is defined"),
    ("command-service/src/pipeline.rs", "the shell every command runs through gives each decision its Fresh"),
    ("projector/src/workers/imports/mod.rs", "the imports worker's shell around a wave's decision"),
    ("projector/src/workers/broadcasts/mod.rs", "the run engine's shell around a batch's decision"),
];

/// Whether a file (a path from the workspace's root) is a decision.
fn is_decision(path: &str) -> bool {
    let in_crate = CRATES.iter().any(|folder| path.starts_with(folder));
    let decide = path.ends_with("/decide.rs") || (path.contains("/decide/") && !path.ends_with("/tests.rs"));
    let domain = path.starts_with("shared/domain/src/") && !path.ends_with("/tests.rs");
    in_crate && (decide || domain) || PURE_ALSO.contains(&path)
}

/// The source without its unit tests and line comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

/// What breaks the rule among `files` (paths from the workspace's root, and their text).
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let code = code(text);
        if is_decision(path) {
            let writes = !path.starts_with("query-service/");
            let words = NOT_IN_A_DECISION.iter().chain(NOT_IN_A_WRITES_DECISION.iter().filter(|_| writes));
            for (word, why) in words {
                if code.contains(word) {
                    found.push(format!("{path} names {word} ({why})"));
                }
            }
        } else if code.contains("Drawn") && !DRAWN_IN.iter().any(|(shell, _)| shell == path) {
            found.push(format!("{path} names Drawn, which only the listed shells hand to decisions"));
        }
    }
    found
}

fn sources(workspace: &Path, folder: &Path, found: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(folder).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            sources(workspace, &path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            let relative = path.strip_prefix(workspace).expect("in the workspace").to_string_lossy().replace('\\', "/");
            found.push((relative, std::fs::read_to_string(&path).expect("a source file")));
        }
    }
}

#[test]
fn decisions_do_no_io_and_draw_nothing_and_only_the_shells_name_drawn() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut files = Vec::new();
    for folder in ["shared", "command-service/src", "query-service/src", "projector/src", "deploy"] {
        sources(workspace, &workspace.join(folder), &mut files);
    }
    let decisions = files.iter().filter(|(path, _)| is_decision(path)).count();
    assert!(decisions >= 60, "the decisions were found: {decisions}");
    for expected in [
        "command-service/src/webhooks/decide/mod.rs",
        "shared/journeys/src/decide/steps/call.rs",
        "shared/mail/src/outbox/decide.rs",
        "shared/domain/src/imports/decide.rs",
        "shared/domain/src/email/send/mod.rs",
    ] {
        assert!(files.iter().any(|(path, _)| path == expected && is_decision(path)), "{expected} is checked");
    }
    for (shell, _) in DRAWN_IN {
        assert!(workspace.join(shell).is_file(), "the allowed shell {shell} exists");
    }
    let found = violations(&files);
    assert!(found.is_empty(), "the purity rule is broken:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_a_decision_that_reads_the_clock_and_a_handler_that_draws() {
    let planted = |path: &str, text: &str| vec![(path.to_owned(), text.to_owned())];
    let clock =
        planted("projector/src/workers/email/decide.rs", "fn decide() { let now = platform::time::now_millis(); }");
    assert_eq!(violations(&clock).len(), 1, "{:?}", violations(&clock));
    let drawn = planted("command-service/src/forms/http.rs", "let fresh = &mut platform::fresh::Drawn;");
    assert_eq!(violations(&drawn).len(), 1);
    let envelope = planted("command-service/src/forms/decide.rs", "Err(ApiError::of(code, message))");
    assert_eq!(violations(&envelope).len(), 1, "a decision answers with its refusal type");
    let rendered = planted("command-service/src/records/decide.rs", "Reply::ok(api::http::data_body(doc, &[]))");
    assert_eq!(violations(&rendered).len(), 1, "a decision replies with the document, not its envelope");
    let domain = planted("shared/domain/src/records/mod.rs", "async fn load() {}");
    assert_eq!(violations(&domain).len(), 1, "every file of domain is a decision");
    let commented = planted("shared/mail/src/outbox/decide.rs", "// the caller reads now_millis\nfn settle() {}");
    assert!(violations(&commented).is_empty(), "a comment is not code");
    let shell = planted("command-service/src/pipeline.rs", "let mut fresh = Drawn; let now = now_millis();");
    assert!(violations(&shell).is_empty(), "a listed shell draws");
}

/// Where the facts a send decides on may be read, beside `mail::facts` (the one reader every
/// send reads its recipients' suppression, consent keys, topic statuses and marketing sends
/// through), and why.
const SEND_FACTS_READ_ALSO: &[(&str, &str)] = &[
    ("shared/mail/src/facts.rs", "the one reader"),
    ("shared/mail/src/skipped.rs", "which suppression decided a refusal (its story), not whether"),
    ("command-service/src/suppressions/store.rs", "the suppressions capability's own rows"),
    ("projector/src/workers/maintenance.rs", "the pruning of sends past every cap's window"),
    (
        "projector/src/workers/workflows/replay/store.rs",
        "a dry run's recorded sends by email id, merged with the simulated ones",
    ),
];

/// What reads a send fact: the two tables and the rule of which attribute is a consent key.
const SEND_FACT_READS: &[&str] = &["FROM suppression_keys", "FROM marketing_sends", "is_email_consent("];

/// Each place outside the allowed ones that reads a send fact by itself.
fn send_fact_readers(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, source) in files {
        let allowed = SEND_FACTS_READ_ALSO.iter().any(|(file, _)| file == path)
            || path.starts_with("shared/domain/src/email/send/");
        let code = source.split("#[cfg(test)]").next().unwrap_or_default();
        for read in SEND_FACT_READS {
            if !allowed && code.contains(read) {
                found.push(format!("{path} reads a send fact by itself ({read}); read it through mail::facts"));
            }
        }
    }
    found
}

#[test]
fn every_send_reads_its_recipients_facts_through_the_one_reader() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut files = Vec::new();
    for folder in ["shared", "command-service/src", "query-service/src", "projector/src"] {
        sources(workspace, &workspace.join(folder), &mut files);
    }
    for (file, _) in SEND_FACTS_READ_ALSO {
        assert!(workspace.join(file).is_file(), "the allowed reader {file} exists");
    }
    let found = send_fact_readers(&files);
    assert!(found.is_empty(), "send facts are read outside the one reader:\n{}", found.join("\n"));
    let planted = |path: &str, text: &str| vec![(path.to_owned(), text.to_owned())];
    let own = planted(
        "projector/src/workers/email/recipients.rs",
        "client.query(\"SELECT identifier FROM suppression_keys WHERE identifier = ANY($1)\", &[&addresses])",
    );
    assert_eq!(send_fact_readers(&own).len(), 1, "a feeder's own suppression lookup is seen");
    let rule = planted("command-service/src/forms/http.rs", "if mail::send::is_email_consent(&definition) {}");
    assert_eq!(send_fact_readers(&rule).len(), 1, "a feeder's own consent keys are seen");
}
