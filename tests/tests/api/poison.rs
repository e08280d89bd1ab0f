//! A poison event (one a read model cannot apply) stops only its own space: it is
//! dead-lettered, the space is held back loudly, other spaces keep becoming readable, erasure
//! still completes, an operator retries after a fix, and a rebuild does the same.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

async fn space_of(app: &TestApp, key: &str) -> String {
    let me = app.get("/me", key).await;
    me.body["data"]["space"]["id"].as_str().expect("a bound space").to_owned()
}

/// Appends an event straight into the log, as a writer with a bug could have: a
/// `RecordCreated` whose payload no read model can decode. Returns its position.
async fn append_undecodable(app: &TestApp, space_id: &str) -> i64 {
    let client = app.pool.get().await.expect("client");
    client
        .query_one(
            "WITH head AS (UPDATE log_head SET position = position + 1 RETURNING position)
             INSERT INTO events (position, event_id, stream_id, stream_version, event_type, payload, space_id,
                                 subject_id, occurred_at)
             SELECT position, gen_random_uuid(), 'record/con_poison' || position, 1, 'RecordCreated.v1',
                    '\\xffffffff'::bytea, $1, 'con_poison' || position, now() FROM head
             RETURNING position",
            &[&space_id],
        )
        .await
        .expect("append the poison")
        .get(0)
}

async fn open_dead_letters(app: &TestApp) -> Vec<(String, i32, i64, String)> {
    let client = app.pool.get().await.expect("client");
    client
        .query(
            "SELECT name, version, position, space_key FROM projection_dead_letters WHERE resolved_at IS NULL
             ORDER BY name, version, position",
            &[],
        )
        .await
        .expect("dead letters")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3)))
        .collect()
}

async fn get_with_token(app: &TestApp, path: &str, key: &str, token: &str) -> TestResponse {
    app.send(app.request(reqwest::Method::GET, path, Some(key)).header("Consistency-Token", token)).await
}

fn warning_codes(response: &TestResponse) -> Vec<String> {
    response.body["warnings"]
        .as_array()
        .map(|warnings| warnings.iter().filter_map(|warning| warning["code"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

async fn create(app: &TestApp, key: &str, body: &Value) -> TestResponse {
    let response = app.post("/schemas/contacts/records", key, body).await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    response
}

#[tokio::test]
async fn a_poison_event_in_one_space_leaves_every_other_space_readable() {
    // A long consistency wait, so that answering at once is told apart from waiting it out.
    let app =
        TestApp::spawn_with(Options { consistency_wait: Some(Duration::from_secs(60)), ..Options::default() }).await;
    let (alpha, beta) = (space_of(&app, ALPHA_ADMIN).await, space_of(&app, MULTI_BETA).await);
    let before = app.create_contact(&json!({"email": "before@example.com", "firstName": "Before"})).await;
    let before_id = before["id"].as_str().expect("id").to_owned();
    let poison = append_undecodable(&app, &alpha).await;

    // Space beta: writes keep becoming readable, with no warning.
    for index in 0..3 {
        let created = create(&app, MULTI_BETA, &json!({"email": format!("b{index}@example.com")})).await;
        let id = created.body["data"]["id"].as_str().expect("id");
        let read = app.get(&format!("/schemas/contacts/records/{id}"), MULTI_BETA).await;
        assert_eq!(read.status, 200, "beta write {index} is readable: {:?}", read.body);
        assert!(warning_codes(&read).is_empty(), "{:?}", read.body);
    }
    // Every read model reaches the head of the log: nothing is stuck.
    app.wait_for_projections().await;
    // The records and segments read models dead-letter it (and hold alpha back); the
    // preparation worker, which reads record events too, records it and passes over it.
    assert_eq!(
        open_dead_letters(&app).await,
        vec![
            ("preparation".to_owned(), 0, poison, alpha.clone()),
            ("records".to_owned(), 1, poison, alpha.clone()),
            ("segments".to_owned(), 1, poison, alpha.clone())
        ]
    );

    // Space alpha: a write after the poison is held, and reads say so at once instead of
    // claiming read-your-writes or waiting out the consistency timeout.
    let held = create(&app, ALPHA_ADMIN, &json!({"email": "held@example.com"})).await;
    let token = held.header("consistency-token").expect("token").to_owned();
    let started = Instant::now();
    let list = get_with_token(&app, "/schemas/contacts/records", ALPHA_MEMBER, &token).await;
    assert_eq!(list.status, 200);
    assert_eq!(warning_codes(&list), ["stale_read"], "{:?}", list.body);
    let position: i64 = list.header("projection-position").expect("position").parse().expect("a number");
    assert_eq!(position, poison - 1, "the space is shown as of just before the dead letter");
    assert!(started.elapsed() < Duration::from_secs(30), "a quarantined space does not wait out the timeout");
    assert_eq!(list.body["data"].as_array().map(Vec::len), Some(1), "only the record from before the poison");
    // Beta's reads carry no warning about alpha's quarantine.
    let beta_list = app.get("/schemas/contacts/records", MULTI_BETA).await;
    assert!(warning_codes(&beta_list).is_empty(), "{:?}", beta_list.body);

    // Erasure still completes in the quarantined space.
    let deleted = app
        .send(app.request(
            reqwest::Method::DELETE,
            &format!("/schemas/contacts/records/{before_id}"),
            Some(ALPHA_ADMIN),
        ))
        .await;
    let operation_id = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = app.get(&format!("/record-deletions/{operation_id}"), ALPHA_ADMIN).await;
        if status.body["data"]["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "the deletion completes: {:?}", status.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let gone =
        app.query_i64(&format!("SELECT count(*) FROM rm_records_v1.records WHERE record_id = '{before_id}'")).await;
    assert_eq!(gone, 0, "the deleted record left the quarantined read model");
    assert_ne!(beta, alpha);
}

#[tokio::test]
async fn an_operator_retries_a_dead_letter_after_the_fix() {
    let app = TestApp::spawn().await;
    let alpha = space_of(&app, ALPHA_ADMIN).await;
    let client = app.pool.get().await.expect("client");
    // A read-model defect that only some records meet.
    client
        .batch_execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.doc ->> 'firstName' = 'Poison' THEN RAISE EXCEPTION 'cannot apply this record'; END IF;
             RETURN NEW; END; $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON rm_records_v1.records
                 FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
        )
        .await
        .expect("install the defect");
    let poison = create(&app, ALPHA_ADMIN, &json!({"email": "poison@example.com", "firstName": "Poison"})).await;
    let later = create(&app, ALPHA_ADMIN, &json!({"email": "later@example.com", "firstName": "Later"})).await;
    let beta = create(&app, MULTI_BETA, &json!({"email": "beta@example.com"})).await;
    let beta_id = beta.body["data"]["id"].as_str().expect("id");
    assert_eq!(app.get(&format!("/schemas/contacts/records/{beta_id}"), MULTI_BETA).await.status, 200);
    app.wait_for_projections().await;
    let dead = open_dead_letters(&app).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].3, alpha);
    let ids: Vec<String> =
        [&poison, &later].iter().map(|r| r.body["data"]["id"].as_str().expect("id").to_owned()).collect();
    for id in &ids {
        assert_eq!(app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_MEMBER).await.status, 404, "held");
    }
    // A retry before the fix changes nothing and says so.
    let report =
        projector::read_models::quarantine::retry(&app.pool, read_model("records"), None).await.expect("retry");
    assert_eq!((report.spaces, report.still_dead), (1, 1), "{report:?}");
    // The fix, then the retry: the held events are applied in order.
    client.batch_execute("DROP TRIGGER refuse_poison ON rm_records_v1.records").await.expect("fix");
    let report =
        projector::read_models::quarantine::retry(&app.pool, read_model("records"), None).await.expect("retry");
    assert_eq!((report.spaces, report.still_dead), (1, 0), "{report:?}");
    assert!(report.events >= 2, "{report:?}");
    for id in &ids {
        let read = app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_MEMBER).await;
        assert_eq!(read.status, 200, "{:?}", read.body);
        assert!(warning_codes(&read).is_empty(), "{:?}", read.body);
    }
    assert!(open_dead_letters(&app).await.is_empty());
    let counted = format!(
        "SELECT total FROM rm_records_v1.record_counts WHERE space_id = '{alpha}' AND schema_id =
         (SELECT schema_id FROM rm_records_v1.records WHERE record_id = '{}')",
        ids[0]
    );
    assert_eq!(app.query_i64(&counted).await, 2, "the counters include the retried records exactly once");
}

#[tokio::test]
async fn a_rebuild_reaches_the_same_dead_letters_and_rows() {
    let app = TestApp::spawn().await;
    let alpha = space_of(&app, ALPHA_ADMIN).await;
    create(&app, ALPHA_ADMIN, &json!({"email": "one@example.com"})).await;
    let poison = append_undecodable(&app, &alpha).await;
    create(&app, ALPHA_ADMIN, &json!({"email": "two@example.com"})).await;
    create(&app, MULTI_BETA, &json!({"email": "three@example.com"})).await;
    app.wait_for_projections().await;
    let rows = |version: i32| {
        let app = &app;
        async move {
            let client = app.pool.get().await.expect("client");
            client
                .query(&format!("SELECT record_id || doc::text FROM rm_records_v{version}.records ORDER BY 1"), &[])
                .await
                .expect("rows")
                .iter()
                .map(|row| row.get::<_, String>(0))
                .collect::<Vec<String>>()
        }
    };
    let before = rows(1).await;
    assert_eq!(before.len(), 2, "one alpha record before the poison and beta's record");
    projector::read_models::rebuild::rebuild(&app.pool, read_model("records"), |_| {}).await.expect("rebuild");
    assert_eq!(rows(2).await, before, "the rebuilt version holds the same rows");
    let dead: Vec<(i32, i64, String)> = open_dead_letters(&app)
        .await
        .into_iter()
        .map(|(_, version, position, space)| (version, position, space))
        .collect();
    assert!(dead.contains(&(2, poison, alpha.clone())), "the rebuild dead-letters the same event: {dead:?}");
}
