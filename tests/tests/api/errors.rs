//! The error envelope everywhere: routing, methods, bodies, content types.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn unknown_routes_are_404_and_wrong_methods_405_in_the_envelope() {
    let app = TestApp::spawn().await;
    let unknown = app.get("/nothing-here", ALPHA_ADMIN).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.body["error"]["type"], "invalid_request_error");
    // A POST to a read-only path reaches the command service, which knows the whole API.
    let wrong = app.post("/schemas", ALPHA_ADMIN, &json!({})).await;
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.body["error"]["type"], "invalid_request_error");
    let wrong_get = app.get("/contacts/suppressions/sup_1", ALPHA_ADMIN).await;
    assert_eq!(wrong_get.status, 405);
}

#[tokio::test]
async fn patch_and_delete_on_events_always_answer_405() {
    let app = TestApp::spawn().await;
    for method in [reqwest::Method::PATCH, reqwest::Method::DELETE] {
        for key in [Some(ALPHA_ADMIN), None] {
            let response = app.send(app.request(method.clone(), "/events/ev_123", key).json(&json!({}))).await;
            assert_eq!(response.status, 405, "{method} with key {key:?}");
            assert!(response.body["error"].is_object());
        }
    }
}

#[tokio::test]
async fn malformed_json_is_400() {
    let app = TestApp::spawn().await;
    let request = app
        .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
        .header("content-type", "application/json")
        .body("{\"email\": ");
    let response = app.send(request).await;
    assert_eq!(response.status, 400);
    assert_eq!(response.code(), "malformed_json");
    let empty = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
                .header("content-type", "application/json"),
        )
        .await;
    assert_eq!(empty.code(), "malformed_json");
}

#[tokio::test]
async fn bodies_over_10_mb_are_413() {
    let app = TestApp::spawn().await;
    let big = format!("{{\"firstName\": \"{}\"}}", "a".repeat(10 * 1024 * 1024 + 10));
    let request = app
        .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
        .header("content-type", "application/json")
        .body(big);
    let response = app.send(request).await;
    assert_eq!(response.status, 413);
    assert_eq!(response.body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn unsupported_content_type_charset_or_encoding_is_415() {
    let app = TestApp::spawn().await;
    for (name, value) in [
        ("content-type", "text/plain"),
        ("content-type", "application/json; charset=latin1"),
        ("content-encoding", "gzip"),
    ] {
        let mut request = app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN)).body("{}");
        if name == "content-encoding" {
            request = request.header("content-type", "application/json");
        }
        let response = app.send(request.header(name, value)).await;
        assert_eq!(response.status, 415, "{name}: {value}");
        assert!(response.body["error"]["message"].is_string());
    }
    let utf8 = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
                .header("content-type", "application/json; charset=UTF-8")
                .body("{}"),
        )
        .await;
    assert_eq!(utf8.status, 201);
}

#[tokio::test]
async fn every_operation_of_the_route_table_is_served_and_the_guards_answer_405() {
    let app = TestApp::spawn().await;
    let document = app.send(app.request(reqwest::Method::GET, "/openapi.json", None)).await;
    assert_eq!((document.status, document.body["openapi"].as_str()), (200, Some("3.1.0")));
    for operation in api::routes::OPERATIONS {
        let path =
            operation.path.replace("{schema}", "contacts").replace("{id}", "x_1").replace("{operationId}", "op_1");
        let method = reqwest::Method::from_bytes(operation.method.as_bytes()).expect("a method");
        let response = app.send(app.request(method, &path, Some(ALPHA_ADMIN)).json(&json!({}))).await;
        let code = response.code().as_str().unwrap_or_default().to_owned();
        if operation.tier == api::routes::Tier::Guard {
            assert_eq!((response.status, code.as_str()), (405, "method_not_allowed"), "{operation:?}");
        } else {
            assert!(
                code != "route_not_found" && code != "method_not_allowed",
                "{} {} fell through to the fallback: {:?}",
                operation.method,
                path,
                response.body
            );
        }
    }
}

/// `Allow` names exactly the methods the served document lists for the path: a client (or
/// schemathesis' `allow_header_conformance`) reading both sees one set, the guards' `PATCH`
/// and `DELETE` on `/events/{schema}` included.
#[tokio::test]
async fn every_path_answers_an_unserved_method_with_allow_naming_exactly_the_methods_the_document_lists() {
    let app = TestApp::spawn().await;
    let document = app.send(app.request(reqwest::Method::GET, "/openapi.json", None)).await;
    let paths = document.body["paths"].as_object().expect("the document's paths");
    let mut templates: Vec<&str> = api::routes::OPERATIONS.iter().map(|operation| operation.path).collect();
    templates.sort_unstable();
    templates.dedup();
    assert_eq!(templates.len(), paths.len(), "one path of the document per template");
    for template in templates {
        let documented: std::collections::BTreeSet<String> = paths[template]
            .as_object()
            .unwrap_or_else(|| panic!("{template} is in the document"))
            .keys()
            .filter(|key| ["get", "put", "post", "patch", "delete"].contains(&key.as_str()))
            .map(|method| method.to_uppercase())
            .collect();
        let path = template
            .replace("{schema}", "contacts")
            .replace("{id}", "x_1")
            .replace("{operationId}", "op_1")
            .replace("{runId}", "run_1")
            .replace("{deliveryId}", "del_1")
            .replace("{token}", "t");
        // OPTIONS is served by no path, on the command service (writes) and the query service;
        // a guard's own method is answered 405 with the same `Allow`.
        let guards = api::routes::OPERATIONS
            .iter()
            .filter(|operation| operation.path == template && operation.tier == api::routes::Tier::Guard)
            .map(|operation| reqwest::Method::from_bytes(operation.method.as_bytes()).expect("a method"));
        let methods: Vec<reqwest::Method> = std::iter::once(reqwest::Method::OPTIONS).chain(guards).collect();
        for base in [&app.command_url, &app.query_url] {
            for method in &methods {
                let request = app.http.request(method.clone(), format!("{base}{path}")).bearer_auth(ALPHA_ADMIN);
                let response = app.send(request).await;
                assert_eq!(response.status, 405, "{method} {path}");
                let allow: std::collections::BTreeSet<String> = response
                    .header("allow")
                    .unwrap_or_default()
                    .split(", ")
                    .filter(|method| !method.is_empty())
                    .map(str::to_owned)
                    .collect();
                assert_eq!(allow, documented, "Allow of {method} {path} names exactly the document's methods");
            }
        }
    }
}

/// The statements of `text` (comments dropped) that wait on something and answer its failure
/// as a defect: an `.await` whose result goes straight to a `map_err` naming `internal`.
fn database_failures_answered_as_defects(text: &str) -> Vec<String> {
    let code: String =
        text.lines().map(|line| line.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join(" ");
    code.split(';')
        .map(|statement| statement.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|statement| {
            let joined = statement.replace(". ", ".").replace(" .", ".");
            joined
                .split(".await.map_err(")
                .skip(1)
                .any(|mapping| mapping.split(')').next().is_some_and(|argument| argument.contains("internal")))
        })
        .collect()
}

/// A read the services wait on fails as the database fails: `ApiError::from` classifies it
/// (503 when the database is away for a moment), so no handler or load answers it as a
/// defect (500 `internal_error`). The fault harness met two that did (a workflow trigger and,
/// before, 28 loads); this holds every service's source to it.
#[test]
fn no_service_answers_a_failure_it_waited_on_as_a_defect() {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace");
    let mut files = Vec::new();
    for folder in ["command-service/src", "query-service/src", "shared/api/src"] {
        crate::layering::sources(&workspace.join(folder), &mut files);
    }
    assert!(files.len() > 100, "the sources were read: {}", files.len());
    let found: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("a source file");
            let shown = path.strip_prefix(workspace).unwrap_or(path).display().to_string();
            database_failures_answered_as_defects(&text)
                .into_iter()
                .map(move |statement| format!("{shown}: {statement}"))
        })
        .collect();
    assert!(found.is_empty(), "failures waited on answered as internal_error:\n{}", found.join("\n"));
    let planted = "let found = store::by_reference(&client, id)\n    .await\n    .map_err(|error| internal(&error))?;\n\
                   for stored in read_streams(&client).await? { stored.decode().map_err(|e| ApiError::internal(&e))?; }\n\
                   let rows = client.query(&statement, &[]).await.map_err(ApiError::from)?;";
    assert_eq!(database_failures_answered_as_defects(planted).len(), 1, "the check sees the planted one only");
}
