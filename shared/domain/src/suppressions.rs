//! What a suppression looks like on the wire, shared by the write responses and the
//! projection, and which suppressions the API may remove.

use serde_json::{Value, json};

use kernel::events::open;
use kernel::proto;
use kernel::time::format_millis;

/// Reasons a caller may add and remove through the API.
pub const API_REASONS: &[&str] = &["manual", "legal"];
/// Every reason a suppression can carry.
pub const ALL_REASONS: &[&str] = &["manual", "legal", "bounce", "complaint"];

/// The scope key of a suppression: its space id, or `global`.
pub fn scope(space_id: &str) -> &str {
    if space_id.is_empty() { "global" } else { space_id }
}

/// Only `manual` and `legal` suppressions of a space can be removed through the API.
pub fn removable(added: &proto::SuppressionAdded) -> bool {
    !added.space_id.is_empty() && API_REASONS.contains(&added.reason.as_str())
}

/// The suppression document; `None` when its personal data is gone.
pub fn suppression_document(added: &proto::SuppressionAdded) -> anyhow::Result<Option<Value>> {
    let personal: Option<proto::SuppressionPersonal> = open(added.personal.as_ref(), &kernel::crypto::Keys::default())?;
    Ok(personal.map(|personal| {
        json!({
            "id": added.suppression_id,
            "identifier": personal.identifier,
            "reason": added.reason,
            "scope": if added.space_id.is_empty() { "global" } else { "space" },
            "removable": removable(added),
            "createdAt": format_millis(added.created_at_ms),
        })
    }))
}
