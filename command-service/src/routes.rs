//! Every route of the command service, in one place: the handler of each command operation
//! of the API's table (`api::routes::OPERATIONS`). The router is built from that table.

use actix_web::{Route, web};
use api::http::answering;
use api::routes::Tier;

use crate::{
    broadcasts, emails, engagement, events, forms, identities, imports, ingest, records, segments, suppressions,
    templates, webhooks, workflows,
};

/// The handler of a command operation, by its operation id.
pub fn handler(operation_id: &str) -> Option<Route> {
    Some(match operation_id {
        "createRecord" => web::post().to(answering(records::http::create)),
        "upsertRecord" => web::post().to(answering(records::http::upsert)),
        "updateRecord" => web::patch().to(answering(records::http::update)),
        "deleteRecord" => web::delete().to(answering(records::http::delete)),
        "createImport" => web::put().to(answering(imports::http::create)),
        "deleteImport" => web::delete().to(answering(imports::http::delete)),
        "putImportPart" => web::put().to(answering(imports::http::put_part)),
        "completeImport" => web::post().to(answering(imports::http::complete)),
        "createSuppression" => web::post().to(answering(suppressions::http::create)),
        "batchCreateSuppressions" => web::post().to(answering(suppressions::http::batch_create)),
        "batchRemoveSuppressions" => web::post().to(answering(suppressions::http::batch_remove)),
        "deleteSuppression" => web::delete().to(answering(suppressions::http::delete)),
        "fireEvent" => web::post().to(answering(events::http::fire)),
        "fireEventBatch" => web::post().to(answering(events::http::batch)),
        "changeEventIdentity" => web::post().to(answering(identities::http::change)),
        "createWebhook" => web::post().to(answering(webhooks::http::create)),
        "updateWebhook" => web::patch().to(answering(webhooks::http::update)),
        "deleteWebhook" => web::delete().to(answering(webhooks::http::delete)),
        "rotateWebhookSecret" => web::post().to(answering(webhooks::http::rotate_secret)),
        "replayWebhookDelivery" => web::post().to(answering(webhooks::http::replay_delivery)),
        "testWebhook" => web::post().to(answering(webhooks::http::test)),
        "sendTemplate" => web::post().to(answering(templates::http::send)),
        "previewTemplate" => web::post().to(answering(templates::preview::preview)),
        "testTemplate" => web::post().to(answering(templates::test_send::test)),
        "unsubscribeEmail" => web::post().to(emails::unsubscribe::post),
        "updateEmailPreferences" => web::post().to(emails::preferences::post),
        // `HEAD` too: link scanners ask with it, and it counts as a machine's.
        "followEmailLink" => web::route().guard(get_or_head()).to(engagement::http::click),
        "fetchEmailOpenPixel" => web::route().guard(get_or_head()).to(engagement::http::open),
        "submitForm" => web::post().to(forms::http::submit),
        "confirmFormSubmission" => web::get().to(forms::http::confirm),
        "createSegment" => web::post().to(answering(segments::http::create)),
        "deleteSegment" => web::delete().to(answering(segments::http::delete)),
        "updateBroadcast" => web::patch().to(answering(broadcasts::http::update)),
        "sendBroadcast" => web::post().to(answering(broadcasts::http::send)),
        "triggerWorkflow" => web::post().to(answering(workflows::http::trigger)),
        "pauseWorkflow" => web::post().to(answering(workflows::http::pause)),
        "unpauseWorkflow" => web::post().to(answering(workflows::http::unpause)),
        "requestWorkflowReplay" => web::post().to(answering(workflows::http::replay)),
        "ingestBatch" => web::post().to(answering(ingest::http::batch)),
        "ingestIdentify" => web::post().to(answering(ingest::http::identify)),
        "ingestTrack" => web::post().to(answering(ingest::http::track)),
        "ingestPage" => web::post().to(answering(ingest::http::page)),
        "ingestScreen" => web::post().to(answering(ingest::http::screen)),
        "ingestGroup" => web::post().to(answering(ingest::http::group)),
        "ingestAlias" => web::post().to(answering(ingest::http::alias)),
        _ => return None,
    })
}

fn get_or_head() -> impl actix_web::guard::Guard {
    actix_web::guard::Any(actix_web::guard::Get()).or(actix_web::guard::Head())
}

/// Registers the command operations of the table (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    api::http::register(config, Tier::Command, handler);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_operation_has_a_handler() {
        for operation in api::routes::of_tier(Tier::Command) {
            assert!(handler(operation.id).is_some(), "{} has no handler", operation.id);
        }
    }
}
