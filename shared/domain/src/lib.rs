//! The rules of the product that more than one service needs: the catalog (schemas,
//! attributes, roles), records and their keys, suppressions, event admission, workflow
//! definitions, webhook rules, state and signing, the authored email resources, engagement
//! and the send decision. Above the platform and the filter language; rules only: no runtime,
//! database, HTTP client, file format or mail stack (what feeds them is `reads`', the AI
//! provider `ai-provider`'s, an import file's reading `import-file`'s).

pub mod admission;
pub mod attributes;
pub mod business_events;
pub mod catalog;
pub mod email;
pub mod engagement;
pub mod imports;
pub mod ingest;
pub mod records;
pub mod roles;
pub mod suppressions;
pub mod webhooks;
pub mod workflows;

#[cfg(test)]
mod tests {
    /// What the compiler cannot hold (the manifest holds the rest: no runtime, database, HTTP
    /// client or randomness crate): no rule reaches for the process's keyring, an id source,
    /// randomness or the clock. What is new each time is given (`platform::fresh::Fresh`), and
    /// so is the time; every file of the crate is checked, but its tests.
    #[test]
    fn rules_draw_no_ids_keys_randomness_or_time() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        let mut folders = vec![source.clone()];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("a source folder") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.extension().is_some_and(|extension| extension == "rs")
                    && path.file_name().is_some_and(|name| name != "tests.rs")
                {
                    files.push(path);
                }
            }
        }
        assert!(files.contains(&source.join("imports/decide.rs")), "the crate's files were read: {files:?}");
        for file in &files {
            let text = std::fs::read_to_string(file).expect("a source file");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            for word in [
                "keyring()",
                "crypto::install",
                "new_id",
                "rand::",
                "now_millis",
                "Utc::now",
                "SystemTime",
                "Instant::now",
                ".await",
                "async ",
            ] {
                assert!(!code.contains(word), "{} mentions {word}", file.display());
            }
        }
    }
}
