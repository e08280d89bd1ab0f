//! The form's reads: a confirmation token.

use deadpool_postgres::GenericClient;

/// A confirmation token of a form, as found by its digest.
pub(crate) struct Token {
    pub(crate) submission_id: String,
    pub(crate) contact_id: String,
    /// Confirmed already.
    pub(crate) done: bool,
    pub(crate) expired: bool,
}

/// The token of `form_id` whose digest is `digest`, if any.
pub(crate) async fn token(
    client: &impl GenericClient,
    digest: &str,
    form_id: &str,
) -> Result<Option<Token>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT submission_id, contact_id, confirmed_at IS NOT NULL, expires_at < now() FROM form_tokens
             WHERE token_digest = $1 AND form_id = $2",
            &[&digest, &form_id],
        )
        .await?;
    Ok(row.map(|row| Token {
        submission_id: row.get(0),
        contact_id: row.get(1),
        done: row.get(2),
        expired: row.get(3),
    }))
}
