//! The audit trail: consent changes and suppressions of a contact, from the log.

use serde_json::{Value, json};

use crate::helpers::*;

/// The fixture plus a contact schema with consent fields in alpha.
fn workspace_with_consent() -> String {
    let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("fixture parses");
    let schemas = workspace["spaces"][0]["schemas"].as_array_mut().expect("alpha's schemas");
    schemas.push(json!({
        "slug": "subscribers",
        "name": "Subscribers",
        "type": "contact",
        "attributes": [
            { "key": "firstName", "definition": { "type": "string" } },
            { "key": "emailConsent", "definition": { "type": "boolean", "consent": { "channel": "email" } } },
            { "key": "smsConsent", "definition": { "type": "boolean", "consent": { "channel": "sms" } } }
        ]
    }));
    workspace.to_string()
}

async fn trail(app: &TestApp, id: &str, query: &str) -> TestResponse {
    let page = app.get(&format!("/schemas/subscribers/records/{id}/audit-trail{query}"), ALPHA_ADMIN).await;
    if let Some(entries) = page.body["data"].as_array() {
        assert_conforms("AuditTrailEntry", entries);
    }
    page
}

async fn patch(app: &TestApp, id: &str, body: Value) {
    let response = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/subscribers/records/{id}"), Some(ALPHA_ADMIN))
                .json(&body),
        )
        .await;
    assert_eq!(response.status, 200, "{:?}", response.body);
}

fn types(page: &TestResponse) -> Vec<String> {
    page.body["data"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| format!("{}:{}", entry["type"].as_str().unwrap_or("?"), entry["channel"].as_str().unwrap_or("?")))
        .collect()
}

#[tokio::test]
async fn the_trail_lists_consent_changes_and_suppressions_newest_first() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_consent(), true).await;
    let created = app
        .post(
            "/schemas/subscribers/records",
            ALPHA_ADMIN,
            &json!({"email": "trail@example.com", "firstName": "T", "emailConsent": true}),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    patch(&app, &id, json!({"firstName": "Not consent"})).await;
    patch(&app, &id, json!({"emailConsent": false})).await;
    patch(&app, &id, json!({"smsConsent": true})).await;
    let suppression = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "Trail@Example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppression.status, 201);
    let suppression_id = suppression.body["data"]["id"].as_str().expect("id").to_owned();
    let removed = app
        .send(app.request(
            reqwest::Method::DELETE,
            &format!("/contacts/suppressions/{suppression_id}"),
            Some(ALPHA_ADMIN),
        ))
        .await;
    assert_eq!(removed.status, 200);
    // Someone else's suppression is not in this contact's trail.
    app.post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "other@example.com", "reason": "legal"}))
        .await;

    let page = trail(&app, &id, "").await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    assert_eq!(
        types(&page),
        [
            "suppression_removed:email",
            "suppression_added:email",
            "consent_changed:sms",
            "consent_changed:email",
            "consent_changed:email",
        ]
    );
    let entries = page.body["data"].as_array().expect("entries");
    assert_eq!(entries[1]["suppressionId"], suppression_id.as_str());
    assert_eq!(
        (entries[1]["reason"].as_str(), entries[1]["identifier"].as_str()),
        (Some("manual"), Some("trail@example.com"))
    );
    assert_eq!((&entries[3]["previousValue"], &entries[3]["value"]), (&json!(true), &json!(false)));
    assert_eq!((&entries[4]["previousValue"], &entries[4]["value"]), (&Value::Null, &json!(true)));
    assert_eq!(entries[4]["attribute"], "emailConsent");
    assert!(entries.iter().all(|entry| entry["occurredAt"].is_string()));
    // Entry ids carry a type prefix like every other identifier, and are distinct.
    let ids: std::collections::BTreeSet<&str> = entries.iter().filter_map(|entry| entry["id"].as_str()).collect();
    assert_eq!(ids.len(), entries.len(), "{entries:?}");
    for id in &ids {
        let body = id.strip_prefix("aud_").expect("an audit entry id starts with aud_");
        assert!(body.len() == 32 && body.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    assert_eq!(page.body["pagination"]["totalCount"], 5);

    let sms = trail(&app, &id, "?channel=sms").await;
    assert_eq!(types(&sms), ["consent_changed:sms"]);
    assert_eq!(sms.body["pagination"]["totalCount"], 1);
    let email = trail(&app, &id, "?channel=email&limit=2&offset=1").await;
    assert_eq!(types(&email), ["suppression_added:email", "consent_changed:email"]);
    assert_eq!(
        (email.body["pagination"]["totalCount"].as_i64(), email.body["pagination"]["hasMore"].as_bool()),
        (Some(4), Some(true))
    );
    let bad = trail(&app, &id, "?channel=fax").await;
    assert_eq!((bad.status, bad.code().as_str()), (400, Some("invalid_query_parameter")));
}

#[tokio::test]
async fn authored_provider_suppressions_of_the_address_appear() {
    let app = TestApp::spawn().await;
    // The fixture suppresses bounced@example.com for alpha (a provider bounce).
    let contact = app.create_contact(&json!({"email": "bounced@example.com"})).await;
    let id = contact["id"].as_str().expect("id");
    let page = app.get(&format!("/schemas/contacts/records/{id}/audit-trail"), ALPHA_ADMIN).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    let entries = page.body["data"].as_array().expect("entries");
    assert_conforms("AuditTrailEntry", entries);
    assert!(
        entries.iter().any(|entry| entry["type"] == "suppression_added" && entry["reason"] == "bounce"),
        "{entries:?}"
    );
}

#[tokio::test]
async fn the_trail_answers_404_for_unknown_schemas_records_and_object_schemas() {
    let app = TestApp::spawn().await;
    let contact = app.create_contact(&json!({"email": "who@example.com"})).await;
    let id = contact["id"].as_str().expect("id");
    let cases = [
        (format!("/schemas/nope/records/{id}/audit-trail"), "schema_not_found"),
        (format!("/schemas/companies/records/{id}/audit-trail"), "schema_not_found"),
        ("/schemas/contacts/records/con_unknown/audit-trail".to_owned(), "record_not_found"),
        (format!("/schemas/leads/records/{id}/audit-trail"), "record_not_found"),
    ];
    for (path, code) in cases {
        let response = app.get(&path, ALPHA_ADMIN).await;
        assert_eq!((response.status, response.code().as_str()), (404, Some(code)), "{path}");
    }
    // Another space never sees it.
    let other = app.get(&format!("/schemas/contacts/records/{id}/audit-trail"), MULTI_BETA).await;
    assert_eq!(other.status, 404);
    // A deleted contact has no trail.
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)))
        .await;
    assert_eq!(deleted.status, 200);
    let gone = app.get(&format!("/schemas/contacts/records/{id}/audit-trail"), ALPHA_ADMIN).await;
    assert_eq!((gone.status, gone.code().as_str()), (404, Some("record_not_found")));
}
