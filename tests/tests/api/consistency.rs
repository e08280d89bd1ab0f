//! Read-your-writes: a GET after a write by the same key sees it, and a consistency token
//! carries that guarantee to another key.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn create_then_get_and_list_sees_the_write_every_time() {
    let app = TestApp::spawn().await;
    for index in 0..40 {
        let created = app
            .post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": format!("ryw{index}@example.com")}))
            .await;
        assert_eq!(created.status, 201);
        let id = created.body["data"]["id"].as_str().expect("id");
        let fetched = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await;
        assert_eq!(fetched.status, 200, "iteration {index}: {:?}", fetched.body);
        assert!(fetched.body.get("warnings").is_none());
        let position: i64 = fetched.header("projection-position").expect("position").parse().expect("integer");
        let token: i64 = created.header("consistency-token").expect("token").parse().expect("integer");
        assert!(position >= token);
        let list = app.get("/schemas/contacts/records?limit=1&offset=0", ALPHA_ADMIN).await;
        assert_eq!(list.body["pagination"]["totalCount"], index + 1, "iteration {index}");
    }
}

#[tokio::test]
async fn a_consistency_token_lets_another_key_read_the_write() {
    // The read is sent before any projector exists, so without the wait it would answer 404 at
    // once; the wait is long enough that a projector started on a loaded machine (a process
    // start, its catch-up and, on a standby, the replay) arrives within it.
    let options =
        Options { consistency_wait: Some(std::time::Duration::from_secs(30)), ..Options::without_projector() };
    let app = TestApp::spawn_with(options).await;
    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "token@example.com"})).await;
    assert_eq!(created.status, 201);
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let token = created.header("consistency-token").expect("token").to_owned();
    // No projector yet: a read with the token waits, then a projector starts and it succeeds.
    let url = app.query_url.clone();
    let reader = tokio::spawn({
        let client = app.http.clone();
        let id = id.clone();
        async move {
            client
                .get(format!("{url}/schemas/contacts/records/{id}"))
                .bearer_auth(ALPHA_MEMBER)
                .header("Consistency-Token", token)
                .send()
                .await
                .expect("sent")
                .status()
                .as_u16()
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let _projector = spawn_binary("projector", &["run"], &app.database_url, &[]);
    assert_eq!(reader.await.expect("reader"), 200);
    let invalid = app
        .send(app.request(reqwest::Method::GET, "/schemas", Some(ALPHA_MEMBER)).header("Consistency-Token", "abc"))
        .await;
    assert_eq!(invalid.status, 400);
}

#[tokio::test]
async fn a_read_that_cannot_catch_up_says_so() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let _projector = spawn_binary("projector", &["run"], &app.database_url, &[]);
    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({})).await;
    assert_eq!(created.status, 201);
    drop(_projector);
    // The projector is gone; a token far ahead cannot be reached, and the answer warns.
    let response = app
        .send(app.request(reqwest::Method::GET, "/schemas", Some(ALPHA_MEMBER)).header("Consistency-Token", "999999"))
        .await;
    assert_eq!(response.status, 200);
    assert_eq!(response.body["warnings"][0]["code"], "stale_read");
}

#[tokio::test]
async fn reads_waiting_for_the_read_models_do_not_starve_the_pool() {
    // A query service with two connections and six reads that must wait for the caller's last
    // write: a waiting read holds no connection, so all of them answer once the read models
    // catch up (holding one each, they took the pool and their own refreshes timed out).
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let wait =
        [("APP__DATABASE__POOL_SIZE", "2".to_owned()), ("APP__READS__CONSISTENCY_WAIT_MILLIS", "20000".to_owned())];
    let (_query, urls) = spawn_servers(&app, "query-service", &[], 1, &wait).await;
    let created = app.post("/schemas/contacts/records", ALPHA_ADMIN, &json!({"email": "wait@example.com"})).await;
    assert_eq!(created.status, 201);
    let id = created.body["data"]["id"].as_str().expect("id").to_owned();
    let reads: Vec<_> = (0..6)
        .map(|_| {
            let request = app
                .http
                .get(format!("{}/schemas/contacts/records/{id}", urls[0]))
                .header("Authorization", format!("Bearer {ALPHA_ADMIN}"));
            tokio::spawn(async move { request.send().await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let _projector = spawn_binary("projector", &["run"], &app.database_url, &[]);
    for read in reads {
        let response = read.await.expect("task").expect("response");
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.expect("json");
        assert_eq!(body["data"]["email"], "wait@example.com");
        assert!(body.get("warnings").is_none_or(|w| w.as_array().is_none_or(Vec::is_empty)), "{body}");
    }
}
