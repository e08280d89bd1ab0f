//! A contact's email consent as email actions change it: the unsubscribe link withdraws
//! consent, a form (or its confirmation link) grants it. This reads the contact and its
//! schema's consent attributes; the write is decided by
//! [`consent_write`](super::decide::consent_write), and the subscription changes that go with
//! it are built in `decide.rs` too.

use platform::error::ApiError;
use serde_json::{Map, Value};

use super::decide::ConsentLoaded;
use crate::pipeline::Ctx;
use crate::records::decide::write_schema;
use crate::records::load::{load_update, write_context};

/// What setting the email consent attributes of the contact's schema to `consented` decides
/// on; `None` when the contact is gone or its schema has none.
pub(crate) async fn load_email_consent(
    ctx: &Ctx<'_>,
    (space_id, contact_id): (&str, &str),
    consented: bool,
) -> Result<Option<Box<ConsentLoaded>>, ApiError> {
    let client = ctx.db().await?;
    let loaded = reads::records::load_records(&client, &[contact_id.to_owned()])
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .next();
    drop(client);
    let Some((_, _, domain::records::Loaded::Live { state: record, .. })) = loaded else { return Ok(None) };
    let context = write_context(ctx, space_id, &record.schema_id).await?;
    let input: Map<String, Value> =
        mail::send::consent_keys(&context.attributes).into_iter().map(|key| (key, Value::Bool(consented))).collect();
    if input.is_empty() {
        return Ok(None);
    }
    let (input, target, owners) = load_update(ctx, &write_schema(&context, space_id), contact_id, input).await?;
    Ok(Some(Box::new(ConsentLoaded { space_id: space_id.into(), context, input, target, owners })))
}
