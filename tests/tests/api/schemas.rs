//! Schemas and attributes, and offset pagination edge cases.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn schemas_list_filters_by_repeatable_type() {
    let app = TestApp::spawn().await;
    let all = app.get("/schemas", ALPHA_ADMIN).await;
    assert_eq!(all.status, 200);
    assert_eq!(all.body["pagination"]["totalCount"], 5);
    let contacts = app.get("/schemas?type=contact", ALPHA_ADMIN).await;
    assert_eq!(contacts.body["pagination"]["totalCount"], 2);
    assert!(contacts.body["data"].as_array().expect("list").iter().all(|s| s["type"] == "contact"));
    let two = app.get("/schemas?type=object&type=event", ALPHA_ADMIN).await;
    let slugs: Vec<&str> =
        two.body["data"].as_array().expect("list").iter().filter_map(|s| s["slug"].as_str()).collect();
    assert_eq!(slugs.len(), 3);
    assert!(slugs.contains(&"companies") && slugs.contains(&"signup") && slugs.contains(&"purchase"));
    assert_eq!(two.body["pagination"]["totalCount"], 3);
    let bad = app.get("/schemas?type=widget", ALPHA_ADMIN).await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn a_schema_is_found_by_id_or_slug_or_404() {
    let app = TestApp::spawn().await;
    let by_slug = app.get("/schemas/contacts", ALPHA_ADMIN).await;
    assert_eq!(by_slug.status, 200);
    let schema = &by_slug.body["data"];
    assert_eq!(schema["slug"], "contacts");
    assert_eq!(schema["type"], "contact");
    assert!(schema["id"].as_str().expect("id").starts_with("sch_"));
    let by_id = app.get(&format!("/schemas/{}", schema["id"].as_str().expect("id")), ALPHA_ADMIN).await;
    assert_eq!(&by_id.body["data"], schema);
    let missing = app.get("/schemas/missing", ALPHA_ADMIN).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.code(), "schema_not_found");
    assert_eq!(app.get("/schemas/missing/attributes", ALPHA_ADMIN).await.code(), "schema_not_found");
}

#[tokio::test]
async fn attributes_list_base_first_and_never_exposes_expressions() {
    let app = TestApp::spawn().await;
    let response = app.get("/schemas/contacts/attributes?limit=200", ALPHA_ADMIN).await;
    assert_eq!(response.status, 200);
    let attributes = response.body["data"].as_array().expect("list");
    let keys: Vec<&str> = attributes.iter().filter_map(|a| a["key"].as_str()).collect();
    assert_eq!(
        keys,
        [
            "id",
            "source",
            "userId",
            "email",
            "phone",
            "createdAt",
            "updatedAt",
            "firstName",
            "plan",
            "age",
            "score",
            "total"
        ]
    );
    assert_eq!(response.body["pagination"]["totalCount"], 12);
    let email = &attributes[3];
    assert_eq!(email["id"], "base:email");
    assert!(email["sequence"].is_null() && email["createdAt"].is_null() && email["updatedAt"].is_null());
    let plan = &attributes[8];
    assert!(plan["id"].as_str().expect("id").starts_with("att_"));
    assert_eq!(plan["sequence"], 2);
    assert_eq!(plan["definition"]["type"], "select");
    assert_eq!(plan["definition"]["required"], true);
    assert_eq!(plan["writable"], true);
    let score = &attributes[10];
    assert_eq!(score["definition"]["type"], "evaluated");
    assert_eq!(score["writable"], false);
    assert_eq!(score["definition"]["targets"], json!(["age"]));
    let total = &attributes[11];
    assert_eq!(total["definition"]["valueSource"]["type"], "aggregate");
    assert_eq!(total["writable"], false);
    assert!(!response.body.to_string().contains("age * 2"), "generated expressions are never exposed");
    let companies = app.get("/schemas/companies/attributes", ALPHA_ADMIN).await;
    let industry = companies.body["data"].as_array().expect("list").iter().find(|a| a["key"] == "industry").cloned();
    assert_eq!(industry.expect("industry")["definition"]["autoFill"]["enabled"], true);
}

#[tokio::test]
async fn offset_pagination_edges() {
    let app = TestApp::spawn().await;
    let default = app.get("/schemas/contacts/attributes", ALPHA_ADMIN).await;
    assert_eq!(default.body["pagination"]["limit"], 50);
    assert_eq!(default.body["pagination"]["offset"], 0);
    assert!(default.body.get("warnings").is_none());

    let high = app.get("/schemas/contacts/attributes?limit=1000", ALPHA_ADMIN).await;
    assert_eq!(high.status, 200);
    assert_eq!(high.body["pagination"]["limit"], 200);
    assert_eq!(high.body["warnings"][0]["code"], "limit_clamped");

    let zero = app.get("/schemas/contacts/attributes?limit=0", ALPHA_ADMIN).await;
    assert_eq!(zero.body["pagination"]["limit"], 1);
    assert_eq!(zero.body["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(zero.body["pagination"]["hasMore"], true);

    let negative = app.get("/schemas/contacts/attributes?offset=-3", ALPHA_ADMIN).await;
    assert_eq!(negative.body["pagination"]["offset"], 0);
    assert_eq!(negative.body["warnings"][0]["code"], "offset_clamped");

    let max = app.get("/schemas/contacts/attributes?offset=10000", ALPHA_ADMIN).await;
    assert_eq!(max.status, 200);
    assert_eq!(max.body["data"], json!([]));
    assert_eq!(max.body["pagination"]["hasMore"], false);

    let too_far = app.get("/schemas/contacts/attributes?offset=10001", ALPHA_ADMIN).await;
    assert_eq!(too_far.status, 400);
    assert_eq!(too_far.code(), "offset_too_large");
    let records_too_far = app.get("/schemas/contacts/records?offset=20000", ALPHA_ADMIN).await;
    assert_eq!(records_too_far.code(), "offset_too_large");

    let not_number = app.get("/schemas?limit=abc", ALPHA_ADMIN).await;
    assert_eq!(not_number.status, 400);

    let exact = app.get("/schemas/contacts/attributes?limit=12", ALPHA_ADMIN).await;
    assert_eq!(exact.body["pagination"]["hasMore"], false);
    let short = app.get("/schemas/contacts/attributes?limit=11", ALPHA_ADMIN).await;
    assert_eq!(short.body["pagination"]["hasMore"], true);
}
