//! A click's target between the tracking endpoint and the log: sealed into `engagement_inbox`
//! under a system key derived from the master key, with the email's id bound in, and opened
//! by the `engagement` worker to be sealed again under the contact's own key.

/// The purpose of the system key that seals a click's target in `engagement_inbox`.
const INBOX_KEY: &str = "engagement-inbox";

/// Seals a click's target for `engagement_inbox`, under the system's inbox key with the
/// email's id bound in (so a row cannot be moved to another email).
pub fn seal_inbox_link(email_id: &str, url: &str) -> anyhow::Result<Vec<u8>> {
    platform::crypto::keyring()?.system_key(INBOX_KEY).encrypt(email_id, url.as_bytes())
}

/// A click's target as [`seal_inbox_link`] sealed it.
pub fn open_inbox_link(email_id: &str, sealed: &[u8]) -> anyhow::Result<String> {
    let bytes = platform::crypto::keyring()?.system_key(INBOX_KEY).decrypt(email_id, sealed)?;
    Ok(String::from_utf8(bytes)?)
}
