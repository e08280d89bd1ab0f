//! Email as the log and the catalog know it: the authored resources (domains, senders,
//! topics, templates, forms, broadcasts), an email's and a contact's subscription streams,
//! and whether an address is suppressed. Making and sending mail is the `mail` crate's.

pub mod broadcasts;
pub mod experiments;
pub mod locale;
pub mod page_text;
pub mod resources;
pub mod send;
pub mod story;

/// The email id a preview and a test send render with: what their `unsubscribeUrl` shows in
/// place of a sent email's (it unsubscribes no one; its page says so).
pub const PREVIEW_EMAIL_ID: &str = "preview";

/// An email's stream.
pub fn stream_id(email_id: &str) -> String {
    format!("email-{email_id}")
}

/// A contact's topic subscriptions' stream.
pub fn subscriptions_stream(contact_id: &str) -> String {
    format!("subscriptions-{contact_id}")
}

/// The month an allowance counts in, `YYYY-MM` (UTC).
pub fn allowance_month(at_ms: i64) -> String {
    kernel::time::from_millis(at_ms).format("%Y-%m").to_string()
}
