//! Every route of the query service, in one place: the handler of each query operation of
//! the API's table (`api::routes::OPERATIONS`). The router is built from that table.

use actix_web::{HttpResponse, Route, web};
use api::http::answering;
use api::routes::Tier;

use crate::{
    audit, broadcasts, deletions, email, emails, events, imports, ingest, me, records, schemas, segments, suppressions,
    webhooks, workflows,
};

/// The handler of a query operation, by its operation id.
pub fn handler(operation_id: &str) -> Option<Route> {
    Some(match operation_id {
        "getOpenApi" => web::get().to(openapi),
        "getMe" => web::get().to(answering(me::http::get)),
        "listSchemas" => web::get().to(answering(schemas::http::list)),
        "getSchema" => web::get().to(answering(schemas::http::get)),
        "listAttributes" => web::get().to(answering(schemas::http::attributes)),
        "listRecords" => web::get().to(answering(records::http::list)),
        "getRecord" => web::get().to(answering(records::http::get)),
        "getRecordAuditTrail" => web::get().to(answering(audit::http::get)),
        "getRecordDeletion" => web::get().to(answering(deletions::http::get)),
        "getImport" => web::get().to(answering(imports::http::get)),
        "listImports" => web::get().to(answering(imports::http::list)),
        "listImportRows" => web::get().to(answering(imports::http::rows)),
        "listIngestFailures" => web::get().to(answering(ingest::http::list)),
        "listSuppressions" => web::get().to(answering(suppressions::http::list)),
        "listEvents" => web::get().to(answering(events::http::list)),
        "getEventStatus" => web::get().to(answering(events::http::status)),
        "listWebhooks" => web::get().to(answering(webhooks::http::list)),
        "getWebhook" => web::get().to(answering(webhooks::http::get)),
        "listWebhookDeliveries" => web::get().to(answering(webhooks::http::deliveries)),
        "listTemplates" => web::get().to(answering(email::http::list_templates)),
        "getTemplate" => web::get().to(answering(email::http::get_template)),
        "listForms" => web::get().to(answering(email::http::list_forms)),
        "getForm" => web::get().to(answering(email::http::get_form)),
        "listDomains" => web::get().to(answering(email::http::list_domains)),
        "getDomain" => web::get().to(answering(email::http::get_domain)),
        "listSenders" => web::get().to(answering(email::http::list_senders)),
        "getSender" => web::get().to(answering(email::http::get_sender)),
        "listTopics" => web::get().to(answering(email::http::list_topics)),
        "getTopic" => web::get().to(answering(email::http::get_topic)),
        "listEmails" => web::get().to(answering(emails::http::list)),
        "getEmail" => web::get().to(answering(emails::http::get)),
        "getUnsubscribePage" => web::get().to(emails::unsubscribe_page::get),
        "listSegments" => web::get().to(answering(segments::http::list)),
        "getSegment" => web::get().to(answering(segments::http::get)),
        "listSegmentContacts" => web::get().to(answering(segments::http::contacts)),
        "listBroadcasts" => web::get().to(answering(broadcasts::http::list)),
        "getBroadcast" => web::get().to(answering(broadcasts::http::get)),
        "listBroadcastRuns" => web::get().to(answering(broadcasts::http::runs)),
        "getBroadcastRun" => web::get().to(answering(broadcasts::http::run)),
        "listWorkflows" => web::get().to(answering(workflows::http::list)),
        "getWorkflow" => web::get().to(answering(workflows::http::get)),
        "getWorkflowStats" => web::get().to(answering(workflows::http::stats)),
        "listWorkflowRuns" => web::get().to(answering(workflows::http::runs)),
        "getWorkflowRun" => web::get().to(answering(workflows::http::run)),
        _ => return None,
    })
}

/// Registers the query operations of the table (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    api::http::register(config, Tier::Query, handler);
}

/// The OpenAPI 3.1 document, kept in the repo at `docs/openapi.json`.
pub(crate) const OPENAPI: &str = include_str!("../../docs/openapi.json");

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(OPENAPI)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_operation_has_a_handler() {
        for operation in api::routes::of_tier(Tier::Query) {
            assert!(handler(operation.id).is_some(), "{} has no handler", operation.id);
        }
    }

    #[test]
    fn the_document_describes_exactly_the_operations_of_the_table() {
        let document: serde_json::Value = serde_json::from_str(OPENAPI).expect("the document is JSON");
        let mut documented: Vec<(String, String, String)> = Vec::new();
        for (path, item) in document["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("a path item") {
                if let Some(id) = operation.get("operationId").and_then(serde_json::Value::as_str) {
                    documented.push((id.to_owned(), method.to_uppercase(), path.clone()));
                }
            }
        }
        documented.sort();
        let mut table: Vec<(String, String, String)> = api::routes::OPERATIONS
            .iter()
            .map(|operation| (operation.id.to_owned(), operation.method.to_owned(), operation.path.to_owned()))
            .collect();
        table.sort();
        assert_eq!(documented, table);
    }
}
