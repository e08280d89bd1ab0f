//! A broadcast's state: its authored definition with the changes callers made through the
//! API folded over it, in log order, and the document the API shows.

use serde_json::{Value, json};

use super::resources::{Audience, BroadcastDef};
use kernel::proto;

/// The timer kind that starts a run: the command service schedules it, the projector's
/// broadcast engine handles it.
pub const RUN_TIMER: &str = "broadcast_runs";

/// A broadcast's stream: its changes and its run requests.
pub fn stream_id(broadcast_id: &str) -> String {
    format!("broadcast-{broadcast_id}")
}

/// `definition` with the fields `update` sets.
pub fn apply_update(mut definition: BroadcastDef, update: &proto::BroadcastUpdated) -> BroadcastDef {
    if let Some(name) = &update.name {
        definition.name = name.clone();
    }
    if let Some(audience) = update.audience.as_ref().and_then(Audience::from_proto) {
        definition.audience = audience;
    }
    if update.scheduled_at_set {
        definition.scheduled_at_ms = Some(update.scheduled_at_ms).filter(|at| *at > 0);
    }
    if update.experiment_set {
        // An experiment the log holds was checked when it was appended; one that no longer
        // reads (never written so) leaves none rather than a broken one.
        definition.experiment = serde_json::from_str(&update.experiment_json).ok();
    }
    definition
}

/// The broadcast as the API shows it.
pub fn document(broadcast_id: &str, definition: &BroadcastDef, updated_at_ms: i64) -> Value {
    json!({
        "id": broadcast_id,
        "slug": definition.slug,
        "name": definition.name,
        "templateId": definition.template_id,
        "senderId": definition.sender_id,
        "audience": definition.audience,
        "scheduledAt": definition.scheduled_at_ms.map(kernel::time::format_millis),
        "experiment": definition.experiment,
        "updatedAt": kernel::time::format_millis(updated_at_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authored() -> BroadcastDef {
        BroadcastDef {
            slug: "launch".into(),
            name: "Launch".into(),
            template_id: "tpl_1".into(),
            sender_id: None,
            audience: Audience::Topic { topic_id: "top_1".into() },
            scheduled_at_ms: Some(1_000),
            experiment: None,
        }
    }

    #[test]
    fn given_an_update_then_only_the_fields_it_sets_change() {
        let renamed = apply_update(
            authored(),
            &proto::BroadcastUpdated { name: Some("Launch day".into()), ..Default::default() },
        );
        assert_eq!((renamed.name.as_str(), renamed.scheduled_at_ms), ("Launch day", Some(1_000)));
        let moved = apply_update(
            authored(),
            &proto::BroadcastUpdated {
                audience: Some(proto::BroadcastAudience { segment_id: "seg_1".into(), topic_id: String::new() }),
                scheduled_at_set: true,
                scheduled_at_ms: 0,
                ..Default::default()
            },
        );
        assert_eq!(moved.audience, Audience::Segment { segment_id: "seg_1".into() });
        assert_eq!(moved.scheduled_at_ms, None, "0 clears the schedule");
        let document = document("bc_1", &moved, 5_000);
        assert_eq!(document["audience"], json!({"type": "segment", "segmentId": "seg_1"}));
        assert_eq!(document["scheduledAt"], Value::Null);
    }
}
