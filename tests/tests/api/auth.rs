//! The contract's Authentication section, all of it.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn missing_and_unknown_keys_are_401_invalid_api_key() {
    let app = TestApp::spawn().await;
    let missing = app.send(app.request(reqwest::Method::GET, "/me", None)).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.code(), "invalid_api_key");
    assert_eq!(missing.body["error"]["message"], "no key provided");
    assert_eq!(missing.body["error"]["type"], "invalid_request_error");
    let challenge = |response: &TestResponse| {
        response.headers.get("www-authenticate").and_then(|value| value.to_str().ok()).map(str::to_owned)
    };
    assert_eq!(challenge(&missing).as_deref(), Some("Bearer realm=\"api\""), "a 401 names the scheme");

    for key in ["sk_test_unknown_key_00000000000000", "garbage", ALPHA_REVOKED] {
        let unknown = app.get("/me", key).await;
        assert_eq!(unknown.status, 401, "key {key}");
        assert_eq!(unknown.code(), "invalid_api_key");
        assert_eq!(unknown.body["error"]["message"], "invalid key");
        assert_eq!(challenge(&unknown).as_deref(), Some("Bearer realm=\"api\", error=\"invalid_token\""), "key {key}");
    }
    // A header that is not `Bearer <key>` says what it should look like, with the same code.
    for header in [
        ALPHA_MEMBER.to_owned(),
        format!("Token {ALPHA_MEMBER}"),
        "Bearer ".to_owned(),
        "Basic Zm9vOmJhcg==".to_owned(),
    ] {
        let bare = app.send(app.request(reqwest::Method::GET, "/me", None).header("authorization", &header)).await;
        assert_eq!(bare.status, 401, "{header}");
        assert_eq!(bare.code(), "invalid_api_key", "{header}");
        assert_eq!(
            bare.body["error"]["message"], "the Authorization header must be `Authorization: Bearer <key>`",
            "{header}"
        );
        assert_eq!(challenge(&bare).as_deref(), Some("Bearer realm=\"api\", error=\"invalid_token\""), "{header}");
    }
    let create = app.post("/schemas/contacts/records", "sk_test_unknown_key_00000000000000", &json!({})).await;
    assert_eq!(create.status, 401);
    let no_key = app.send(app.request(reqwest::Method::POST, "/schemas/contacts/records", None).json(&json!({}))).await;
    assert_eq!(no_key.body["error"]["message"], "no key provided");
}

#[tokio::test]
async fn me_has_the_exact_shape_for_a_bound_key() {
    let app = TestApp::spawn().await;
    let me = app.get("/me", ALPHA_MEMBER).await;
    assert_eq!(me.status, 200, "{:?}", me.body);
    let data = &me.body["data"];
    let keys: Vec<&String> = data.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["apiKey", "role", "space", "user"]);
    assert_eq!(data["apiKey"]["name"], "alpha member");
    assert_eq!(data["apiKey"]["keyDisplay"], "sk_...0004");
    assert!(data["apiKey"]["id"].as_str().expect("id").starts_with("key_"));
    assert!(data["apiKey"]["createdAt"].as_str().expect("createdAt").ends_with('Z'));
    assert_eq!(data["user"]["email"], "member@alpha.test");
    assert_eq!(data["user"]["name"], "Alpha Member");
    assert!(data["user"]["id"].as_str().expect("id").starts_with("usr_"));
    assert_eq!(data["space"]["slug"], "alpha");
    assert_eq!(data["space"]["name"], "Alpha");
    assert!(data["space"]["id"].as_str().expect("id").starts_with("spc_"));
    assert_eq!(data["role"]["name"], "member");
    assert!(data["role"]["label"].is_string() && data["role"]["description"].is_string());
    assert!(!me.body.to_string().contains("sk_test_alpha_member"), "the secret never comes back");
}

#[tokio::test]
async fn me_works_for_any_valid_key_with_null_space_and_role_when_unbound() {
    let app = TestApp::spawn().await;
    for key in [MULTI_UNBOUND, NOBODY_UNBOUND, SOLO_UNBOUND] {
        let me = app.get("/me", key).await;
        assert_eq!(me.status, 200, "{key}: {:?}", me.body);
        assert!(me.body["data"]["space"].is_null());
        assert!(me.body["data"]["role"].is_null());
    }
    // A bound key whose owner is no member still identifies itself: /me resolves no membership.
    let me = app.get("/me", NOBODY_BOUND).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.body["data"]["space"]["slug"], "alpha");
    assert!(me.body["data"]["role"].is_null());
}

#[tokio::test]
async fn space_resolution_follows_the_contract() {
    let app = TestApp::spawn().await;
    let out_of_scope = app.get("/schemas", NOBODY_BOUND).await;
    assert_eq!(out_of_scope.status, 403);
    assert_eq!(out_of_scope.body["error"]["message"], "Space is out of scope");

    let several = app.get("/schemas", MULTI_UNBOUND).await;
    assert_eq!(several.status, 400);
    assert_eq!(several.code(), "unknown_space");

    let none = app.get("/schemas", NOBODY_UNBOUND).await;
    assert_eq!(none.status, 403);

    // The only membership of an unbound key's owner is used.
    let solo = app.get("/schemas", SOLO_UNBOUND).await;
    assert_eq!(solo.status, 200);
    let slugs: Vec<&str> =
        solo.body["data"].as_array().expect("list").iter().filter_map(|s| s["slug"].as_str()).collect();
    assert_eq!(slugs, ["accounts", "visit", "contacts"]);

    // A bound key acts in its space even when its owner has several.
    let beta = app.get("/schemas", MULTI_BETA).await;
    assert_eq!(beta.status, 200);
    assert_eq!(beta.body["pagination"]["totalCount"], 3);
}

#[tokio::test]
async fn roles_grant_exactly_their_permissions() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "role@example.com"});
    // member: read and write.
    assert_eq!(app.get("/schemas", ALPHA_MEMBER).await.status, 200);
    assert_eq!(app.post("/schemas/contacts/records", ALPHA_MEMBER, &body).await.status, 201);
    // non-paid admin: read and admin, no write.
    assert_eq!(app.get("/schemas", ALPHA_NON_PAID_ADMIN).await.status, 200);
    let denied = app.post("/schemas/contacts/records", ALPHA_NON_PAID_ADMIN, &json!({"email": "x@example.com"})).await;
    assert_eq!(denied.status, 403);
    assert!(denied.body["error"]["message"].as_str().expect("message").contains("write"), "{:?}", denied.body);
    // admin: everything.
    assert_eq!(
        app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "y@example.com"})).await.status,
        201
    );
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_a_second() {
    let app = TestApp::spawn().await;
    assert_eq!(app.get("/me", ALPHA_ADMIN_SECOND).await.status, 200);
    assert_eq!(app.post("/schemas/contacts/records", ALPHA_ADMIN_SECOND, &json!({})).await.status, 201);
    let revoked = WORKSPACE.replace(
        r#"{ "name": "alpha admin second", "space": "alpha", "secret": "sk_test_alpha_admin_00000000000002" }"#,
        r#"{ "name": "alpha admin second", "space": "alpha", "secret": "sk_test_alpha_admin_00000000000002", "revoked": true }"#,
    );
    assert_ne!(revoked, WORKSPACE, "the fixture names the key");
    let report = app.apply_workspace(&revoked, false).await;
    assert_eq!(report.events, 1);
    // From the moment the catalog read model has the revocation: the keys' cache
    // (APP__AUTH__CACHE_MILLIS, 500 ms) is the only delay after that, in every process.
    command_service::authoring::wait_for_catalog(&app.pool, report.position, Duration::from_secs(20))
        .await
        .expect("the catalog has the revocation");
    let revoked_at = Instant::now();
    loop {
        let read = app.get("/me", ALPHA_ADMIN_SECOND).await.status;
        let write = app.post("/schemas/contacts/records", ALPHA_ADMIN_SECOND, &json!({})).await.status;
        if read == 401 && write == 401 {
            break;
        }
        assert!(revoked_at.elapsed() < Duration::from_secs(1), "revoked key still works after a second");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
