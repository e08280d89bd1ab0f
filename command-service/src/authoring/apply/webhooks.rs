//! The integration-owned webhooks a workspace file declares: created once with a fresh,
//! sealed secret, their URL followed, and deleted once the file no longer lists them.

use anyhow::Context;
use deadpool_postgres::Pool;
use platform::events::{LogEvent, seal};
use platform::ids::derived_id;
use platform::log::{ExpectedVersion, NewEvent, StreamAppend};
use platform::proto;

use super::super::format::{SpaceSpec, WebhookSpec};
use super::Plan;

/// An integration-owned webhook: created once with a fresh secret (sealed under its own key,
/// like one created through the API), which is returned to be shown once; later applies only
/// follow a changed URL.
pub(super) fn plan_webhook(
    plan: &mut Plan<'_>,
    space: &SpaceSpec,
    space_id: &str,
    spec: &WebhookSpec,
) -> anyhow::Result<Option<String>> {
    let stream_id = domain::webhooks::state::stream_id(&spec.id);
    let now = plan.now_ms;
    match plan.current.get(&stream_id) {
        Some((_, LogEvent::WebhookDeleted(_))) => {
            anyhow::bail!(
                "webhook {:?} was removed (by an apply without it, or deleted); a removed webhook's id is not used \
                 again: give it a new id",
                spec.id
            );
        }
        Some((version, _)) => {
            let url = match plan.latest(&stream_id) {
                Some(LogEvent::WebhookCreated(created)) => Some(created.url.clone()),
                Some(LogEvent::WebhookUpdated(updated)) => updated.url.clone(),
                _ => None,
            };
            if url.is_some_and(|url| url != spec.url) {
                let update = proto::WebhookUpdated {
                    webhook_id: spec.id.clone(),
                    space_id: space_id.to_owned(),
                    url: Some(spec.url.clone()),
                    updated_at_ms: now,
                    ..Default::default()
                };
                plan.streams.push(StreamAppend {
                    stream_id,
                    expected: ExpectedVersion::Exactly(*version),
                    events: vec![NewEvent {
                        event: LogEvent::WebhookUpdated(update),
                        subject_id: None,
                        occurred_at: platform::time::from_millis(now),
                    }],
                });
            }
        }
        None => {
            let subject = domain::webhooks::state::secret_subject(&spec.id);
            let (key, wrapped) = platform::crypto::keyring()?.generate(&subject)?;
            let secret = domain::webhooks::signing::Secret::from_random(platform::crypto::random_bytes());
            let mut sealed = seal(&subject, &proto::WebhookSecret { secret: secret.reveal() });
            platform::events::encrypt(&mut sealed, &key)?;
            let schema_id =
                spec.schema.as_ref().map(|slug| derived_id("sch", &["schema", &space.slug, slug])).unwrap_or_default();
            let created = proto::WebhookCreated {
                webhook_id: spec.id.clone(),
                space_id: space_id.to_owned(),
                url: spec.url.clone(),
                trigger: spec.trigger.clone(),
                email_event_types: spec.email_event_types.clone(),
                schema_id,
                condition: Some(domain::webhooks::state::no_condition()),
                secret: Some(sealed),
                integration_vendor_name: spec.integration_vendor_name.clone(),
                created_at_ms: now,
            };
            plan.guards.push(crate::webhooks::store::store_secret_key(&spec.id, space_id, wrapped));
            plan.ensure(stream_id, LogEvent::WebhookCreated(created));
            return Ok(Some(secret.reveal()));
        }
    }
    Ok(None)
}

/// The streams of the webhooks a workspace file declared (integration-owned: created by an
/// apply, with their vendor's name), whether the file still lists them or not.
pub(super) async fn authored_webhook_streams(pool: &Pool) -> anyhow::Result<Vec<String>> {
    let client = pool.get().await?;
    let rows = client
        .query(
            "SELECT stream_id, event_type, payload FROM events
             WHERE stream_id LIKE 'webhook-%' AND stream_version = 1 AND event_type = 'WebhookCreated.v1'",
            &[],
        )
        .await?;
    let mut streams = Vec::new();
    for row in rows {
        if let LogEvent::WebhookCreated(created) =
            LogEvent::decode(row.get(1), row.get(2)).context("decoding a webhook's creation")?
            && !created.integration_vendor_name.is_empty()
        {
            streams.push(row.get(0));
        }
    }
    Ok(streams)
}

/// A webhook the file declared and no longer lists is deleted, as `DELETE /webhooks/{id}`
/// deletes one: its secret's key shredded, its recorded answers blanked.
pub(super) fn plan_webhook_removal(plan: &mut Plan<'_>, stream_id: &str) {
    let Some((_, latest)) = plan.current.get(stream_id) else { return };
    let (webhook_id, space_id) = match latest {
        LogEvent::WebhookDeleted(_) => return,
        LogEvent::WebhookCreated(created) => (created.webhook_id.clone(), created.space_id.clone()),
        LogEvent::WebhookUpdated(updated) => (updated.webhook_id.clone(), updated.space_id.clone()),
        _ => match stream_id.strip_prefix("webhook-") {
            Some(webhook_id) => (webhook_id.to_owned(), String::new()),
            None => return,
        },
    };
    let deleted = proto::WebhookDeleted { webhook_id: webhook_id.clone(), space_id, deleted_at_ms: plan.now_ms };
    plan.ensure(stream_id.to_owned(), LogEvent::WebhookDeleted(deleted));
    plan.guards.push(crate::webhooks::store::shred_secret_key(&webhook_id));
    plan.guards.push(crate::webhooks::store::blank_recorded_secrets(&webhook_id));
}
