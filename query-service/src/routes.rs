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
        "listBroadcastRunLinks" => web::get().to(answering(broadcasts::http::links)),
        "listWorkflows" => web::get().to(answering(workflows::http::list)),
        "getWorkflow" => web::get().to(answering(workflows::http::get)),
        "getWorkflowStats" => web::get().to(answering(workflows::http::stats)),
        "listWorkflowRevisions" => web::get().to(answering(workflows::http::revisions)),
        "listWorkflowRuns" => web::get().to(answering(workflows::http::runs)),
        "getWorkflowRun" => web::get().to(answering(workflows::http::run)),
        "getWorkflowReplay" => web::get().to(answering(workflows::http::replay)),
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
    use serde_json::Value;

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

    /// The `cursor` parameter of an operation, its `$ref` resolved.
    fn cursor_parameter<'a>(document: &'a Value, operation: &'a Value) -> Option<&'a Value> {
        operation["parameters"].as_array()?.iter().find_map(|parameter| {
            let parameter = match parameter["$ref"].as_str() {
                Some(reference) => document.pointer(reference.trim_start_matches('#'))?,
                None => parameter,
            };
            (parameter["name"] == "cursor").then_some(parameter)
        })
    }

    /// Every list paged by cursor says in the document exactly what its reader takes: a string
    /// (never `null`) of one pattern, which admits the empty value (the first page) and every
    /// cursor the list issues, and nothing the list refuses by its form (`null` as text, white
    /// space, a sign, padding), so schemathesis' positive data is a cursor's form and its
    /// negative data is refused.
    #[test]
    fn every_cursor_parameter_admits_exactly_what_its_list_reads() {
        let document: Value = serde_json::from_str(OPENAPI).expect("the document is JSON");
        let opaque = |text: &str| api::pagination::opaque_cursor_bytes(text).is_some();
        let keyset = |text: &str| platform::cursor::decode(text).is_ok();
        let rows = |text: &str| imports::http::parse_cursor(text).is_some();
        type Reader<'a> = &'a dyn Fn(&str) -> bool;
        let failures = |text: &str| ingest::http::parse_cursor(text).is_some();
        let readers: [(&str, &str, Reader<'_>, String); 7] = [
            ("listEvents", api::pagination::OPAQUE_CURSOR_PATTERN, &opaque, "eyJhIjoxfQ".to_owned()),
            ("listWebhookDeliveries", api::pagination::OPAQUE_CURSOR_PATTERN, &opaque, "eyJ0IjoxfQ".to_owned()),
            ("listEmails", api::pagination::OPAQUE_CURSOR_PATTERN, &opaque, "eyJhIjoxLCJpIjoiZW1fMSJ9".to_owned()),
            (
                "listRecords",
                platform::cursor::PATTERN,
                &keyset,
                platform::cursor::encode(1_795_867_169_300_000, "con_1"),
            ),
            ("listImports", platform::cursor::PATTERN, &keyset, platform::cursor::encode(1_795_867_169_300, "imp.1 a")),
            ("listImportRows", imports::http::ROWS_CURSOR_PATTERN, &rows, "3.17".to_owned()),
            ("listIngestFailures", ingest::http::CURSOR_PATTERN, &failures, "1234".to_owned()),
        ];
        let probes = [
            "",
            " ",
            "\n",
            "null",
            "0",
            "0.0",
            "1.",
            ".a",
            "+1.a",
            "-1.a",
            " 1.a",
            "1.a ",
            "1.a\n",
            "1.a\u{0}",
            "\u{ff11}.a",
            "99999999999999999999.a",
            "2147483648.1",
            "eyJ",
            "eyJhIjoxfQ",
            " eyJhIjoxfQ",
            "eyJhIjoxfQ ",
            "eyJhIjoxfQ==",
            "eyJhIjoxfQ\n",
            "IHsiYSI6MX0",
            "WzEsIngiXQ",
            "bnVsbA",
        ];
        let mut listed = Vec::new();
        for item in document["paths"].as_object().expect("paths").values() {
            for operation in item.as_object().expect("a path item").values() {
                let Some(parameter) = cursor_parameter(&document, operation) else { continue };
                let id = operation["operationId"].as_str().expect("an operationId");
                listed.push(id);
                let (_, pattern, reads, issued) = readers
                    .iter()
                    .find(|(list, ..)| *list == id)
                    .unwrap_or_else(|| panic!("{id} takes a cursor: name its reader here"));
                let expected = serde_json::json!({"type": "string", "pattern": pattern});
                assert_eq!(parameter["schema"], expected, "{id}: a string of the reader's form, never null");
                let form = regex_lite::Regex::new(pattern).expect("the pattern compiles");
                assert!(form.is_match(""), "{id}: the empty value is the first page");
                assert!(api::pagination::given_cursor(&[("cursor".to_owned(), String::new())]).is_none());
                assert!(form.is_match(issued) && reads(issued), "{id} reads what it issues: {issued}");
                for probe in probes {
                    assert!(!reads(probe) || form.is_match(probe), "{id} reads {probe:?}, which {pattern} refuses");
                }
                for refused in ["null", " ", "\n"] {
                    assert!(!form.is_match(refused), "{id}: {refused:?} is not a cursor");
                }
                if let Some(example) = parameter["example"].as_str() {
                    assert!(form.is_match(example), "{id}: its example {example} is of its form");
                }
            }
        }
        listed.sort_unstable();
        let mut named: Vec<&str> = readers.iter().map(|(list, ..)| *list).collect();
        named.sort_unstable();
        assert_eq!(listed, named, "the lists paged by cursor");
    }

    /// The operations scripts/fuzz counts as the contract's (the 58 of decisions D1 and the two
    /// guards): each is in the document, so every other one, an extension, gets the fuzzer's
    /// positive pass.
    #[test]
    fn the_fuzzers_contract_operations_are_the_contracts_58_and_its_guards() {
        let listed: Vec<&str> = include_str!("../../tests/fuzz/contract-operations")
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .collect();
        assert_eq!(listed.len(), 60, "58 operations and 2 guards");
        let mut unique = listed.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), listed.len(), "each once");
        for id in &listed {
            assert!(api::routes::OPERATIONS.iter().any(|operation| operation.id == *id), "{id} is an operation");
        }
        let guards = api::routes::OPERATIONS.iter().filter(|operation| operation.tier == Tier::Guard);
        assert!(guards.into_iter().all(|guard| listed.contains(&guard.id)), "the guards are the contract's");
        let extensions = api::routes::OPERATIONS.iter().filter(|operation| !listed.contains(&operation.id)).count();
        assert_eq!(extensions, api::routes::OPERATIONS.len() - 60);
        assert!(extensions > 0, "extensions exist to fuzz");
    }
}
