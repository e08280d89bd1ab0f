//! The form's write side: confirmation tokens, read by their digest, and the guards that
//! insert and confirm them.

use deadpool_postgres::GenericClient;
use platform::error::Code;
use platform::log::{AppendError, Guard};

/// A confirmation token of a form, as found by its digest.
pub(crate) struct Token {
    pub(crate) submission_id: String,
    pub(crate) contact_id: String,
    /// Confirmed already.
    pub(crate) done: bool,
    pub(crate) expired: bool,
    /// The locale of the submitter's pages, chosen at the submission.
    pub(crate) locale: Option<String>,
}

/// The token of `form_id` whose digest is `digest`, if any.
pub(crate) async fn token(
    client: &impl GenericClient,
    digest: &str,
    form_id: &str,
) -> Result<Option<Token>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT submission_id, contact_id, confirmed_at IS NOT NULL, expires_at < now(), locale FROM form_tokens
             WHERE token_digest = $1 AND form_id = $2",
            &[&digest, &form_id],
        )
        .await?;
    Ok(row.map(|row| Token {
        submission_id: row.get(0),
        contact_id: row.get(1),
        done: row.get(2),
        expired: row.get(3),
        locale: row.get(4),
    }))
}

/// Inserts a submission's token (by its digest), bound to the form, expiring at
/// `expires_at_ms`, with the locale of the submitter's pages.
pub(crate) fn token_guard(
    digest: &str,
    form_id: &str,
    submission_id: &str,
    (space_id, contact_id): (&str, &str),
    (expires_at_ms, locale): (i64, &str),
) -> Guard {
    Guard::exactly_one(
        "INSERT INTO form_tokens (token_digest, form_id, submission_id, space_id, contact_id, expires_at, locale)
         VALUES ($1, $2, $3, $4, $5, to_timestamp($6::bigint / 1000.0), $7)",
        vec![
            Box::new(digest.to_owned()),
            Box::new(form_id.to_owned()),
            Box::new(submission_id.to_owned()),
            Box::new(space_id.to_owned()),
            Box::new(contact_id.to_owned()),
            Box::new(expires_at_ms),
            Box::new(locale.to_owned()),
        ],
        AppendError::Conflict { code: Code::IdempotencyConflict, message: "the token is taken".to_owned() },
    )
}

/// Confirms the token once: a second confirmation (a concurrent one) fails the append with
/// `concurrent_modification`.
pub(crate) fn confirm_guard(digest: &str) -> Guard {
    Guard::exactly_one(
        "UPDATE form_tokens SET confirmed_at = now() WHERE token_digest = $1 AND confirmed_at IS NULL",
        vec![Box::new(digest.to_owned())],
        AppendError::Conflict { code: Code::ConcurrentModification, message: "confirmed meanwhile".to_owned() },
    )
}
