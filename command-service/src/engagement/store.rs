//! What a click or an open writes: its row of `engagement_inbox`.

use deadpool_postgres::GenericClient;

/// A click or an open as the tracking endpoint takes it in.
pub(crate) struct Hit<'a> {
    pub email_id: &'a str,
    /// `open` or `click`.
    pub kind: &'static str,
    /// A click's target, sealed (`domain::engagement::seal_inbox_link`).
    pub link: Option<Vec<u8>>,
    pub link_id: &'a str,
    /// What the request alone gave away (`head`, `no_user_agent`, `privacy_proxy`,
    /// `known_bot`), empty for what looked like a person.
    pub signal: &'static str,
    pub at_ms: i64,
}

/// Takes `hit` in: one row, committed when this returns.
pub(crate) async fn take_in(client: &impl GenericClient, hit: &Hit<'_>) -> Result<(), tokio_postgres::Error> {
    let statement = client
        .prepare_cached(
            "INSERT INTO engagement_inbox (email_id, kind, link, link_id, signal, at_ms) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .await?;
    client.execute(&statement, &[&hit.email_id, &hit.kind, &hit.link, &hit.link_id, &hit.signal, &hit.at_ms]).await?;
    Ok(())
}
