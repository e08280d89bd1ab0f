//! A contact's email consent as email actions change it: the unsubscribe link withdraws
//! consent, a form (or its confirmation link) grants it. The subscription changes they append
//! are built in `decide.rs`.

use platform::error::ApiError;
use serde_json::{Map, Value};

use super::decide::Source;
use crate::pipeline::Ctx;
use crate::records::decide::WriteSchema;
use crate::records::load::{plan_update, write_context};
use crate::records::write::Write;
use crate::templates::decide::consent_keys;

/// Sets the email consent attributes of the contact's schema to `consented`, carried by
/// `source`; `None` when the contact is gone, its schema has none, or they hold that value
/// already.
pub(crate) async fn set_email_consent(
    ctx: &Ctx<'_>,
    (space_id, contact_id): (&str, &str),
    consented: bool,
    source: Source<'_>,
    now: i64,
) -> Result<Option<Write>, ApiError> {
    let client = ctx.db().await?;
    let loaded = reads::records::load_records(&client, &[contact_id.to_owned()])
        .await
        .map_err(|error| ApiError::internal(&error))?
        .into_iter()
        .next();
    drop(client);
    let Some((_, _, domain::records::Loaded::Live { state: record, .. })) = loaded else { return Ok(None) };
    let context = write_context(ctx, space_id, &record.schema_id).await?;
    let input: Map<String, Value> =
        consent_keys(&context.attributes).into_iter().map(|key| (key, Value::Bool(consented))).collect();
    if input.is_empty() {
        return Ok(None);
    }
    let write_schema = WriteSchema {
        schema_id: &context.schema.schema_id,
        space_id,
        schema_type: &context.schema.schema_type,
        attributes: &context.attributes,
    };
    let write = plan_update(ctx, &write_schema, contact_id, input, now).await?;
    Ok(write.map(|write| write.carried_by(source.kind, source.id)))
}
