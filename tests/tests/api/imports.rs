//! Bulk imports through the API: parts, per-row results, re-import, consent provenance.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;

/// The fixture plus a contact schema with a required attribute and an email consent field.
fn workspace_with_members() -> String {
    let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("fixture parses");
    let schemas = workspace["spaces"][0]["schemas"].as_array_mut().expect("alpha's schemas");
    schemas.push(json!({
        "slug": "members",
        "name": "Members",
        "type": "contact",
        "attributes": [
            { "key": "firstName", "definition": { "type": "string" } },
            { "key": "age", "definition": { "type": "integer" } },
            { "key": "plan", "definition": { "type": "string", "required": true } },
            { "key": "emailConsent", "definition": { "type": "boolean", "consent": { "channel": "email" } } },
            { "key": "joinedAt", "definition": { "type": "datetime" } }
        ]
    }));
    workspace["spaces"][0]["topics"] = json!([{ "slug": "news", "name": "News" }]);
    workspace.to_string()
}

async fn put(app: &TestApp, path: &str, content_type: &str, body: String) -> TestResponse {
    app.send(app.request(reqwest::Method::PUT, path, Some(ALPHA_ADMIN)).header("content-type", content_type).body(body))
        .await
}

async fn create_import(app: &TestApp, id: &str, settings: &Value) -> TestResponse {
    put(app, &format!("/imports/{id}"), "application/json", settings.to_string()).await
}

/// Polls the import until it is completed.
async fn completed(app: &TestApp, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let import = app.get(&format!("/imports/{id}"), ALPHA_ADMIN).await;
        assert_eq!(import.status, 200, "{:?}", import.body);
        if import.body["data"]["status"] == "completed" {
            assert_conforms("Import", std::slice::from_ref(&import.body["data"]));
            return import.body["data"].clone();
        }
        assert!(Instant::now() < deadline, "the import did not complete: {:?}", import.body);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every row result of the import with `status`, following the cursor.
async fn rows(app: &TestApp, id: &str, status: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = app.get(&format!("/imports/{id}/rows?status={status}&limit=1000{cursor}"), ALPHA_ADMIN).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let items = page.body["data"].as_array().expect("rows").clone();
        assert_conforms("ImportRow", &items);
        all.extend(items);
        match page.body["pagination"]["nextCursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => return all,
        }
    }
}

const HEADER: &str = "userId,email,phone,firstName,age,plan,emailConsent,topics";

/// The file: 10,000 rows of every kind, in two parts (each with its header).
fn file() -> (String, String, usize) {
    let mut rows: Vec<String> = vec![
        "u-1,changed1@example.com,,,,pro,".to_owned(),   // update by userId
        ",e-2@example.com,,Eve,,,".to_owned(),           // update by email
        ",,+14155550100,Phil,,,".to_owned(),             // update by phone
        ",bad-age@example.com,,,old,basic,".to_owned(),  // bad attribute value
        ",noplan@example.com,,,,,".to_owned(),           // missing required
        ",dup@example.com,,First,,basic,".to_owned(),    // created, then
        ",sup@example.com,,,,basic,".to_owned(),         // suppressed: created and reported
        ",consent@example.com,,,,basic,true".to_owned(), // consent under the import's source
        ",,,Nobody,,basic,".to_owned(),                  // no key
    ];
    let specials = rows.len() + 1;
    let fresh = 10_000 - specials;
    rows.extend((0..fresh).map(|i| format!(",new{i}@example.com,,,{},basic,", i % 90)));
    rows.push(",DUP@example.com,,,30,,".to_owned()); // the duplicate, later in the file: updates
    // The topics column: the consent row subscribes to the space's topic.
    let rows: Vec<String> = rows
        .into_iter()
        .map(|row| if row.starts_with(",consent@") { format!("{row},news") } else { format!("{row},") })
        .collect();
    let (first, second) = rows.split_at(5_000);
    let part = |rows: &[String]| format!("{HEADER}\n{}\n", rows.join("\n"));
    (part(first), part(second), fresh)
}

#[tokio::test]
async fn a_csv_of_ten_thousand_rows_gives_each_row_its_result_and_a_second_import_changes_nothing() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    for body in [
        json!({"userId": "u-1", "email": "old1@example.com", "plan": "basic"}),
        json!({"email": "e-2@example.com", "plan": "basic"}),
        json!({"phone": "+14155550100", "plan": "basic"}),
    ] {
        let created = app.post("/schemas/members/records", ALPHA_ADMIN, &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    let suppressed = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "sup@example.com", "reason": "manual"}))
        .await;
    assert_eq!(suppressed.status, 201, "{:?}", suppressed.body);
    let settings = json!({"schema": "members", "format": "csv", "fileName": "members.csv",
                          "consent": {"label": "signup form, exported from listmonk"}});
    let created = create_import(&app, "members-1", &settings).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["data"]["status"], "receiving");
    // The same create again is the same import. Other settings under its id start it again
    // while it has written nothing (a fixed column map, say); once it has, they are refused.
    assert_eq!(create_import(&app, "members-1", &settings).await.status, 200);
    let other = create_import(&app, "members-1", &json!({"schema": "members", "format": "ndjson"})).await;
    assert_eq!((other.status, &other.body["data"]["format"]), (201, &json!("ndjson")), "{:?}", other.body);
    assert_eq!(create_import(&app, "members-1", &settings).await.status, 201, "and back, as nothing was written");

    let (first, second, fresh) = file();
    let part = put(&app, "/imports/members-1/parts/1", "text/csv", first.clone()).await;
    assert_eq!((part.status, part.body["data"]["rows"].clone()), (202, json!(5_000)), "{:?}", part.body);
    // A retried part is answered as the first; another body under its number is refused.
    assert_eq!(put(&app, "/imports/members-1/parts/1", "text/csv", first.clone()).await.status, 200);
    let changed = put(&app, "/imports/members-1/parts/1", "text/csv", format!("{HEADER}\n")).await;
    assert_eq!((changed.status, changed.code().clone()), (409, json!("import_conflict")));
    let wrong_type = put(&app, "/imports/members-1/parts/2", "application/json", second.clone()).await;
    assert_eq!(wrong_type.status, 415);
    // Completing before every part arrived is refused.
    let early = app.post("/imports/members-1/complete", ALPHA_ADMIN, &json!({"parts": 2})).await;
    assert_eq!((early.status, early.code().clone()), (409, json!("import_conflict")));
    assert_eq!(put(&app, "/imports/members-1/parts/2", "text/csv", second.clone()).await.status, 202);
    let closed = app.post("/imports/members-1/complete", ALPHA_ADMIN, &json!({"parts": 2})).await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    let late =
        put(&app, "/imports/members-1/parts/3", "text/csv", format!("{HEADER}\n,x@example.com,,,,basic,\n")).await;
    assert_eq!((late.status, late.code().clone()), (409, json!("import_conflict")));

    let import = completed(&app, "members-1").await;
    let other = create_import(&app, "members-1", &json!({"schema": "members", "format": "ndjson"})).await;
    assert_eq!((other.status, other.code().clone()), (409, json!("import_conflict")), "it has written rows");
    let created_rows = fresh + 3; // the new addresses, dup, sup, consent
    assert_eq!(
        import["rows"],
        json!({"total": 10_000, "pending": 0, "created": created_rows, "updated": 4, "unchanged": 0, "failed": 3}),
        "{import:?}"
    );
    let failed = rows(&app, "members-1", "failed").await;
    let codes: Vec<(i64, String)> = failed
        .iter()
        .map(|row| (row["row"].as_i64().unwrap_or(0), row["error"]["code"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert_eq!(
        codes,
        [
            // As a spreadsheet numbers them: the header is row 1.
            (5, "invalid_attribute_value".to_owned()),
            (6, "required_attribute_missing".to_owned()),
            (10, "missing_field".to_owned())
        ]
    );
    assert_eq!(failed[0]["key"], json!({"field": "email", "value": "bad-age@example.com"}));
    let updated = rows(&app, "members-1", "updated").await;
    let updated_at: Vec<(i64, i64)> =
        updated.iter().map(|row| (row["part"].as_i64().unwrap_or(0), row["row"].as_i64().unwrap_or(0))).collect();
    assert_eq!(updated_at, [(1, 2), (1, 3), (1, 4), (2, 5_001)]);
    let created = rows(&app, "members-1", "created").await;
    assert_eq!(created.len(), created_rows);
    let sup = created.iter().find(|row| row["key"]["value"] == "sup@example.com").expect("the suppressed row");
    assert_eq!(sup["warnings"][0]["code"], "recipient_suppressed");

    // The records are what the rows say: the later duplicate row added to the earlier, the userId row moved
    // the address, and the suppression stays.
    app.wait_for_workers().await;
    let listed = app.get("/schemas/members/records?limit=1", ALPHA_ADMIN).await;
    assert_eq!(listed.body["pagination"]["totalCount"], json!(created_rows + 3), "{:?}", listed.body);
    let dup_id = created.iter().find(|row| row["key"]["value"] == "dup@example.com").expect("dup")["recordId"].clone();
    let dup_record = app.get(&format!("/schemas/members/records/{}", dup_id.as_str().unwrap_or("")), ALPHA_ADMIN).await;
    assert_eq!((&dup_record.body["data"]["firstName"], &dup_record.body["data"]["age"]), (&json!("First"), &json!(30)));
    assert_eq!(dup_record.body["data"]["source"], "import");
    assert_eq!(app.get("/contacts/suppressions", ALPHA_ADMIN).await.body["data"][0]["identifier"], "sup@example.com");

    // The consent the import granted names it in the contact's audit trail.
    let consent = created.iter().find(|row| row["key"]["value"] == "consent@example.com").expect("consent row");
    let trail = app
        .get(
            &format!("/schemas/members/records/{}/audit-trail", consent["recordId"].as_str().unwrap_or("")),
            ALPHA_ADMIN,
        )
        .await;
    assert_eq!(trail.status, 200, "{:?}", trail.body);
    let entries = trail.body["data"].as_array().expect("entries");
    let entry = entries.iter().find(|entry| entry["type"] == "consent_changed").expect("a consent entry");
    assert_eq!(
        entry["importSource"],
        json!({"importId": "members-1", "label": "signup form, exported from listmonk", "fileName": "members.csv"})
    );
    assert!(entry["actorKeyId"].is_string(), "{entry:?}");
    let subscribed = entries.iter().find(|entry| entry["type"] == "subscription_changed").expect("a subscription");
    assert_eq!((&subscribed["status"], &subscribed["source"]), (&json!("subscribed"), &json!("import")));
    assert_eq!(subscribed["sourceId"], "members-1");

    // The same file again, as another import: nothing changes, nothing is appended.
    let events_before = app.query_i64("SELECT count(*) FROM events").await;
    assert_eq!(create_import(&app, "members-2", &settings).await.status, 201);
    assert_eq!(put(&app, "/imports/members-2/parts/1", "text/csv", first).await.status, 202);
    assert_eq!(put(&app, "/imports/members-2/parts/2", "text/csv", second).await.status, 202);
    assert_eq!(app.post("/imports/members-2/complete", ALPHA_ADMIN, &json!({"parts": 2})).await.status, 200);
    let again = completed(&app, "members-2").await;
    assert_eq!(
        again["rows"],
        json!({"total": 10_000, "pending": 0, "created": 0, "updated": 0, "unchanged": 9_997, "failed": 3}),
        "{again:?}"
    );
    assert_eq!(app.query_i64("SELECT count(*) FROM events").await, events_before);
    // The parts' bodies are gone once decided.
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts WHERE body IS NOT NULL").await, 0);

    // An erased contact: its results no longer name its address, and a later import of the
    // address is a new subject.
    let erased = consent["recordId"].as_str().unwrap_or("").to_owned();
    let deletion = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/members/records/{erased}"), Some(ALPHA_ADMIN)))
        .await;
    assert_eq!(deletion.status, 200, "{:?}", deletion.body);
    let operation = deletion.body["data"]["operationId"].as_str().unwrap_or("").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.get(&format!("/record-deletions/{operation}"), ALPHA_ADMIN).await.body["data"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the deletion did not complete");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let named = app
        .query_i64(&format!("SELECT count(*) FROM import_rows WHERE record_id = '{erased}' AND key_value IS NOT NULL"))
        .await;
    assert_eq!(named, 0);
    assert_eq!(create_import(&app, "members-3", &settings).await.status, 201);
    let part = format!("{HEADER}\n,consent@example.com,,,,basic,true,\n");
    assert_eq!(put(&app, "/imports/members-3/parts/1", "text/csv", part).await.status, 202, "a new subject");
    assert_eq!(app.post("/imports/members-3/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    assert_eq!(completed(&app, "members-3").await["rows"]["created"], 1);
    let again = rows(&app, "members-3", "created").await;
    assert_ne!(again[0]["recordId"].as_str(), Some(erased.as_str()));
}

#[tokio::test]
async fn an_import_without_a_consent_source_grants_no_consent_and_an_unknown_import_is_404() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let created = create_import(&app, "nd-1", &json!({"schema": "members", "format": "ndjson"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let body = [
        json!({"email": "yes@example.com", "plan": "basic", "emailConsent": true}),
        json!({"email": "no@example.com", "plan": "basic", "emailConsent": false}),
        json!({"email": "topic@example.com", "plan": "basic", "topics": ["news"]}),
    ]
    .iter()
    .map(Value::to_string)
    .collect::<Vec<_>>()
    .join("\n")
        + "\nnot json\n";
    assert_eq!(put(&app, "/imports/nd-1/parts/1", "application/x-ndjson", body).await.status, 202);
    assert_eq!(app.post("/imports/nd-1/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    let import = completed(&app, "nd-1").await;
    assert_eq!(import["rows"]["created"], 1);
    let failed = rows(&app, "nd-1", "failed").await;
    let codes: Vec<&str> = failed.iter().map(|row| row["error"]["code"].as_str().unwrap_or("")).collect();
    assert_eq!(codes, ["consent_source_required", "consent_source_required", "malformed_json"]);

    let missing = app.get("/imports/nope", ALPHA_ADMIN).await;
    assert_eq!((missing.status, missing.code().clone()), (404, json!("import_not_found")));
    // Another space's key does not see it.
    assert_eq!(app.get("/imports/nd-1", MULTI_BETA).await.status, 404);
}

/// The worker decides the next wave while a wave's appends are written. A row of the next wave
/// about a contact the wave in flight changes must wait for it: decided on what it read before,
/// a row that sets a plan back would find it unchanged, and the contact would keep the earlier
/// row's plan. Here every contact is set to `pro` and back to `basic`, twice, a thousand rows
/// apart: every row updates, and every contact ends `basic`.
#[tokio::test]
async fn rows_of_one_contact_in_consecutive_waves_are_applied_in_the_files_order() {
    // Waves of a thousand from the first: the worker does not yield to this test's requests.
    let app = TestApp::spawn_with(Options {
        tweak: Some(|settings| settings.imports.live_yield = 0.0),
        ..Options::default()
    })
    .await;
    app.apply_workspace(&workspace_with_members(), true).await;
    const CONTACTS: usize = 1_000;
    let block = |plan: &str| (0..CONTACTS).map(|i| format!(",c{i}@example.com,,,,{plan},,")).collect::<Vec<_>>();
    let settings = json!({"schema": "members", "format": "csv"});
    for (id, blocks) in [("plans-0", vec!["basic"]), ("plans-1", vec!["pro", "basic", "pro", "basic"])] {
        assert_eq!(create_import(&app, id, &settings).await.status, 201);
        let rows: Vec<String> = blocks.iter().flat_map(|plan| block(plan)).collect();
        let part =
            put(&app, &format!("/imports/{id}/parts/1"), "text/csv", format!("{HEADER}\n{}\n", rows.join("\n"))).await;
        assert_eq!(part.status, 202, "{:?}", part.body);
        let closed = app.post(&format!("/imports/{id}/complete"), ALPHA_ADMIN, &json!({"parts": 1})).await;
        assert_eq!(closed.status, 200, "{:?}", closed.body);
        completed(&app, id).await;
    }
    let import = completed(&app, "plans-1").await;
    let total = 4 * CONTACTS;
    assert_eq!(
        import["rows"],
        json!({"total": total, "pending": 0, "created": 0, "updated": total, "unchanged": 0, "failed": 0}),
        "{import:?}"
    );
    app.wait_for_workers().await;
    let created = rows(&app, "plans-0", "created").await;
    assert_eq!(created.len(), CONTACTS);
    for row in [&created[0], &created[CONTACTS / 2], &created[CONTACTS - 1]] {
        let id = row["recordId"].as_str().unwrap_or_default();
        let record = app.get(&format!("/schemas/members/records/{id}"), ALPHA_ADMIN).await;
        assert_eq!(record.body["data"]["plan"], "basic", "{row}: {:?}", record.body);
    }
}

#[tokio::test]
async fn an_ndjson_line_over_one_megabyte_refuses_its_part_before_anything_is_stored() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let created = create_import(&app, "long-1", &json!({"schema": "members", "format": "ndjson"})).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let long = json!({"email": "long@example.com", "plan": "basic", "firstName": "x".repeat(1024 * 1024)});
    let body = format!("{}\n{long}\n", json!({"email": "short@example.com", "plan": "basic"}));
    let refused = put(&app, "/imports/long-1/parts/1", "application/x-ndjson", body).await;
    assert_eq!(refused.status, 400, "{:?}", refused.body);
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("row 2 of the part") && message.contains("1 MB"), "{message}");
    // Nothing of the part was stored: the import has no part, and the same part number takes
    // a corrected body.
    let stored = app.query_i64("SELECT count(*) FROM import_parts").await;
    assert_eq!(stored, 0);
    let fixed = format!("{}\n", json!({"email": "short@example.com", "plan": "basic"}));
    assert_eq!(put(&app, "/imports/long-1/parts/1", "application/x-ndjson", fixed).await.status, 202);
}

/// The members workspace as a file, for the `apply` of a process-level test.
fn members_workspace_file() -> std::path::PathBuf {
    let path = scratch_dir("imports-workspace").join("workspace.json");
    std::fs::write(&path, workspace_with_members()).expect("workspace written");
    path
}

#[tokio::test]
async fn an_import_survives_kill_9_of_its_worker_and_of_postgresql_writing_each_row_once() {
    const PARTS: usize = 2;
    const ROWS: usize = 2_500;
    let cluster = PrivateCluster::start();
    let url = cluster.migrated_platform().await;
    let env = [
        ("APP__PROJECTOR__WORKERS", "read_models,webhook_enqueue,webhook_delivery,preparation,imports".to_owned()),
        ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned()),
        ("APP__WEBHOOKS__RETRY_SCHEDULE_MS", "[100,200,400,800,1600,3200]".to_owned()),
    ];
    let mut first = spawn_binary("projector", &["run"], &url, &env);
    let port = free_port();
    let command_env = [("APP__HTTP__PORT", port.to_string()), ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned())];
    let _command = spawn_binary("command-service", &["serve"], &url, &command_env);
    let workspace = members_workspace_file();
    apply_file(&workspace.display().to_string(), &url);
    let base = format!("http://127.0.0.1:{port}/v1");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    crate::log::wait_until_listening(&http, &base).await;
    let receiver = crate::receiver::Receiver::start().await;
    receiver.endpoint("imported", &[], json!({})).await;
    let hook = http
        .post(format!("{base}/webhooks"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"url": receiver.url("imported"), "trigger": "contact upserted", "schemaId": "members"}))
        .send()
        .await
        .expect("sent");
    assert_eq!(hook.status().as_u16(), 201);

    let put = |path: String, content_type: &'static str, body: String| {
        let http = http.clone();
        async move {
            let response = http
                .put(path)
                .bearer_auth(ALPHA_ADMIN)
                .header("content-type", content_type)
                .body(body)
                .send()
                .await
                .expect("sent");
            response.status().as_u16()
        }
    };
    let settings = json!({"schema": "members", "format": "csv"}).to_string();
    assert_eq!(put(format!("{base}/imports/crash"), "application/json", settings).await, 201);
    for part in 0..PARTS {
        let rows: Vec<String> =
            (0..ROWS).map(|row| format!("crash{part}-{row}@example.com,basic,{}", row % 50)).collect();
        let body = format!("email,plan,age\n{}\n", rows.join("\n"));
        assert_eq!(put(format!("{base}/imports/crash/parts/{}", part + 1), "text/csv", body).await, 202);
    }
    let closed = http
        .post(format!("{base}/imports/crash/complete"))
        .bearer_auth(ALPHA_ADMIN)
        .json(&json!({"parts": PARTS}))
        .send()
        .await
        .expect("sent");
    assert_eq!(closed.status().as_u16(), 200);

    let count = |sql: &'static str| {
        let url = url.clone();
        async move {
            // A fresh connection each time: the server is killed in between.
            let Ok((client, connection)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else {
                return -1;
            };
            tokio::spawn(connection);
            client.query_one(sql, &[]).await.map_or(-1, |row| row.get::<_, i64>(0))
        }
    };
    let rows_done = || count("SELECT count(*) FROM import_rows");
    let wait_for_rows = |at_least: i64| async move {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let done = rows_done().await;
            if done >= at_least {
                return done;
            }
            assert!(Instant::now() < deadline, "the import is stuck at {done} rows");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    // The worker killed mid-part.
    wait_for_rows(1_000).await;
    first.0.kill().expect("kill -9");
    let at_kill = rows_done().await;
    assert!(at_kill < (PARTS * ROWS) as i64, "the kill came mid-import ({at_kill} rows)");
    let _second = spawn_binary("projector", &["run"], &url, &env);
    // PostgreSQL killed mid-import, and started again.
    wait_for_rows(at_kill + 1_500).await;
    cluster.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.pg_start();

    let deadline = Instant::now() + Duration::from_secs(240);
    while count("SELECT count(*) FROM import_parts WHERE body IS NULL").await != PARTS as i64 {
        assert!(Instant::now() < deadline, "the import did not complete: {} rows", rows_done().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = (PARTS * ROWS) as i64;
    assert_eq!(count("SELECT count(*) FROM import_rows WHERE status = 'created'").await, total);
    assert_eq!(count("SELECT count(*) FROM events WHERE event_type = 'RecordCreated.v1'").await, total);
    assert_eq!(count("SELECT count(*) FROM record_identities WHERE kind = 'email'").await, total);
    assert_eq!(count("SELECT sum(created)::bigint FROM import_parts").await, total);
    // One `contact upserted` delivery per record: retries repeat a delivery's id, never a record.
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let emails: std::collections::HashSet<String> = receiver
            .received("imported")
            .await
            .iter()
            .filter_map(|delivery| delivery["body"]["data"]["email"].as_str().map(str::to_owned))
            .collect();
        if emails.len() as i64 == total {
            // Read after every record arrived: retries repeat an id, never add one.
            let ids = receiver.ids("imported").await;
            assert_eq!(ids.len() as i64, total, "one delivery id per imported record");
            break;
        }
        assert!(Instant::now() < deadline, "{} of {total} records delivered", emails.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn the_import_command_streams_a_csv_in_parts_cut_at_record_boundaries_and_names_failed_rows_by_file_row() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let mut file = String::from("E-mail,Name,plan,junk\n");
    for row in 1..=25 {
        let line = match row {
            // A quoted field with a comma and a line break: one record across two lines.
            3 => "multi@example.com,\"Line one,\nLine two\",basic,x".to_owned(),
            17 => "no-plan@example.com,Nobody,,x".to_owned(),
            _ => format!("cli-{row}@example.com,Person {row},basic,x"),
        };
        file.push_str(&line);
        file.push('\n');
    }
    let path = scratch_dir("import-cli").join("people.csv");
    std::fs::write(&path, file).expect("file written");
    let path = path.display().to_string();
    let run = |database_url: String, path: String| {
        tokio::task::spawn_blocking(move || {
            let arguments = [
                "import",
                &path,
                "--schema",
                "members",
                "--space",
                "alpha",
                "--column",
                "E-mail=email",
                "--column",
                "Name=firstName",
                "--column",
                "junk=",
                "--consent",
                "a test list",
                "--part-rows",
                "4",
            ];
            run_binary("command-service", &arguments, &database_url)
        })
    };
    let output = run(app.database_url.clone(), path.clone()).await.expect("the command ran");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("25 rows: 24 created, 0 updated, 0 unchanged, 1 failed"), "{stdout}");
    // Rows as a spreadsheet shows the file: the header is row 1 (and a multi-line record one row).
    assert!(stdout.contains("row 18 (email no-plan@example.com): required_attribute_missing"), "{stdout}");
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts").await, 7);
    let import_id: String = {
        let (client, connection) =
            tokio_postgres::connect(&app.database_url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client.query_one("SELECT import_id FROM imports", &[]).await.expect("the import").get(0)
    };
    let multi = rows(&app, &import_id, "created").await;
    let multi = multi.iter().find(|row| row["key"]["value"] == "multi@example.com").expect("the multi-line row");
    assert_eq!((&multi["part"], &multi["row"]), (&json!(1), &json!(4)));
    let record =
        app.get(&format!("/schemas/members/records/{}", multi["recordId"].as_str().unwrap_or("")), ALPHA_ADMIN).await;
    assert_eq!(record.body["data"]["firstName"], "Line one,\nLine two");

    // The same command again resumes the same import: nothing more is written.
    let events = app.query_i64("SELECT count(*) FROM events").await;
    let again = run(app.database_url.clone(), path).await.expect("the command ran");
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("24 created"));
    assert_eq!(app.query_i64("SELECT count(*) FROM events").await, events);
}

#[tokio::test]
async fn columns_are_checked_before_any_row_is_stored_and_a_fixed_import_starts_again_under_its_id() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let issue_key = |response: &TestResponse| response.body["error"]["issues"][0]["key"].as_str().map(str::to_owned);
    // The column map names a field the schema does not have, or one field twice: 400 at create.
    let typo = json!({"schema": "members", "format": "csv", "columns": {"E-mail": "emial"}});
    let refused = create_import(&app, "guarded", &typo).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("unknown_attribute")), "{:?}", refused.body);
    assert_eq!(issue_key(&refused).as_deref(), Some("columns.E-mail"));
    let message = |response: &TestResponse| response.body["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(message(&refused).contains("did you mean \"email\""), "{:?}", refused.body);
    // A name close to none: the schema's fields are listed.
    let far = json!({"schema": "members", "format": "csv", "columns": {"E-mail": "xyzzy"}});
    let refused = create_import(&app, "guarded", &far).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("unknown_attribute")), "{:?}", refused.body);
    assert!(message(&refused).contains("firstName"), "{:?}", refused.body);
    let twice = json!({"schema": "members", "format": "csv", "columns": {"A": "email", "B": "email"}});
    let refused = create_import(&app, "guarded", &twice).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_field")), "{:?}", refused.body);
    let unknown_schema = create_import(&app, "guarded", &json!({"schema": "nope", "format": "csv"})).await;
    assert_eq!(unknown_schema.status, 404, "{:?}", unknown_schema.body);
    assert_eq!(app.query_i64("SELECT count(*) FROM imports").await, 0, "nothing was stored");

    // A part whose header has a column that fills nothing, or no identity: 400 naming it.
    let plain = json!({"schema": "members", "format": "csv"});
    assert_eq!(create_import(&app, "guarded", &plain).await.status, 201);
    let file = "Email Address,firstName,plan\nada@example.com,Ada,basic\n".to_owned();
    let refused = put(&app, "/imports/guarded/parts/1", "text/csv", file.clone()).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("unknown_attribute")), "{:?}", refused.body);
    assert_eq!(issue_key(&refused).as_deref(), Some("Email Address"));
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"Email Address\"") && message.contains("--column"), "{message}");
    let anonymous = put(&app, "/imports/guarded/parts/1", "text/csv", "firstName,plan\nAda,basic\n".to_owned()).await;
    assert_eq!((anonymous.status, anonymous.code().as_str()), (400, Some("missing_field")), "{:?}", anonymous.body);
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts").await, 0, "no part was stored");

    // Fixed, under the same id: it starts again with the new map and imports the file.
    let fixed = json!({"schema": "members", "format": "csv", "columns": {"Email Address": "email"}});
    assert_eq!(create_import(&app, "guarded", &fixed).await.status, 201);
    assert_eq!(put(&app, "/imports/guarded/parts/1", "text/csv", file).await.status, 202);
    assert_eq!(app.post("/imports/guarded/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    let import = completed(&app, "guarded").await;
    assert_eq!(import["rows"]["created"], 1, "{import:?}");
}

#[tokio::test]
async fn the_import_command_refuses_a_file_it_cannot_map_with_exit_2_and_fails_when_every_row_fails() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let dir = scratch_dir("import-guard");
    let run = |path: std::path::PathBuf, extra: Vec<&'static str>| {
        let database_url = app.database_url.clone();
        tokio::task::spawn_blocking(move || {
            let path = path.display().to_string();
            let mut arguments = vec!["import", path.as_str(), "--schema", "members", "--space", "alpha"];
            arguments.extend(extra);
            run_binary("platform", &arguments, &database_url)
        })
    };
    let typo = dir.join("typo.csv");
    std::fs::write(&typo, "Mail,plan\nada@example.com,basic\nbob@example.com,basic\n").expect("written");
    let refused = run(typo.clone(), vec![]).await.expect("ran");
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("\"Mail\"") && stderr.contains("nothing was stored"), "{stderr}");
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts").await, 0);
    // The same command with the column mapped: the same import (its id comes from the file)
    // starts again and imports both rows.
    let fixed = run(typo, vec!["--column", "Mail=email"]).await.expect("ran");
    let stdout = String::from_utf8_lossy(&fixed.stdout).into_owned();
    assert!(fixed.status.success(), "{stdout}{}", String::from_utf8_lossy(&fixed.stderr));
    assert!(stdout.contains("2 rows: 2 created"), "{stdout}");
    // Every row failing is a failure of the command.
    let all_fail = dir.join("all-fail.csv");
    std::fs::write(&all_fail, "email,age\ncarl@example.com,old\ndora@example.com,young\n").expect("written");
    let failed = run(all_fail, vec![]).await.expect("ran");
    assert_eq!(failed.status.code(), Some(1), "{}", String::from_utf8_lossy(&failed.stdout));
    let stderr = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert!(stderr.contains("every row failed") && stderr.contains("--id file-all-fail-"), "{stderr}");
}

/// A CRM export's signup column holds dates alone (`2026-01-11`), as spreadsheets write them:
/// in a `datetime` attribute such a date is that day's midnight UTC, through an import as
/// through a record write; a date and time without its offset, or a date in another order, is
/// a failed row that says what is taken.
#[tokio::test]
async fn a_date_alone_fills_a_datetime_attribute_as_that_days_midnight_utc() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    assert_eq!(create_import(&app, "dates", &json!({"schema": "members", "format": "csv"})).await.status, 201);
    let file = "email,plan,joinedAt\nada@example.com,basic,2026-01-11\nbob@example.com,basic,2026-01-11T09:30:00+01:00\n\
                carl@example.com,basic,11/01/2026\ndora@example.com,basic,2026-01-11 09:30\n";
    assert_eq!(put(&app, "/imports/dates/parts/1", "text/csv", file.to_owned()).await.status, 202);
    assert_eq!(app.post("/imports/dates/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    assert_eq!(completed(&app, "dates").await["rows"]["created"], 2);
    for (email, joined) in
        [("ada@example.com", "2026-01-11T00:00:00.000Z"), ("bob@example.com", "2026-01-11T08:30:00.000Z")]
    {
        let found = app.get(&format!("/schemas/members/records?email={email}"), ALPHA_ADMIN).await;
        assert_eq!(found.body["data"][0]["joinedAt"], joined, "{:?}", found.body);
    }
    let failed = rows(&app, "dates", "failed").await;
    assert_eq!(failed.len(), 2, "{failed:?}");
    for row in &failed {
        let message = row.to_string();
        assert!(message.contains("like 2026-11-21 (that day's midnight UTC)"), "{message}");
    }
    let written = app
        .post(
            "/schemas/members/records",
            ALPHA_ADMIN,
            &json!({"email": "erin@example.com", "plan": "basic", "joinedAt": "2026-02-28"}),
        )
        .await;
    assert_eq!(
        (written.status, &written.body["data"]["joinedAt"]),
        (201, &json!("2026-02-28T00:00:00.000Z")),
        "{:?}",
        written.body
    );
}

/// An Excel export from much of Europe: `;`-separated, in windows-1252, with CRLF.
fn excel_export() -> Vec<u8> {
    let mut file = b"email;firstName;plan\r\n".to_vec();
    file.extend_from_slice(b"jose@example.com;Jos\xe9;basic\r\n");
    file.extend_from_slice(b"chloe@example.com;\"Chlo\xeb; \x80\";basic\r\n");
    file
}

#[tokio::test]
async fn a_semicolon_windows_1252_file_and_a_utf16_file_import_through_the_api() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let put_bytes = |path: String, body: Vec<u8>| {
        app.send(
            app.request(reqwest::Method::PUT, &path, Some(ALPHA_ADMIN)).header("content-type", "text/csv").body(body),
        )
    };
    // Read as UTF-8 (the default), the part is refused naming its line and the setting.
    assert_eq!(create_import(&app, "excel", &json!({"schema": "members", "format": "csv"})).await.status, 201);
    let refused = put_bytes("/imports/excel/parts/1".to_owned(), excel_export()).await;
    assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_body")), "{:?}", refused.body);
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("line 2") && message.contains("windows-1252"), "{message}");
    // With its encoding, and the delimiter found in the header.
    let settings = json!({"schema": "members", "format": "csv", "encoding": "windows-1252"});
    assert_eq!(create_import(&app, "excel", &settings).await.status, 201, "started again: nothing was written");
    assert_eq!(put_bytes("/imports/excel/parts/1".to_owned(), excel_export()).await.status, 202);
    assert_eq!(app.post("/imports/excel/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    assert_eq!(completed(&app, "excel").await["rows"]["created"], 2);
    let created = rows(&app, "excel", "created").await;
    let chloe = created.iter().find(|row| row["key"]["value"] == "chloe@example.com").expect("chloe");
    let record =
        app.get(&format!("/schemas/members/records/{}", chloe["recordId"].as_str().unwrap_or("")), ALPHA_ADMIN).await;
    assert_eq!(record.body["data"]["firstName"], "Chloë; €", "{:?}", record.body);

    // UTF-16 with its byte order mark needs no setting.
    let mut utf16 = vec![0xff, 0xfe];
    for unit in "email,firstName,plan\r\nzoe@example.com,Zoë,basic\r\n".encode_utf16() {
        utf16.extend_from_slice(&unit.to_le_bytes());
    }
    assert_eq!(create_import(&app, "utf16", &json!({"schema": "members", "format": "csv"})).await.status, 201);
    assert_eq!(put_bytes("/imports/utf16/parts/1".to_owned(), utf16).await.status, 202);
    assert_eq!(app.post("/imports/utf16/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    assert_eq!(completed(&app, "utf16").await["rows"]["created"], 1);
    // A spreadsheet is one clear answer.
    let xlsx = create_import(&app, "sheet", &json!({"schema": "members", "format": "xlsx"})).await;
    assert_eq!(xlsx.status, 400);
    assert_eq!(xlsx.body["error"]["issues"].as_array().map(Vec::len), Some(1), "{:?}", xlsx.body);
    assert!(xlsx.body["error"]["message"].as_str().is_some_and(|m| m.contains("save the sheet as CSV")));
}

#[tokio::test]
async fn the_import_command_reads_an_excel_export_given_its_encoding() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let dir = scratch_dir("import-excel");
    let path = dir.join("export.csv");
    std::fs::write(&path, excel_export()).expect("written");
    let run = |extra: Vec<&'static str>| {
        let (database_url, path) = (app.database_url.clone(), path.display().to_string());
        tokio::task::spawn_blocking(move || {
            let mut arguments = vec!["import", path.as_str(), "--schema", "members", "--space", "alpha"];
            arguments.extend(extra);
            run_binary("platform", &arguments, &database_url)
        })
    };
    let refused = run(vec![]).await.expect("ran");
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("line 2 of the file is not UTF-8") && stderr.contains("--encoding windows-1252"),
        "{stderr}"
    );
    let imported = run(vec!["--encoding", "windows-1252"]).await.expect("ran");
    let stdout = String::from_utf8_lossy(&imported.stdout).into_owned();
    assert!(imported.status.success(), "{stdout}{}", String::from_utf8_lossy(&imported.stderr));
    assert!(stdout.contains("2 rows: 2 created"), "{stdout}");
    let sheet = dir.join("export.xlsx");
    std::fs::write(&sheet, b"PK\x03\x04").expect("written");
    let output = tokio::task::spawn_blocking({
        let database_url = app.database_url.clone();
        move || {
            let sheet = sheet.display().to_string();
            run_binary("platform", &["import", &sheet, "--schema", "members", "--space", "alpha"], &database_url)
        }
    })
    .await
    .expect("ran");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("save the sheet as CSV"));
}

#[tokio::test]
async fn every_refusal_of_the_import_command_exits_2_and_leaves_no_import_behind() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let dir = scratch_dir("import-refusals");
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("written");
        path.display().to_string()
    };
    let run = |file: String, schema: &'static str, extra: &'static [&'static str]| {
        let database_url = app.database_url.clone();
        tokio::task::spawn_blocking(move || {
            let mut arguments = vec!["import", file.as_str(), "--schema", schema, "--space", "alpha"];
            arguments.extend(extra);
            run_binary("platform", &arguments, &database_url)
        })
    };
    let refused = |case: &'static str, output: std::process::Output, expected: &str| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(2), "{case}: {stderr}");
        assert!(stderr.contains("refused, nothing was stored") && stderr.contains(expected), "{case}: {stderr}");
    };
    let no_import_is_left = || async {
        let listed = app.get("/imports", ALPHA_ADMIN).await;
        assert_eq!((listed.status, &listed.body["data"]), (200, &json!([])), "an import is left: {:?}", listed.body);
        assert_eq!(app.query_i64("SELECT count(*) FROM imports").await, 0);
    };
    // A header the schema does not take, and a file that is not in the encoding it is read
    // in: refused, and nothing is left behind.
    let typo = write("typo.csv", b"Emial,plan\nada@example.com,basic\n");
    refused("a typo'd column", run(typo, "members", &[]).await.expect("ran"), "did you mean \"email\"");
    let excel = write("excel.csv", &excel_export());
    refused("a bad encoding", run(excel, "members", &[]).await.expect("ran"), "--encoding windows-1252");
    no_import_is_left().await;

    // Everything else that stops the command before it stores anything is exit 2 too.
    let quote =
        b"email,firstName,plan\nada@example.com,Ada,basic\nbob@example.com,\"Bob,basic\ncarl@example.com,Carl,basic\n";
    let people = write("people.csv", b"email,plan\nada@example.com,basic\n");
    let cases = [
        ("a column mapped to a typo", people.clone(), "members", &["--column", "email=emial"][..], "did you mean"),
        (
            "a quote never closed",
            write("quote.csv", quote),
            "members",
            &[][..],
            "row 3 of the file (line 3) opens a quoted cell that is never closed",
        ),
        ("an empty file", write("empty.csv", b""), "members", &[][..], "the file is empty"),
        ("a header without rows", write("header.csv", b"email,plan\n"), "members", &[][..], "no rows"),
        ("a spreadsheet", write("sheet.xlsx", b"PK\x03\x04"), "members", &[][..], "save the sheet as CSV"),
        ("an unknown schema", people, "nope", &[][..], "no contact or object schema \"nope\""),
    ];
    for (case, file, schema, extra, expected) in cases {
        refused(case, run(file, schema, extra).await.expect("ran"), expected);
    }
    let missing = run(dir.join("missing.csv").display().to_string(), "members", &[]).await.expect("ran");
    let stderr = String::from_utf8_lossy(&missing.stderr).into_owned();
    assert_eq!(missing.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("stopped, nothing was stored: cannot read") && stderr.contains("missing.csv"), "{stderr}");
    no_import_is_left().await;

    // Excel's sep= line names the delimiter; a row that grants consent without a source names
    // the option that gives one.
    let excel = write(
        "sep.csv",
        b"sep=;\r\nemail;firstName;plan;emailConsent\r\nada@example.com;Ada, Countess;basic;\r\n\
          bob@example.com;Bob;basic;\r\ncarl@example.com;Carl;basic;true\r\n",
    );
    let output = run(excel, "members", &[]).await.expect("ran");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("3 rows: 2 created, 0 updated, 0 unchanged, 1 failed"), "{stdout}");
    assert!(
        stdout.contains("row 4 (email carl@example.com): consent_source_required:")
            && stdout.contains("pass --consent \"<source>\""),
        "{stdout}"
    );
}

#[tokio::test]
async fn ctrl_c_while_the_import_command_follows_says_the_import_goes_on_and_exits_130() {
    // No imports worker: the command follows an import whose rows stay pending.
    let app = TestApp::spawn_with(Options {
        tweak: Some(|settings| settings.projector.workers = "read_models".to_owned()),
        ..Options::default()
    })
    .await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let path = scratch_dir("import-interrupted").join("people.csv");
    std::fs::write(&path, "email,plan\nada@example.com,basic\n").expect("written");
    let mut command = std::process::Command::new(binaries_dir().join("platform"));
    command
        .args(["import", &path.display().to_string(), "--schema", "members", "--space", "alpha"])
        .env("APP__DATABASE__URL", &app.database_url)
        .env("APP__MASTER_KEY", platform::crypto::TEST_MASTER_KEY)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = ChildGuard(command.spawn().expect("the command started"));
    let deadline = Instant::now() + Duration::from_secs(60);
    while app.query_i64("SELECT count(*) FROM imports WHERE parts_total IS NOT NULL").await == 0 {
        assert!(Instant::now() < deadline, "the command did not complete the import");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Completed: the command now follows it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sent = std::process::Command::new("kill").args(["-INT", &child.0.id().to_string()]).status().expect("kill");
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("the command's state") {
            break status;
        }
        assert!(Instant::now() < deadline, "the command did not stop on Ctrl-C");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().expect("piped"), &mut stderr).expect("stderr");
    assert_eq!(status.code(), Some(130), "{stderr}");
    let import_id = app.query_string("SELECT import_id FROM imports").await;
    assert!(
        stderr.contains(&format!(
            "interrupted: import {import_id} goes on on the server; run the same command again to follow it"
        )),
        "{stderr}"
    );
    let import = app.get(&format!("/imports/{import_id}"), ALPHA_ADMIN).await;
    assert_eq!((import.status, &import.body["data"]["rows"]["total"]), (200, &json!(1)), "{:?}", import.body);
}

#[tokio::test]
async fn a_cell_beyond_its_types_maximum_fails_its_row_and_a_file_with_a_huge_row_is_refused_whole() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    // Through the API: the row fails with value_too_long; the others are imported.
    assert_eq!(create_import(&app, "long", &json!({"schema": "members", "format": "csv"})).await.status, 201);
    let file = format!("email,firstName,plan\nok@example.com,Ok,basic\nlong@example.com,{},basic\n", "x".repeat(5_000));
    assert_eq!(put(&app, "/imports/long/parts/1", "text/csv", file).await.status, 202);
    assert_eq!(app.post("/imports/long/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    assert_eq!(completed(&app, "long").await["rows"]["created"], 1);
    let failed = rows(&app, "long", "failed").await;
    assert_eq!((&failed[0]["row"], &failed[0]["error"]["code"]), (&json!(3), &json!("value_too_long")), "{failed:?}");

    // Through the command: a 50 MB cell is refused before anything is stored.
    let path = scratch_dir("import-huge").join("huge.csv");
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).expect("created"));
        out.write_all(b"email,firstName,plan\nfirst@example.com,First,basic\nhuge@example.com,").expect("written");
        let chunk = vec![b'x'; 1024 * 1024];
        for _ in 0..50 {
            out.write_all(&chunk).expect("written");
        }
        out.write_all(b",basic\n").expect("written");
    }
    let parts_before = app.query_i64("SELECT count(*) FROM import_parts").await;
    let output = tokio::task::spawn_blocking({
        let database_url = app.database_url.clone();
        move || {
            let path = path.display().to_string();
            run_binary("platform", &["import", &path, "--schema", "members", "--space", "alpha"], &database_url)
        }
    })
    .await
    .expect("ran");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("row 3 of the file takes 51 MB") || stderr.contains("row 3 of the file takes 50 MB"),
        "{stderr}"
    );
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts").await, parts_before, "nothing was stored");
}

#[tokio::test]
async fn imports_are_listed_newest_first_and_one_not_completed_can_be_abandoned() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let settings = json!({"schema": "members", "format": "csv"});
    for id in ["first", "second", "third"] {
        assert_eq!(create_import(&app, id, &settings).await.status, 201);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let page = app.get("/imports?limit=2", ALPHA_ADMIN).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    let ids = |page: &TestResponse| -> Vec<String> {
        page.body["data"].as_array().into_iter().flatten().filter_map(|i| i["id"].as_str().map(str::to_owned)).collect()
    };
    assert_eq!(ids(&page), ["third", "second"]);
    assert_eq!(page.body["data"][0]["status"], "receiving");
    let cursor = page.body["pagination"]["nextCursor"].as_str().expect("more").to_owned();
    let next = app.get(&format!("/imports?limit=2&cursor={cursor}"), ALPHA_ADMIN).await;
    assert_eq!((ids(&next), &next.body["pagination"]["hasMore"]), (vec!["first".to_owned()], &json!(false)));
    let bad = app.get("/imports?cursor=nope", ALPHA_ADMIN).await;
    assert_eq!((bad.status, bad.code().as_str()), (400, Some("invalid_cursor")));
    // An empty cursor is the first page, as on every list paged by cursor; white space is no
    // cursor (the document's pattern admits neither `null` nor it).
    let empty = app.get("/imports?limit=2&cursor=", ALPHA_ADMIN).await;
    assert_eq!((empty.status, ids(&empty)), (200, ids(&page)));
    for spoiled in ["%20", "null", &format!("%20{cursor}")] {
        let refused = app.get(&format!("/imports?cursor={spoiled}"), ALPHA_ADMIN).await;
        assert_eq!((refused.status, refused.code().as_str()), (400, Some("invalid_cursor")), "{spoiled}");
    }
    let rows = app.get("/imports/third/rows?cursor=", ALPHA_ADMIN).await;
    assert_eq!((rows.status, &rows.body["data"]), (200, &json!([])), "{:?}", rows.body);
    let rows = app.get("/imports/third/rows?cursor=%2B1.1", ALPHA_ADMIN).await;
    assert_eq!((rows.status, rows.code().as_str()), (400, Some("invalid_cursor")));
    let elsewhere = app.get("/imports", MULTI_BETA).await;
    assert!(elsewhere.status == 200 && elsewhere.body["data"] == json!([]), "{:?}", elsewhere.body);

    // One still receiving is abandoned: gone, parts and all; its id is free again.
    assert_eq!(
        put(&app, "/imports/second/parts/1", "text/csv", "email,plan\nx@example.com,basic\n".to_owned()).await.status,
        202
    );
    let delete =
        |id: &str| app.send(app.request(reqwest::Method::DELETE, &format!("/imports/{id}"), Some(ALPHA_ADMIN)));
    let deleted = delete("second").await;
    assert_eq!(
        (deleted.status, &deleted.body["data"]),
        (200, &json!({"id": "second", "deleted": true})),
        "{:?}",
        deleted.body
    );
    assert_eq!(app.get("/imports/second", ALPHA_ADMIN).await.status, 404);
    assert_eq!(delete("second").await.status, 404);
    assert_eq!(app.query_i64("SELECT count(*) FROM import_parts WHERE import_id = 'second'").await, 0);
    // A completed one keeps its results.
    assert_eq!(
        put(&app, "/imports/third/parts/1", "text/csv", "email,plan\ny@example.com,basic\n".to_owned()).await.status,
        202
    );
    assert_eq!(app.post("/imports/third/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    completed(&app, "third").await;
    let kept = delete("third").await;
    assert_eq!((kept.status, kept.code().as_str()), (409, Some("import_conflict")), "{:?}", kept.body);
}

#[tokio::test]
async fn an_import_left_receiving_expires_and_a_completed_one_is_removed_after_its_retention() {
    let app = TestApp::spawn_with(Options {
        tweak: Some(|settings| {
            settings.imports.receiving_expiry_seconds = 3;
            settings.imports.retention_seconds = 6;
        }),
        ..Options::default()
    })
    .await;
    app.apply_workspace(&workspace_with_members(), true).await;
    let app = &app;
    let settings = json!({"schema": "members", "format": "csv"});
    let part = |id: &str, n: u32, body: &str| {
        let (path, body) = (format!("/imports/{id}/parts/{n}"), format!("email,plan\n{body}"));
        async move { put(app, &path, "text/csv", body).await.status }
    };
    for id in ["stale", "done"] {
        assert_eq!(create_import(app, id, &settings).await.status, 201);
    }
    assert_eq!(part("stale", 1, "stale@example.com,basic\n").await, 202);
    // A row that fails keeps the key it was given until the results go.
    assert_eq!(part("done", 1, "done@example.com,basic\nfailed@example.com,\n").await, 202);
    assert_eq!(app.post("/imports/done/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    let done = completed(app, "done").await;
    assert_eq!((&done["rows"]["created"], &done["rows"]["failed"]), (&json!(1), &json!(1)), "{done}");
    // One that keeps receiving stays, however long it takes. Created only now: an import
    // made beside the others would wait, receiving nothing, while "done" completes, which on
    // a loaded machine takes longer than the expiry.
    assert_eq!(create_import(app, "alive", &settings).await.status, 201);
    let started = Instant::now();
    for n in 1..=6 {
        assert_eq!(part("alive", n, &format!("alive{n}@example.com,basic\n")).await, 202);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(started.elapsed() > Duration::from_secs(5));
    assert_eq!(app.get("/imports/alive", ALPHA_ADMIN).await.status, 200, "still receiving");
    assert_eq!(app.get("/imports/stale", ALPHA_ADMIN).await.status, 404, "received nothing for 3 s: dropped");
    let deadline = Instant::now() + Duration::from_secs(30);
    while app.get("/imports/done", ALPHA_ADMIN).await.status != 404 {
        assert!(Instant::now() < deadline, "the completed import outlived its retention");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for id in ["stale", "done"] {
        let left = app
            .query_i64(&format!(
                "SELECT (SELECT count(*) FROM import_rows WHERE import_id = '{id}')
                      + (SELECT count(*) FROM import_parts WHERE import_id = '{id}')"
            ))
            .await;
        assert_eq!(left, 0, "{id}: parts and results (and the failed row's key) are gone");
    }
    assert_eq!(app.query_i64("SELECT count(*) FROM import_rows WHERE key_value = 'failed@example.com'").await, 0);
    // The records their rows wrote stay.
    for email in ["stale@example.com", "done@example.com"] {
        let found = app.get(&format!("/schemas/members/records?email={email}"), ALPHA_ADMIN).await;
        assert_eq!(found.body["data"].as_array().map(Vec::len), Some(1), "{email}: {:?}", found.body);
    }
}

#[tokio::test]
async fn the_api_servers_publish_the_live_load_the_imports_worker_yields_to() {
    let app = TestApp::spawn().await;
    for _ in 0..20 {
        assert_eq!(app.get("/me", ALPHA_ADMIN).await.status, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let client = app.pool.get().await.expect("a connection");
        let rate = api::live_load::live_rate(&client).await.expect("the live load");
        if rate > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no live load was published after 20 requests");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn while_live_requests_are_served_an_import_appends_its_rows_in_small_waves() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    app.publish_busy_live_load().await;
    let settings = json!({"schema": "members", "format": "csv", "fileName": "busy.csv"});
    assert_eq!(create_import(&app, "busy", &settings).await.status, 201);
    let file: String = std::iter::once("email,plan\n".to_owned())
        .chain((0..300).map(|index| format!("busy-{index}@example.com,basic\n")))
        .collect();
    let part = put(&app, "/imports/busy/parts/1", "text/csv", file).await;
    assert_eq!(part.status, 202, "{:?}", part.body);
    assert_eq!(app.post("/imports/busy/complete", ALPHA_ADMIN, &json!({"parts": 1})).await.status, 200);
    let import = completed(&app, "busy").await;
    assert_eq!(import["rows"]["created"], 300, "{import:?}");
    // The log's batcher groups a wave's appends into transactions: alone, the 300 rows are one
    // wave and go in transactions of up to 300; beside live requests, no transaction holds the
    // log's head for more than a wave of 100.
    let waves = app
        .query_strings(
            "SELECT count(*)::text FROM events WHERE event_type = 'RecordCreated.v1' GROUP BY xmin::text ORDER BY 1",
        )
        .await;
    let sizes: Vec<i64> = waves.iter().filter_map(|size| size.parse().ok()).collect();
    assert_eq!(sizes.iter().sum::<i64>(), 300, "{sizes:?}");
    assert!(sizes.iter().all(|size| *size <= 100), "waves of at most 100 rows: {sizes:?}");
}

#[tokio::test]
async fn a_row_that_changes_nothing_but_an_address_another_contact_holds_reports_it_skipped() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&workspace_with_members(), true).await;
    for (user, email) in [("u-a", "a@example.com"), ("u-b", "b@example.com")] {
        let created = app
            .post("/schemas/members/records", ALPHA_ADMIN, &json!({"userId": user, "email": email, "plan": "basic"}))
            .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    // The row finds u-b by its userId and gives it u-a's address, its plan as it is: the
    // address is skipped (rule 4), so the row changes nothing, and says what it skipped.
    let settings = json!({"schema": "members", "format": "csv"});
    assert_eq!(create_import(&app, "skipped", &settings).await.status, 201);
    let part =
        put(&app, "/imports/skipped/parts/1", "text/csv", format!("{HEADER}\nu-b,a@example.com,,,,basic,,\n")).await;
    assert_eq!(part.status, 202, "{:?}", part.body);
    let closed = app.post("/imports/skipped/complete", ALPHA_ADMIN, &json!({"parts": 1})).await;
    assert_eq!(closed.status, 200, "{:?}", closed.body);
    let import = completed(&app, "skipped").await;
    assert_eq!(import["rows"]["unchanged"], 1, "{import:?}");
    let unchanged = rows(&app, "skipped", "unchanged").await;
    assert_eq!(unchanged[0]["warnings"][0]["code"], "identifier_skipped", "{unchanged:?}");
    assert_eq!(unchanged[0]["key"], json!({"field": "userId", "value": "u-b"}));
}
