//! Segments: defined in free text (the deterministic AI provider reads the filter language),
//! membership maintained as records, subscriptions and events change and as time passes,
//! rebuilt from the log the same; the capped contacts list; webhooks with a segment condition.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::email::{MAIL_KEY, QUICK_FORM, mail_workspace};
use crate::helpers::*;
use crate::receiver::Receiver;

const WAIT: Duration = Duration::from_secs(20);

async fn define(app: &TestApp, key: &str, name: &str, definition: &str) -> TestResponse {
    app.post("/segments", key, &json!({"name": name, "definition": definition})).await
}

pub(crate) async fn defined(app: &TestApp, key: &str, name: &str, definition: &str) -> String {
    let response = define(app, key, name, definition).await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    response.body["data"]["id"].as_str().expect("id").to_owned()
}

/// The emails of a segment's contacts, in the list's order (at most one page of 100).
pub(crate) async fn members(app: &TestApp, key: &str, segment_id: &str) -> Vec<String> {
    app.wait_for_workers().await;
    let page = app.get(&format!("/segments/{segment_id}/contacts?limit=100"), key).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    page.body["data"]
        .as_array()
        .expect("contacts")
        .iter()
        .map(|contact| contact["email"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Polls until the segment's members are `expected` (sorted), for changes that come with time.
pub(crate) async fn wait_for_members(app: &TestApp, key: &str, segment_id: &str, expected: &[&str]) {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut found = members(app, key, segment_id).await;
        found.sort();
        if found == expected {
            return;
        }
        assert!(Instant::now() < deadline, "segment {segment_id} has {found:?}, not {expected:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn contact(app: &TestApp, email: &str, plan: &str) -> String {
    app.create_contact(&json!({"email": email, "plan": plan})).await["id"].as_str().expect("id").to_owned()
}

async fn set_plan(app: &TestApp, id: &str, plan: &str) {
    let response = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN))
                .json(&json!({"plan": plan})),
        )
        .await;
    assert_eq!(response.status, 200, "{:?}", response.body);
}

async fn delete_segment(app: &TestApp, id: &str, idempotency_key: &str) -> TestResponse {
    app.send(
        app.request(reqwest::Method::DELETE, &format!("/segments/{id}"), Some(ALPHA_ADMIN))
            .header("Idempotency-Key", idempotency_key),
    )
    .await
}

#[tokio::test]
async fn a_segment_is_made_from_text_once_and_its_membership_follows_the_records() {
    let app = TestApp::spawn().await;
    let spent = || app.query_i64("SELECT COALESCE(sum(spent), 0)::bigint FROM ai_credit_spend");
    let before = spent().await;
    contact(&app, "early@acme.com", "pro").await;
    contact(&app, "pro@other.com", "pro").await;
    let free = contact(&app, "free@acme.com", "free").await;

    let response = define(&app, ALPHA_ADMIN, "Pro at Acme", "plan is pro and email ends with @acme.com").await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    let segment = &response.body["data"];
    let id = segment["id"].as_str().expect("id").to_owned();
    assert!(id.starts_with("seg_"), "{id}");
    assert_eq!(segment["name"], "Pro at Acme");
    assert_eq!(segment["description"], "plan is pro and email ends with @acme.com");
    assert!(!response.body.to_string().contains("ends_with"), "the generated filter is never returned");
    assert_eq!(spent().await, before + 1, "making the filter spent one credit");

    let late = contact(&app, "late@acme.com", "pro").await;
    assert_eq!(members(&app, ALPHA_ADMIN, &id).await, ["early@acme.com", "late@acme.com"]);
    let read = app.get(&format!("/segments/{id}"), ALPHA_ADMIN).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    assert_eq!(read.body["data"]["memberCount"], 2);
    assert!(read.body["data"].get("filter").is_none() && !read.body.to_string().contains("ends_with"));
    let list = app.get("/segments", ALPHA_ADMIN).await;
    assert_eq!(list.body["pagination"]["totalCount"], 1, "{:?}", list.body);
    assert_eq!(list.body["data"][0]["id"], id.as_str());

    // Updates move contacts in and out.
    set_plan(&app, &free, "pro").await;
    set_plan(&app, &late, "free").await;
    assert_eq!(members(&app, ALPHA_ADMIN, &id).await, ["early@acme.com", "free@acme.com"]);
    assert_eq!(app.get(&format!("/segments/{id}"), ALPHA_ADMIN).await.body["data"]["memberCount"], 2);

    // Another space sees none of it.
    for path in [format!("/segments/{id}"), format!("/segments/{id}/contacts")] {
        let other = app.get(&path, MULTI_BETA).await;
        assert_eq!((other.status, other.code().as_str()), (404, Some("segment_not_found")), "{path}");
    }

    // What cannot become a usable filter is refused, spending nothing.
    let spent_before = spent().await;
    for definition in [
        "only the nice ones please",
        "plann is pro",
        "performed refund",
        "subscribed to sports",
        "opened an email from broadcast nope",
    ] {
        let refused = define(&app, ALPHA_ADMIN, "x", definition).await;
        assert_eq!((refused.status, refused.code().as_str()), (422, Some("ai_generation_failed")), "{definition}");
        assert_eq!(refused.body["error"]["issues"][0]["key"], "definition");
    }
    assert_eq!(spent().await, spent_before);
    let invalid = app.post("/segments", ALPHA_ADMIN, &json!({"name": "x"})).await;
    assert_eq!((invalid.status, invalid.code().as_str()), (400, Some("invalid_segment")), "{:?}", invalid.body);
    let broke = define(&app, MULTI_BETA, "x", "plan is pro").await;
    assert_eq!((broke.status, broke.code().as_str()), (402, Some("insufficient_credits")), "{:?}", broke.body);

    // Deletion, replayed under its key, then gone.
    let deleted = delete_segment(&app, &id, "delete-1").await;
    assert_eq!((deleted.status, &deleted.body["data"]), (200, &json!({"id": id, "deleted": true})));
    let replayed = delete_segment(&app, &id, "delete-1").await;
    assert_eq!((replayed.status, replayed.header("Idempotent-Replay")), (200, Some("true")));
    let again = delete_segment(&app, &id, "delete-2").await;
    assert_eq!((again.status, again.code().as_str()), (404, Some("segment_not_found")));
    app.wait_for_workers().await;
    assert_eq!(app.get(&format!("/segments/{id}"), ALPHA_ADMIN).await.status, 404);
    assert_eq!(app.get("/segments", ALPHA_ADMIN).await.body["pagination"]["totalCount"], 0);
}

#[tokio::test]
async fn a_segment_takes_the_forms_people_type_commas_or_lists_and_any_case() {
    let app = TestApp::spawn().await;
    contact(&app, "pro@acme.com", "pro").await;
    contact(&app, "pro@beta.com", "pro").await;
    contact(&app, "pro@other.com", "pro").await;
    contact(&app, "free@acme.com", "free").await;
    let typed = "plan IS pro, email ENDS WITH @acme.com OR @beta.com";
    let response = define(&app, ALPHA_ADMIN, "Pro at Acme or Beta", typed).await;
    assert_eq!(response.status, 201, "{:?}", response.body);
    let id = response.body["data"]["id"].as_str().expect("id").to_owned();
    // The description is the canonical words of what was understood.
    assert_eq!(
        response.body["data"]["description"],
        "plan is pro and (email ends with @acme.com or email ends with @beta.com)",
        "{:?}",
        response.body
    );
    let mut found = members(&app, ALPHA_ADMIN, &id).await;
    found.sort();
    assert_eq!(found, ["pro@acme.com", "pro@beta.com"]);
    // Still a grammar: what it cannot read is refused with where and what it expected.
    let refused = define(&app, ALPHA_ADMIN, "x", "plan is pro and free").await;
    assert_eq!((refused.status, refused.code().as_str()), (422, Some("ai_generation_failed")), "{:?}", refused.body);
    let message = refused.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at character 17") && message.contains("plan is pro or free"), "{message}");
}

#[tokio::test]
async fn membership_follows_subscriptions_events_and_time_and_a_rebuild_gives_the_same() {
    let app = TestApp::spawn().await;
    app.apply_workspace(&mail_workspace(100), true).await;
    let subscribed = defined(&app, MAIL_KEY, "Readers", "subscribed to news").await;
    let recent = defined(&app, MAIL_KEY, "Recent buyers", "performed purchase in the last 3 seconds").await;
    let loyal = defined(&app, MAIL_KEY, "Loyal", "has email consent and performed purchase at least 2 times").await;

    // A form without double opt-in subscribes at once.
    let submitted =
        app.post(&format!("/forms/{QUICK_FORM}/submit"), MAIL_KEY, &json!({"email": "reader@example.com"})).await;
    assert!(submitted.status < 300, "{:?}", submitted.body);
    wait_for_members(&app, MAIL_KEY, &subscribed, &["reader@example.com"]).await;

    let buyer = app
        .post("/schemas/people/records", MAIL_KEY, &json!({"email": "buyer@example.com", "newsConsent": true}))
        .await;
    assert_eq!(buyer.status, 201, "{:?}", buyer.body);
    let buyer_id = buyer.body["data"]["id"].as_str().expect("id").to_owned();
    let fire = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": buyer_id, "amount": 5})).await;
    assert_eq!(fire.status, 202, "{:?}", fire.body);
    assert_eq!(members(&app, MAIL_KEY, &recent).await, ["buyer@example.com"]);
    assert!(members(&app, MAIL_KEY, &loyal).await.is_empty(), "one purchase is not two");
    let fire = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": buyer_id, "amount": 7})).await;
    assert_eq!(fire.status, 202, "{:?}", fire.body);
    assert_eq!(members(&app, MAIL_KEY, &loyal).await, ["buyer@example.com"]);

    // Three seconds after the last purchase, the window closes with no new event.
    wait_for_members(&app, MAIL_KEY, &recent, &[]).await;
    assert_eq!(members(&app, MAIL_KEY, &loyal).await, ["buyer@example.com"], "no window, no expiry");
    assert!(
        app.query_i64("SELECT count(*) FROM events WHERE event_type = 'SegmentWindowElapsed.v1'").await >= 1,
        "the passing of time is in the log"
    );

    // Withdrawn consent leaves the consent segment.
    let withdrawn = app
        .send(
            app.request(reqwest::Method::PATCH, &format!("/schemas/people/records/{buyer_id}"), Some(MAIL_KEY))
                .json(&json!({"newsConsent": false})),
        )
        .await;
    assert_eq!(withdrawn.status, 200, "{:?}", withdrawn.body);
    assert!(members(&app, MAIL_KEY, &loyal).await.is_empty());
    let fire = app.post("/events/purchase", MAIL_KEY, &json!({"contactId": buyer_id, "amount": 1})).await;
    assert_eq!(fire.status, 202);
    assert_eq!(members(&app, MAIL_KEY, &recent).await, ["buyer@example.com"], "a new purchase opens the window again");

    // A rebuild from the log gives the same membership, windows included.
    let snapshot = || async {
        let client = app.pool.get().await.expect("client");
        let version: i32 = client
            .query_one("SELECT version FROM projections WHERE name = 'segments' AND status = 'live'", &[])
            .await
            .expect("live")
            .get(0);
        let rows = client
            .query(
                &format!(
                    "SELECT g.segment_id || ' ' || g.member_count || ' ' || COALESCE(string_agg(m.contact_id, ',' ORDER BY m.contact_id), '')
                     FROM rm_segments_v{version}.segments g LEFT JOIN rm_segments_v{version}.members m USING (segment_id)
                     GROUP BY g.segment_id, g.member_count ORDER BY 1"
                ),
                &[],
            )
            .await
            .expect("snapshot");
        rows.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>()
    };
    // Once the window has closed again (nothing is due any more), the log holds everything:
    // the rebuild must replay the passing of time to the same answer.
    wait_for_members(&app, MAIL_KEY, &recent, &[]).await;
    app.wait_for_workers().await;
    let before = snapshot().await;
    projector::read_models::rebuild::rebuild(&app.pool, read_model("segments"), |_| {}).await.expect("rebuild");
    assert_eq!(snapshot().await, before, "the rebuilt membership is the same");
}

#[tokio::test]
async fn a_page_of_segment_contacts_holds_at_most_100_whatever_the_limit() {
    let app = TestApp::spawn().await;
    for index in 0..120 {
        app.create_contact(&json!({"email": format!("c{index:03}@example.com"), "age": 7})).await;
    }
    let id = defined(&app, ALPHA_ADMIN, "Sevens", "age is 7").await;
    app.wait_for_workers().await;
    let page = app.get(&format!("/segments/{id}/contacts?limit=150"), ALPHA_ADMIN).await;
    assert_eq!(page.status, 200, "{:?}", page.body);
    assert_eq!(page.body["data"].as_array().map(Vec::len), Some(100));
    assert_eq!(page.body["pagination"], json!({"limit": 100, "offset": 0, "totalCount": 120, "hasMore": true}));
    assert!(page.body.get("warnings").is_none(), "no warning: {:?}", page.body["warnings"]);
    let rest = app.get(&format!("/segments/{id}/contacts?limit=150&offset=100"), ALPHA_ADMIN).await;
    assert_eq!(rest.body["data"].as_array().map(Vec::len), Some(20));
    assert_eq!(rest.body["pagination"]["hasMore"], false);
    let first: Vec<Value> = page.body["data"].as_array().expect("data").clone();
    assert!(
        !first.iter().any(|contact| rest.body["data"].as_array().expect("data").contains(contact)),
        "the pages do not overlap"
    );
    let small = app.get(&format!("/segments/{id}/contacts?limit=10"), ALPHA_ADMIN).await;
    assert_eq!(small.body["pagination"]["limit"], 10);
}

#[tokio::test]
async fn a_webhook_with_a_segment_condition_delivers_only_for_members() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start().await;
    receiver.endpoint("members", &[], json!({})).await;
    let segment = defined(&app, ALPHA_ADMIN, "Pro", "plan is pro").await;
    let missing = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": receiver.url("members"), "trigger": "contact upserted", "schemaId": "contacts",
                    "condition": {"type": "segment", "segmentId": "seg_missing"}}),
        )
        .await;
    assert_eq!((missing.status, missing.code().as_str()), (404, Some("segment_not_found")), "{:?}", missing.body);
    let objects = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": receiver.url("members"), "trigger": "object upserted", "schemaId": "companies",
                    "condition": {"type": "segment", "segmentId": segment}}),
        )
        .await;
    assert_eq!((objects.status, objects.code().as_str()), (400, Some("invalid_webhook")), "{:?}", objects.body);
    let created = app
        .post(
            "/webhooks",
            ALPHA_ADMIN,
            &json!({"url": receiver.url("members"), "trigger": "contact upserted", "schemaId": "contacts",
                    "condition": {"type": "segment", "segmentId": segment}}),
        )
        .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    assert_eq!(created.body["data"]["condition"], json!({"type": "segment", "segmentId": segment}));
    let secret = created.body["data"]["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    receiver.endpoint("members", &[&secret], json!({})).await;

    contact(&app, "free@example.com", "free").await;
    contact(&app, "pro@example.com", "pro").await;
    app.wait_for_workers().await;
    crate::webhooks::wait_until_settled(&app).await;
    let got = receiver.received("members").await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["body"]["data"]["email"], "pro@example.com");
    assert_eq!(got[0]["verifiedWith"], json!([0]));
}

/// A keyed read model's batch statements take arrays of the batch's keys (contacts, segments,
/// members). PostgreSQL planned them again on every call; its batch now runs their generic
/// plans, held to index lookups so that a plan made while a table was small never scans it
/// once it has grown. A read model that is not keyed keeps the planner's own choices (the
/// workflows' batch joins sets, which those settings would make quadratic). Noted from
/// inside two read models' writes: the segments' contacts (keyed) and the records' documents;
/// and from the segments' checkpoint, written after its batch in the same transaction, which
/// runs under the session's settings again (as does everything after a batch that every read
/// model shares: a plan made there under the batch's settings was planned again on every call
/// elsewhere).
#[tokio::test]
async fn a_keyed_read_models_batch_runs_generic_plans_held_to_index_lookups_and_no_other_does() {
    let app = TestApp::spawn().await;
    app.wait_for_projections().await;
    let mut tables = Vec::new();
    for (model, table) in [("segments", "contacts"), ("records", "records")] {
        let schema = app
            .query_strings(&format!(
                "SELECT 'rm_{model}_v' || version FROM projections WHERE name = '{model}' AND status = 'live'"
            ))
            .await
            .remove(0);
        tables.push((model, format!("{schema}.{table}")));
    }
    let client = app.pool.get().await.expect("client");
    client
        .batch_execute(
            "CREATE TABLE batch_plans (model text, plan_cache_mode text, enable_seqscan text);
             CREATE FUNCTION note_plans() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                 INSERT INTO batch_plans VALUES (TG_ARGV[0], current_setting('plan_cache_mode'), current_setting('enable_seqscan'));
                 RETURN NULL; END $$;",
        )
        .await
        .expect("the noting function");
    for (model, table) in &tables {
        client
            .batch_execute(&format!(
                "CREATE TRIGGER note_plans AFTER INSERT OR UPDATE ON {table}
                     FOR EACH STATEMENT EXECUTE FUNCTION note_plans('{model}');"
            ))
            .await
            .expect("the trigger");
    }
    client
        .batch_execute(
            "CREATE TRIGGER note_plans AFTER UPDATE ON projections
                 FOR EACH ROW WHEN (NEW.name = 'segments') EXECUTE FUNCTION note_plans('checkpoint');",
        )
        .await
        .expect("the checkpoint's trigger");
    contact(&app, "planned@example.com", "pro").await;
    app.wait_for_projections().await;
    let noted =
        app.query_strings("SELECT model || ' ' || plan_cache_mode || ' ' || enable_seqscan FROM batch_plans").await;
    for model in ["segments", "records", "checkpoint"] {
        assert!(noted.iter().any(|settings| settings.starts_with(&format!("{model} "))), "{model} wrote: {noted:?}");
    }
    for settings in &noted {
        let expected = if settings.starts_with("segments ") { "force_generic_plan off" } else { "auto on" };
        assert!(settings.ends_with(&format!(" {expected}")), "{noted:?}");
    }
}
