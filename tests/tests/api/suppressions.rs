//! Suppressions: the five endpoints, admin permission, removability, global ones listed.

use serde_json::{Value, json};

use crate::helpers::*;

async fn post(app: &TestApp, path: &str, body: Value) -> TestResponse {
    app.post(path, ALPHA_ADMIN, &body).await
}

async fn list(app: &TestApp, query: &str) -> TestResponse {
    app.get(&format!("/contacts/suppressions{query}"), ALPHA_ADMIN).await
}

#[tokio::test]
async fn suppressions_need_the_admin_permission() {
    let app = TestApp::spawn().await;
    let member = app.get("/contacts/suppressions", ALPHA_MEMBER).await;
    assert_eq!(member.status, 403);
    assert!(member.body["error"]["message"].as_str().expect("message").contains("admin"));
    let write =
        app.post("/contacts/suppressions", ALPHA_MEMBER, &json!({"identifier": "a@b.io", "reason": "manual"})).await;
    assert_eq!(write.status, 403);
    // non-paid admins hold the admin permission.
    assert_eq!(app.get("/contacts/suppressions", ALPHA_NON_PAID_ADMIN).await.status, 200);
    let created = app
        .post("/contacts/suppressions", ALPHA_NON_PAID_ADMIN, &json!({"identifier": "npa@b.io", "reason": "manual"}))
        .await;
    assert_eq!(created.status, 201);
}

#[tokio::test]
async fn create_conflicts_on_the_same_reason_but_manual_and_legal_coexist() {
    let app = TestApp::spawn().await;
    let created =
        post(&app, "/contacts/suppressions", json!({"identifier": "Stop@Example.com", "reason": "manual"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let data = &created.body["data"];
    assert!(data["id"].as_str().expect("id").starts_with("sup_"));
    assert_eq!((data["identifier"].as_str(), data["reason"].as_str()), (Some("stop@example.com"), Some("manual")));
    assert_eq!((data["scope"].as_str(), data["removable"].as_bool()), (Some("space"), Some(true)));
    let again =
        post(&app, "/contacts/suppressions", json!({"identifier": "stop@example.com", "reason": "manual"})).await;
    assert_eq!((again.status, again.code().as_str()), (409, Some("suppression_already_exists")));
    let legal =
        post(&app, "/contacts/suppressions", json!({"identifier": "stop@example.com", "reason": "legal"})).await;
    assert_eq!(legal.status, 201);
    // The idempotency header plays no part on single create.
    let keyed = app
        .send(
            app.request(reqwest::Method::POST, "/contacts/suppressions", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", "k1")
                .json(&json!({"identifier": "stop@example.com", "reason": "legal"})),
        )
        .await;
    assert_eq!(keyed.status, 409);
    for bad in [json!({"identifier": "nope", "reason": "manual"}), json!({"identifier": "a@b.io", "reason": "bounce"})]
    {
        assert_eq!(post(&app, "/contacts/suppressions", bad).await.status, 400);
    }
    // Another space may suppress the same identifier.
    assert_eq!(
        app.post("/contacts/suppressions", MULTI_BETA, &json!({"identifier": "stop@example.com", "reason": "manual"}))
            .await
            .status,
        201
    );
}

#[tokio::test]
async fn list_is_newest_first_filters_by_identifier_and_includes_global_ones() {
    let app = TestApp::spawn().await;
    for email in ["one@example.com", "two@example.com", "three@example.com"] {
        assert_eq!(
            post(&app, "/contacts/suppressions", json!({"identifier": email, "reason": "manual"})).await.status,
            201
        );
    }
    let all = list(&app, "").await;
    assert_eq!(all.status, 200);
    // three of ours, the authored bounce, and the global one; none of beta's.
    assert_eq!(all.body["pagination"]["totalCount"], 5);
    let identifiers: Vec<&str> =
        all.body["data"].as_array().expect("list").iter().filter_map(|s| s["identifier"].as_str()).collect();
    assert_eq!(&identifiers[..3], ["three@example.com", "two@example.com", "one@example.com"]);
    assert!(identifiers.contains(&"global@example.com") && identifiers.contains(&"bounced@example.com"));
    let global = all.body["data"]
        .as_array()
        .expect("list")
        .iter()
        .find(|s| s["identifier"] == "global@example.com")
        .cloned()
        .expect("global");
    assert_eq!((global["scope"].as_str(), global["removable"].as_bool()), (Some("global"), Some(false)));

    let filtered = list(&app, "?identifier=TWO@example.com").await;
    assert_eq!(filtered.body["pagination"]["totalCount"], 1);
    assert_eq!(filtered.body["data"][0]["identifier"], "two@example.com");
    let page = list(&app, "?limit=2&offset=1").await;
    assert_eq!(page.body["pagination"], json!({"limit": 2, "offset": 1, "totalCount": 5, "hasMore": true}));
    let beta = app.get("/contacts/suppressions", MULTI_BETA).await;
    assert_eq!(beta.body["pagination"]["totalCount"], 1, "beta sees only the global one");
}

#[tokio::test]
async fn batch_create_reports_each_item_and_a_summary() {
    let app = TestApp::spawn().await;
    post(&app, "/contacts/suppressions", json!({"identifier": "old@example.com", "reason": "manual"})).await;
    let response = post(
        &app,
        "/contacts/suppressions/batch",
        json!({"suppressions": [
            {"identifier": "new@example.com", "reason": "manual"},
            {"identifier": "old@example.com", "reason": "manual"},
            {"identifier": "not-an-email", "reason": "manual"},
            {"identifier": "new@example.com", "reason": "manual"},
            {"identifier": "old@example.com", "reason": "legal"}
        ]}),
    )
    .await;
    assert_eq!(response.status, 200, "{:?}", response.body);
    let results = response.body["data"]["results"].as_array().expect("results");
    let statuses: Vec<&str> = results.iter().filter_map(|r| r["status"].as_str()).collect();
    assert_eq!(statuses[1], "exists");
    assert_eq!(statuses[2], "invalid");
    assert_eq!(statuses[4], "created");
    let mut duplicated = [statuses[0], statuses[3]];
    duplicated.sort_unstable();
    assert_eq!(duplicated, ["created", "exists"], "the same item twice in one batch is created once");
    assert_eq!(response.body["data"]["summary"], json!({"created": 2, "exists": 2, "failed": 1}));
    assert!(results[4]["suppression"]["id"].as_str().is_some());
    for bad in [
        json!({"suppressions": []}),
        json!({"suppressions": vec![json!({"identifier": "a@b.io", "reason": "manual"}); 101]}),
        json!({}),
    ] {
        assert_eq!(post(&app, "/contacts/suppressions/batch", bad).await.status, 400);
    }
    // Only the one field: a typo is not silently ignored.
    let typo = json!({"suppressions": [{"identifier": "a@b.io", "reason": "manual"}], "onError": "abort"});
    let refused = post(&app, "/contacts/suppressions/batch", typo).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("unknown_field")), "{:?}", refused.body);
    assert_eq!(refused.body["error"]["issues"][0]["key"], "onError");
    let refused = post(&app, "/contacts/suppressions/batch-remove", json!({"ids": ["sup_1"], "x": 1})).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("unknown_field")));
}

#[tokio::test]
async fn only_manual_and_legal_of_the_callers_space_can_be_removed() {
    let app = TestApp::spawn().await;
    let manual =
        post(&app, "/contacts/suppressions", json!({"identifier": "rm@example.com", "reason": "manual"})).await;
    let manual_id = manual.body["data"]["id"].as_str().expect("id").to_owned();
    let all = list(&app, "").await;
    let id_of = |identifier: &str| {
        all.body["data"]
            .as_array()
            .expect("list")
            .iter()
            .find(|s| s["identifier"] == identifier)
            .and_then(|s| s["id"].as_str())
            .expect("id")
            .to_owned()
    };
    let (bounce_id, global_id) = (id_of("bounced@example.com"), id_of("global@example.com"));
    let beta = app
        .post("/contacts/suppressions", MULTI_BETA, &json!({"identifier": "b@example.com", "reason": "manual"}))
        .await;
    let beta_id = beta.body["data"]["id"].as_str().expect("id").to_owned();

    let delete = |id: String| {
        let request = app.request(reqwest::Method::DELETE, &format!("/contacts/suppressions/{id}"), Some(ALPHA_ADMIN));
        app.send(request)
    };
    let removed = delete(manual_id.clone()).await;
    assert_eq!(removed.status, 200);
    assert_eq!(removed.body["data"], json!({"id": manual_id, "deleted": true}));
    assert_eq!(delete(manual_id.clone()).await.code(), "suppression_not_found");
    assert_eq!(delete("sup_missing".into()).await.status, 404);
    assert_eq!(delete(beta_id.clone()).await.status, 404, "another space's suppression is not found");
    assert_eq!(delete(bounce_id.clone()).await.code(), "suppression_not_removable");
    assert_eq!(delete(global_id.clone()).await.code(), "suppression_not_removable");
    // Removed means gone from the list, and the identifier can be suppressed again.
    assert_eq!(list(&app, "?identifier=rm@example.com").await.body["pagination"]["totalCount"], 0);
    assert_eq!(
        post(&app, "/contacts/suppressions", json!({"identifier": "rm@example.com", "reason": "manual"})).await.status,
        201
    );

    let legal = post(&app, "/contacts/suppressions", json!({"identifier": "l@example.com", "reason": "legal"})).await;
    let legal_id = legal.body["data"]["id"].as_str().expect("id").to_owned();
    let batch = post(
        &app,
        "/contacts/suppressions/batch-remove",
        json!({"ids": [legal_id, bounce_id, global_id, beta_id, "sup_nope", 7]}),
    )
    .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    let statuses: Vec<&str> = batch.body["data"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["status"].as_str())
        .collect();
    assert_eq!(statuses, ["removed", "not_removable", "not_removable", "not_found", "not_found", "invalid"]);
    assert_eq!(batch.body["data"]["summary"], json!({"removed": 1, "failed": 5}));
    assert_eq!(post(&app, "/contacts/suppressions/batch-remove", json!({"ids": []})).await.status, 400);
}
