//! Mail as it leaves: rendering templates, the unsubscribe footer, the send gate and the
//! hand-off, building and DKIM-signing messages, the SMTP relay and the outbox. Used by the
//! command service (the inline hand-off of a send, authoring) and the projector (the outbox
//! worker); the query service does not link it.

pub mod dkim;
pub(crate) mod dkim_sign;
pub mod footer;
pub mod inbox;
pub mod mailer;
pub mod message;
pub mod outbox;
pub mod relay;
pub mod render;
pub mod send;
pub mod skipped;
pub mod tracking;

/// Whether `address` is a mailbox address the relay can be given.
pub fn is_address(address: &str) -> bool {
    address.parse::<lettre::Address>().is_ok()
}

/// The enhanced status code (RFC 3463) in `text`: the first `class.subject.detail` token
/// whose class is 2, 4 or 5.
pub fn enhanced_status(text: &str) -> Option<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ';' | '(' | ')' | ','))
        .find(|token| {
            let parts: Vec<&str> = token.split('.').collect();
            parts.len() == 3
                && matches!(parts[0], "2" | "4" | "5")
                && parts[1..]
                    .iter()
                    .all(|part| (1..=3).contains(&part.len()) && part.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `decide.rs` of the crate (and the files of a `decide/` folder): no IO, clock,
    /// randomness, id source or keyring; what a decision needs is loaded or given.
    #[test]
    fn decisions_do_no_io() {
        let mut folders = vec![(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), false)];
        let mut checked = Vec::new();
        while let Some((folder, in_decision)) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("a source folder") {
                let path = entry.expect("an entry").path();
                let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
                if path.is_dir() {
                    folders.push((path, in_decision || name == "decide"));
                    continue;
                }
                if !(in_decision || name == "decide.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).expect("a source file");
                let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
                for word in [
                    ".await",
                    "async ",
                    "deadpool",
                    "tokio",
                    "lettre",
                    "now_millis",
                    "Utc::now",
                    "SystemTime",
                    "Instant::now",
                    "rand::",
                    "new_id",
                    "keyring",
                    "crypto::",
                ] {
                    assert!(!code.contains(word), "{} mentions {word}", path.display());
                }
                checked.push(name);
            }
        }
        assert!(checked.contains(&"decide.rs".to_owned()), "outbox/decide.rs was not found");
    }

    #[test]
    fn an_enhanced_status_is_a_class_subject_detail_token() {
        assert_eq!(enhanced_status("550 5.1.1 user unknown").as_deref(), Some("5.1.1"));
        assert_eq!(enhanced_status("550 user unknown"), None);
    }
}
