//! Every route of the command service, in one place: the handler of each command operation
//! of the API's table (`shared::routes::OPERATIONS`). The router is built from that table.

use actix_web::{Route, web};
use shared::routes::Tier;

use crate::{
    broadcasts, emails, events, forms, identities, records, segments, suppressions, templates, webhooks, workflows,
};

/// The handler of a command operation, by its operation id.
pub fn handler(operation_id: &str) -> Option<Route> {
    Some(match operation_id {
        "createRecord" => web::post().to(records::http::create),
        "upsertRecord" => web::post().to(records::http::upsert),
        "updateRecord" => web::patch().to(records::http::update),
        "deleteRecord" => web::delete().to(records::http::delete),
        "createSuppression" => web::post().to(suppressions::http::create),
        "batchCreateSuppressions" => web::post().to(suppressions::http::batch_create),
        "batchRemoveSuppressions" => web::post().to(suppressions::http::batch_remove),
        "deleteSuppression" => web::delete().to(suppressions::http::delete),
        "fireEvent" => web::post().to(events::http::fire),
        "fireEventBatch" => web::post().to(events::http::batch),
        "changeEventIdentity" => web::post().to(identities::http::change),
        "createWebhook" => web::post().to(webhooks::http::create),
        "updateWebhook" => web::patch().to(webhooks::http::update),
        "deleteWebhook" => web::delete().to(webhooks::http::delete),
        "rotateWebhookSecret" => web::post().to(webhooks::http::rotate_secret),
        "replayWebhookDelivery" => web::post().to(webhooks::http::replay_delivery),
        "testWebhook" => web::post().to(webhooks::http::test),
        "sendTemplate" => web::post().to(templates::http::send),
        "unsubscribeEmail" => web::post().to(emails::unsubscribe::post),
        "updateEmailPreferences" => web::post().to(emails::preferences::post),
        "submitForm" => web::post().to(forms::http::submit),
        "confirmFormSubmission" => web::get().to(forms::http::confirm),
        "createSegment" => web::post().to(segments::http::create),
        "deleteSegment" => web::delete().to(segments::http::delete),
        "updateBroadcast" => web::patch().to(broadcasts::http::update),
        "sendBroadcast" => web::post().to(broadcasts::http::send),
        "triggerWorkflow" => web::post().to(workflows::http::trigger),
        "pauseWorkflow" => web::post().to(workflows::http::pause),
        "unpauseWorkflow" => web::post().to(workflows::http::unpause),
        _ => return None,
    })
}

/// Registers the command operations of the table (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    shared::http::register(config, Tier::Command, handler);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_operation_has_a_handler() {
        for operation in shared::routes::of_tier(Tier::Command) {
            assert!(handler(operation.id).is_some(), "{} has no handler", operation.id);
        }
    }
}
