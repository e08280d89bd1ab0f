//! What a click or an open reads: the email's stream and its recipient's data key.

use deadpool_postgres::GenericClient;
use platform::crypto::DataKey;

use super::decide::History;

/// The email's stream, folded; `None` for an unknown email.
pub(crate) async fn history(client: &impl GenericClient, email_id: &str) -> anyhow::Result<Option<History>> {
    let events = platform::log::read_streams(client, &[domain::email::stream_id(email_id)]).await?;
    let mut decoded = Vec::with_capacity(events.len());
    for stored in events {
        decoded.push((stored.stream_version, stored.decode()?));
    }
    Ok(History::fold(decoded))
}

/// The recipient's data key; `None` once the contact is erased.
pub(crate) async fn contact_key(client: &impl GenericClient, contact_id: &str) -> anyhow::Result<Option<DataKey>> {
    let keys = platform::crypto::load_keys(client, &[contact_id.to_owned()]).await?;
    Ok(keys.get(contact_id).cloned())
}
