//! Idempotency keys: claim, replay, body identity, conflicts, reconciliation, expiry.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::*;
use crate::log::wait_until_listening;

async fn record_count(app: &TestApp) -> i64 {
    app.wait_for_projections().await;
    app.query_i64("SELECT count(*) FROM rm_records_v1.records").await
}

#[tokio::test]
async fn a_repeat_replays_the_recorded_response() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "idem@example.com", "firstName": "I", "age": 3});
    let first = app.create_with_key("key-1", &body).await;
    assert_eq!(first.status, 201);
    assert!(first.header("idempotent-replay").is_none());
    let operation_id = first.header("operation-id").expect("Operation-Id").to_owned();
    // Reordered keys are the same body.
    let reordered = json!({"age": 3, "firstName": "I", "email": "idem@example.com"});
    let replay = app.create_with_key("key-1", &reordered).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replay"), Some("true"));
    assert_eq!(replay.header("operation-id"), Some(operation_id.as_str()));
    assert_eq!(replay.body, first.body);
    assert_eq!(record_count(&app).await, 1);

    let changed = app.create_with_key("key-1", &json!({"email": "idem@example.com", "firstName": "J", "age": 3})).await;
    assert_eq!((changed.status, changed.code().as_str()), (422, Some("idempotency_key_reused")));
    // The scope is key + method + path: upsert with the same key is another operation, and so
    // is the same key used by another API key.
    let upsert = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records/upsert", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", "key-1")
                .json(&json!({"email": "idem@example.com", "age": 4})),
        )
        .await;
    assert_eq!(upsert.status, 200);
    let other_key = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_MEMBER))
                .header("Idempotency-Key", "key-1")
                .json(&json!({"email": "other@example.com"})),
        )
        .await;
    assert_eq!(other_key.status, 201);
    assert!(other_key.header("idempotent-replay").is_none());
}

#[tokio::test]
async fn keys_longer_than_256_characters_are_rejected() {
    let app = TestApp::spawn().await;
    let too_long = app.create_with_key(&"k".repeat(257), &json!({})).await;
    assert_eq!((too_long.status, too_long.code().as_str()), (400, Some("invalid_idempotency_key")));
    assert_eq!(app.create_with_key(&"k".repeat(256), &json!({})).await.status, 201);
}

#[tokio::test]
async fn errors_after_the_claim_are_replayed_and_checks_before_it_record_nothing() {
    let app = TestApp::spawn().await;
    // A parse failure happens before the claim: nothing is recorded.
    let malformed = app
        .send(
            app.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", "key-2")
                .header("content-type", "application/json")
                .body("{oops"),
        )
        .await;
    assert_eq!(malformed.status, 400);
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records").await, 0);
    // A validation failure happens after it and is replayed.
    let invalid = json!({"age": "not a number"});
    let first = app.create_with_key("key-2", &invalid).await;
    assert_eq!(first.status, 400);
    let replay = app.create_with_key("key-2", &invalid).await;
    assert_eq!((replay.status, replay.header("idempotent-replay")), (400, Some("true")));
    assert_eq!(replay.body, first.body);
    // So is a conflict.
    app.create_contact(&json!({"email": "taken@example.com"})).await;
    let conflict = app.create_with_key("key-3", &json!({"email": "taken@example.com"})).await;
    assert_eq!(conflict.status, 409);
    let replayed_conflict = app.create_with_key("key-3", &json!({"email": "taken@example.com"})).await;
    assert_eq!((replayed_conflict.status, replayed_conflict.header("idempotent-replay")), (409, Some("true")));
}

#[tokio::test]
async fn twenty_concurrent_identical_requests_execute_once() {
    let app = TestApp::spawn().await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
            .header("Idempotency-Key", "burst")
            .json(&json!({"email": "burst@example.com"}));
        tasks.push(tokio::spawn(async move {
            let response = request.send().await.expect("sent");
            let replay = response.headers().get("idempotent-replay").is_some();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, replay, body["error"]["code"].as_str().map(str::to_owned))
        }));
    }
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("task"));
    }
    let executed = outcomes.iter().filter(|(status, replay, _)| *status == 201 && !replay).count();
    assert_eq!(executed, 1, "{outcomes:?}");
    for (status, replay, code) in &outcomes {
        assert!(
            (*status == 201) || (*status == 409 && code.as_deref() == Some("idempotency_conflict")),
            "unexpected {status} {replay} {code:?}"
        );
    }
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn replays_survive_a_restart_and_come_from_any_instance() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "restart@example.com"});
    let first = app.create_with_key("key-r", &body).await;
    assert_eq!(first.status, 201);
    for _ in 0..2 {
        // A fresh command-service process each time: another instance, then a restart.
        let port = free_port();
        let instance =
            spawn_binary("command-service", &["serve"], &app.database_url, &[("APP__HTTP__PORT", port.to_string())]);
        let url = format!("http://127.0.0.1:{port}/v1");
        wait_until_listening(&app.http, &url).await;
        let replay = app
            .http
            .post(format!("{url}/schemas/contacts/records"))
            .bearer_auth(ALPHA_ADMIN)
            .header("Idempotency-Key", "key-r")
            .json(&body)
            .send()
            .await
            .expect("sent");
        assert_eq!(replay.status().as_u16(), 201);
        assert_eq!(replay.headers().get("idempotent-replay").and_then(|v| v.to_str().ok()), Some("true"));
        let replayed: Value = replay.json().await.expect("json");
        assert_eq!(replayed, first.body);
        drop(instance);
    }
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn stale_claims_become_unresolved_then_reconciled_and_completed_ones_expire() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "stale@example.com"});
    // A claim still processing answers idempotency_conflict, and when to come again.
    let first = app.create_with_key("key-s", &body).await;
    assert_eq!(first.status, 201);
    let client = app.pool.get().await.expect("client");
    client
        .execute("UPDATE idempotency_records SET state = 'processing', status = NULL, response = NULL", &[])
        .await
        .expect("simulate an unfinished claim");
    let processing = app.create_with_key("key-s", &body).await;
    assert_eq!(processing.code(), "idempotency_conflict");
    assert_eq!(processing.header("retry-after"), Some("1"));
    // An operation of a live instance (this one, which beats) is not taken over while it runs
    // long.
    let aged = "UPDATE idempotency_records SET claimed_at = now() - interval '30 seconds' WHERE idempotency_key = $1";
    client.execute(aged, &[&"key-s"]).await.expect("age");
    assert_eq!(app.create_with_key("key-s", &body).await.code(), "idempotency_conflict", "its owner beats");
    // A send whose hand-off ended without recording its answer cannot be rebuilt: the
    // outcome is unknown (a claim handed to an outbox row that is no longer pending).
    client
        .execute(
            "INSERT INTO email_outbox (email_id, space_id, state, claim_scope_key, claim_token)
             SELECT 'em_faked', 'spc_alpha', 'unknown', scope_key, claim_token FROM idempotency_records
             WHERE idempotency_key = 'key-s'",
            &[],
        )
        .await
        .expect("a send that ended unknown");
    client
        .execute("UPDATE idempotency_records SET owner = gen_random_uuid() WHERE idempotency_key = 'key-s'", &[])
        .await
        .expect("a dead owner");
    let unresolved = app.create_with_key("key-s", &body).await;
    assert_eq!((unresolved.status, unresolved.code().as_str()), (409, Some("idempotency_outcome_unknown")));
    assert_eq!(app.create_with_key("key-s", &body).await.code(), "idempotency_outcome_unknown", "kept");
    // The same holds past the claim timeout, whoever owns the claim.
    let slow = json!({"email": "slow@example.com"});
    assert_eq!(app.create_with_key("key-t", &slow).await.status, 201);
    client
        .execute(
            "UPDATE idempotency_records SET state = 'processing', status = NULL, response = NULL,
                 claimed_at = now() - interval '5 minutes' WHERE idempotency_key = 'key-t'",
            &[],
        )
        .await
        .expect("simulate an operation stuck for five minutes");
    client
        .execute(
            "INSERT INTO email_outbox (email_id, space_id, state, claim_scope_key, claim_token)
             SELECT 'em_faked_2', 'spc_alpha', 'sent', scope_key, claim_token FROM idempotency_records
             WHERE idempotency_key = 'key-t'",
            &[],
        )
        .await
        .expect("a send that ended");
    assert_eq!(app.create_with_key("key-t", &slow).await.code(), "idempotency_outcome_unknown");
    // Here the claims did append (we faked their state), so reconciliation keeps them.
    projector::workers::maintenance::purge_and_reconcile(&app.pool.get().await.expect("client"))
        .await
        .expect("reconcile");
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records").await, 2);
    // A claim whose operation appended nothing is released, and the key runs again.
    let never_ran = json!({"email": "never@example.com"});
    app.create_with_key("key-n", &never_ran).await;
    client
        .execute(
            "UPDATE idempotency_records SET state = 'unresolved', claimed_at = now() + interval '1 minute'
             WHERE idempotency_key = 'key-n'",
            &[],
        )
        .await
        .expect("simulate an unresolved claim that wrote nothing");
    projector::workers::maintenance::purge_and_reconcile(&app.pool.get().await.expect("client"))
        .await
        .expect("reconcile");
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'key-n'").await, 0);
    // Each claim is looked at on the passes of the day after its claim, not every pass for
    // ever: one from two days ago is kept as it is (the contract keeps unresolved claims).
    client
        .execute(
            "INSERT INTO idempotency_records (scope_key, key_id, method, path, idempotency_key, body_hash,
                 operation_id, claim_token, state, claimed_at)
             SELECT 'scope-o', key_id, method, path, 'key-o', body_hash, 'op_old', gen_random_uuid(), 'unresolved',
                 now() - interval '2 days'
             FROM idempotency_records WHERE idempotency_key = 'key-t'",
            &[],
        )
        .await
        .expect("an unresolved claim of two days ago that wrote nothing");
    projector::workers::maintenance::purge_and_reconcile(&app.pool.get().await.expect("client"))
        .await
        .expect("reconcile");
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'key-o'").await, 1);
    // Completed records expire after 24 hours; then the key executes again.
    let expiring = json!({"email": "expiring@example.com"});
    assert_eq!(app.create_with_key("key-e", &expiring).await.status, 201);
    client
        .execute(
            "UPDATE idempotency_records SET completed_at = now() - interval '25 hours' WHERE idempotency_key = 'key-e'",
            &[],
        )
        .await
        .expect("age");
    projector::workers::maintenance::purge_and_reconcile(&app.pool.get().await.expect("client")).await.expect("purge");
    let again = app.create_with_key("key-e", &expiring).await;
    assert_eq!(again.status, 409, "executed again (and the email is now taken)");
    assert!(again.header("idempotent-replay").is_none());
}

#[tokio::test]
async fn a_claim_of_an_instance_killed_mid_operation_is_taken_over_in_seconds_and_the_key_runs_again() {
    let app = TestApp::spawn().await;
    let port = free_port();
    let mut doomed =
        spawn_binary("command-service", &["serve"], &app.database_url, &[("APP__HTTP__PORT", port.to_string())]);
    let url = format!("http://127.0.0.1:{port}/v1");
    wait_until_listening(&app.http, &url).await;
    // Appends wait while this transaction holds the log's head: the operation is claimed and
    // stays in flight.
    let mut holder = app.pool.get().await.expect("client");
    let hold = holder.transaction().await.expect("begins");
    hold.batch_execute("LOCK TABLE log_head IN EXCLUSIVE MODE").await.expect("locks");
    let body = json!({"email": "orphan@example.com"});
    let request = app
        .http
        .post(format!("{url}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .header("Idempotency-Key", "key-k")
        .json(&body);
    let in_flight = tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) });
    let claimed = "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'key-k' AND state = 'processing'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.query_i64(claimed).await == 0 {
        assert!(Instant::now() < deadline, "the operation was claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.0.kill().expect("kill -9");
    let killed_at = Instant::now();
    assert!(in_flight.await.expect("joins").is_err(), "the caller never got an answer");
    // Its server session, waiting on the lock, never receives a COMMIT: it rolls back.
    hold.rollback().await.expect("releases");
    // A retry through a live instance meets the claim, told to come again in a second, until
    // the killed instance has missed its beats; then the retry finds that the operation wrote
    // nothing, takes the claim over and runs it, long before the minute after which any
    // claim would be.
    let first_retry = app.create_with_key("key-k", &body).await;
    assert_eq!(first_retry.code(), "idempotency_conflict", "{} {:?}", first_retry.status, first_retry.body);
    assert_eq!(first_retry.header("retry-after"), Some("1"));
    let ran = loop {
        let retry = app.create_with_key("key-k", &body).await;
        if retry.code() != "idempotency_conflict" {
            break retry;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(10), "taken over within the dead-after bound and a beat");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let settled_after = killed_at.elapsed();
    assert_eq!(ran.status, 201, "{:?}", ran.body);
    assert!(settled_after >= Duration::from_secs(3), "not before the owner missed its beats: {settled_after:?}");
    assert_eq!(ran.header("operation-id"), first_retry.header("operation-id"), "the operation keeps its id");
    let replayed = app.create_with_key("key-k", &body).await;
    assert_eq!((replayed.status, replayed.header("idempotent-replay")), (201, Some("true")));
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn a_holder_presumed_dead_while_alive_cannot_complete_after_its_claim_was_taken_over() {
    let app = TestApp::spawn().await;
    let mut holder = app.pool.get().await.expect("client");
    let hold = holder.transaction().await.expect("begins");
    // The holder's append waits at its first write (the contact's identity), before the
    // guard that completes its claim.
    hold.batch_execute("LOCK TABLE record_identities IN EXCLUSIVE MODE").await.expect("locks");
    let body = json!({"email": "stalled@example.com"});
    let first = {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
            .header("Idempotency-Key", "key-z")
            .json(&body);
        tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) })
    };
    let token = "SELECT claim_token::text FROM idempotency_records WHERE idempotency_key = 'key-z'";
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        if let Some(row) = app.pool.get().await.expect("client").query_opt(token, &[]).await.expect("reads") {
            break row.get::<_, String>(0);
        }
        assert!(Instant::now() < deadline, "the operation was claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The holder stalls (waiting on the lock) and is presumed dead: a retry takes the claim over.
    let client = app.pool.get().await.expect("client");
    client
        .execute(
            "UPDATE idempotency_records SET owner = gen_random_uuid(), claimed_at = now() - interval '10 seconds'
             WHERE idempotency_key = 'key-z'",
            &[],
        )
        .await
        .expect("presumed dead");
    let retry = {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
            .header("Idempotency-Key", "key-z")
            .json(&body);
        tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) })
    };
    while client.query_one(token, &[]).await.expect("reads").get::<_, String>(0) == held {
        assert!(Instant::now() < deadline, "the claim was taken over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    hold.rollback().await.expect("releases");
    // Both appends go ahead: the retry's runs, the stalled holder's fails on its claim.
    let (first, retry) =
        (first.await.expect("joins").expect("answered"), retry.await.expect("joins").expect("answered"));
    assert_eq!((first, retry), (409, 201), "the holder learns its outcome is not its own; the retry ran");
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn a_retry_that_finds_its_key_processing_is_answered_when_the_operation_ends() {
    let app = TestApp::spawn().await;
    let body = json!({"email": "waited@example.com"});
    let first = app.create_with_key("key-w", &body).await;
    assert_eq!(first.status, 201);
    let client = app.pool.get().await.expect("client");
    let recorded = client
        .query_one("SELECT status, response FROM idempotency_records WHERE idempotency_key = 'key-w'", &[])
        .await
        .expect("the recorded outcome");
    let (status, response): (i32, Value) = (recorded.get(0), recorded.get(1));
    // The operation is still running, as the retry arrives...
    client
        .execute("UPDATE idempotency_records SET state = 'processing', status = NULL, response = NULL", &[])
        .await
        .expect("an unfinished claim");
    // ... and ends 300 ms later: the retry is answered with its outcome, not told to come again.
    let ends = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client
            .execute(
                "UPDATE idempotency_records SET state = 'completed', status = $1, response = $2",
                &[&status, &response],
            )
            .await
            .expect("completes");
    };
    let (retry, ()) = tokio::join!(app.create_with_key("key-w", &body), ends);
    assert_eq!((retry.status, retry.header("idempotent-replay")), (201, Some("true")), "{:?}", retry.body);
    assert_eq!(retry.body, first.body);
    // One that does not end within the wait is told to come again.
    client
        .execute("UPDATE idempotency_records SET state = 'processing', status = NULL, response = NULL", &[])
        .await
        .expect("an unfinished claim");
    let started = Instant::now();
    let conflict = app.create_with_key("key-w", &body).await;
    assert_eq!(conflict.code(), "idempotency_conflict");
    assert_eq!(conflict.header("retry-after"), Some("1"));
    assert!(started.elapsed() >= Duration::from_secs(1), "waited first: {:?}", started.elapsed());
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn a_claim_the_database_could_not_settle_is_settled_when_it_comes_back() {
    use crate::fault_proxy::Fault;
    let app = TestApp::spawn().await;
    let (_instance, url, proxy) = app.command_service_behind_proxy(&[]).await;
    let mut holder = app.pool.get().await.expect("client");
    let hold = holder.transaction().await.expect("begins");
    hold.batch_execute("LOCK TABLE log_head IN EXCLUSIVE MODE").await.expect("locks");
    let body = json!({"email": "cut@example.com"});
    let request = app
        .http
        .post(format!("{url}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .header("Idempotency-Key", "key-c")
        .json(&body);
    let in_flight = tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) });
    let claimed = "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'key-c' AND state = 'processing'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.query_i64(claimed).await == 0 {
        assert!(Instant::now() < deadline, "the operation was claimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The instance's database goes away mid-operation: the operation fails, and so does the
    // statement that would settle its claim.
    proxy.set(Fault::Cut);
    let answered = in_flight.await.expect("joins").expect("an answer");
    assert_eq!(answered, 503, "the operation failed for want of its database");
    hold.rollback().await.expect("releases");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(app.query_i64(claimed).await, 1, "left processing while the database is away");
    proxy.set(Fault::Pass);
    // The instance, alive all along, settles the claim within a quarter of a second of its
    // database's return, and a retry sent at that moment (through another instance) waits for
    // that instead of meeting idempotency_conflict.
    let settled = app.create_with_key("key-c", &body).await;
    assert_ne!(settled.code(), "idempotency_conflict", "the first retry after the return: {:?}", settled.body);
    if settled.code() == "idempotency_outcome_unknown" {
        // Marked unresolved (the failure was at COMMIT): reconciliation finds nothing written.
        projector::workers::maintenance::purge_and_reconcile(&app.pool.get().await.expect("client"))
            .await
            .expect("reconcile");
        assert_eq!(app.create_with_key("key-c", &body).await.status, 201);
    } else {
        assert_eq!(settled.status, 201, "released: the key executed; {:?}", settled.body);
    }
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn a_claim_made_after_its_connection_failed_is_withdrawn_and_the_retry_executes() {
    use crate::fault_proxy::Fault;
    let app = TestApp::spawn().await;
    let (_instance, url, proxy) = app.command_service_behind_proxy(&[]).await;
    // An uncommitted claim of the same key (its scope as admission computes it, from a probe's
    // row) makes the instance's claim statement wait in the database, past its parsing.
    assert_eq!(app.create_with_key("probe", &json!({"email": "probe@example.com"})).await.status, 201);
    let mut holder = app.pool.get().await.expect("client");
    let probe = holder
        .query_one("SELECT key_id, method, path FROM idempotency_records WHERE idempotency_key = 'probe'", &[])
        .await
        .expect("the probe's claim");
    let (key_id, method, path): (String, String, String) = (probe.get(0), probe.get(1), probe.get(2));
    let scope = platform::ids::sha256_hex(&format!("{key_id}\u{1f}{method}\u{1f}{path}\u{1f}key-l"));
    let hold = holder.transaction().await.expect("begins");
    hold.execute(
        "INSERT INTO idempotency_records (scope_key, key_id, method, path, idempotency_key, body_hash, operation_id,
             claim_token, state)
         SELECT $1, key_id, method, path, 'key-l', body_hash, 'op_blocker', gen_random_uuid(), 'processing'
         FROM idempotency_records WHERE idempotency_key = 'probe'",
        &[&scope],
    )
    .await
    .expect("blocks");
    let body = json!({"email": "lost-claim@example.com"});
    let request = app
        .http
        .post(format!("{url}/schemas/contacts/records"))
        .bearer_auth(ALPHA_ADMIN)
        .header("Idempotency-Key", "key-l")
        .json(&body);
    let in_flight = tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) });
    let waiting = "SELECT count(*) FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock'
                     AND query LIKE 'INSERT INTO idempotency_records%'";
    app.wait_for_count(waiting, "the claim waits on the lock").await;
    // Its connection is cut while the statement waits (the instance never hears of the
    // claim), then the statement goes through on the server: a claim held by a live instance
    // that is not running its operation.
    proxy.set(Fault::Cut);
    assert_eq!(in_flight.await.expect("joins").expect("an answer"), 429, "admission could not tell");
    hold.rollback().await.expect("unlocks");
    let claimed = "SELECT count(*) FROM idempotency_records WHERE idempotency_key = 'key-l' AND state = 'processing'";
    app.wait_for_count(claimed, "the claim was made").await;
    proxy.set(Fault::Pass);
    let back = Instant::now();
    // The instance withdraws it once its database is back: the retry executes within
    // seconds, not after the claim timeout of a minute.
    let settled = loop {
        let retry = app.create_with_key("key-l", &body).await;
        if retry.code() != "idempotency_conflict" {
            break retry;
        }
        assert!(back.elapsed() < Duration::from_secs(10), "withdrawn within seconds: {:?}", retry.body);
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(settled.status, 201, "the key executed: {:?}", settled.body);
    assert_eq!(record_count(&app).await, 2, "the probe and the retried create");
}

#[tokio::test]
async fn patch_ignores_the_idempotency_key() {
    let app = TestApp::spawn().await;
    let record = app.create_contact(&json!({"email": "patch-idem@example.com"})).await;
    let id = record["id"].as_str().expect("id");
    for age in [1, 2] {
        let response = app
            .send(
                app.request(reqwest::Method::PATCH, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN))
                    .header("Idempotency-Key", "same")
                    .json(&json!({"age": age})),
            )
            .await;
        assert_eq!(response.status, 200);
        assert!(response.header("idempotent-replay").is_none());
        assert_eq!(response.body["data"]["age"], age, "each PATCH executes");
    }
    assert_eq!(app.query_i64("SELECT count(*) FROM idempotency_records").await, 0);
}

async fn keyed(app: &TestApp, method: reqwest::Method, path: &str, key: &str, body: Option<&Value>) -> TestResponse {
    let mut request = app.request(method, path, Some(ALPHA_ADMIN)).header("Idempotency-Key", key);
    if let Some(body) = body {
        request = request.json(body);
    }
    app.send(request).await
}

async fn suppression_events(app: &TestApp) -> i64 {
    app.query_i64("SELECT count(*) FROM events WHERE event_type IN ('SuppressionAdded.v1', 'SuppressionRemoved.v1')")
        .await
}

#[tokio::test]
async fn suppression_batches_and_delete_honour_the_key() {
    let app = TestApp::spawn().await;
    let batch = json!({"suppressions": [
        {"identifier": "one@example.com", "reason": "manual"},
        {"identifier": "two@example.com", "reason": "legal"},
    ]});
    let first = keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch", "batch-1", Some(&batch)).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert_eq!(first.body["data"]["summary"]["created"], 2);
    let operation_id = first.header("operation-id").expect("Operation-Id").to_owned();
    let events = suppression_events(&app).await;
    // Without the key the repeat would report `exists`; with it the original answer is replayed.
    let replay = keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch", "batch-1", Some(&batch)).await;
    assert_eq!((replay.status, replay.header("idempotent-replay")), (200, Some("true")));
    assert_eq!(replay.header("operation-id"), Some(operation_id.as_str()));
    assert_eq!(replay.body, first.body);
    assert_eq!(suppression_events(&app).await, events, "the replay wrote nothing");
    let other = json!({"suppressions": [{"identifier": "three@example.com", "reason": "manual"}]});
    let reused = keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch", "batch-1", Some(&other)).await;
    assert_eq!((reused.status, reused.code().as_str()), (422, Some("idempotency_key_reused")));

    let ids: Vec<Value> = first.body["data"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|result| result["suppression"]["id"].clone())
        .collect();
    let remove = json!({ "ids": ids });
    let removed =
        keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch-remove", "rm-1", Some(&remove)).await;
    assert_eq!(removed.body["data"]["summary"]["removed"], 2, "{:?}", removed.body);
    let again = keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch-remove", "rm-1", Some(&remove)).await;
    assert_eq!(again.header("idempotent-replay"), Some("true"));
    assert_eq!(again.body, removed.body, "replayed, not `not_found`");
    let fresh = keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch-remove", "rm-2", Some(&remove)).await;
    assert_eq!(fresh.body["data"]["summary"]["removed"], 0, "a new key executes again");

    let single = app
        .post("/contacts/suppressions", ALPHA_ADMIN, &json!({"identifier": "d@example.com", "reason": "manual"}))
        .await;
    let path = format!("/contacts/suppressions/{}", single.body["data"]["id"].as_str().expect("id"));
    let deleted = keyed(&app, reqwest::Method::DELETE, &path, "del-1", None).await;
    assert_eq!(deleted.status, 200);
    assert!(deleted.header("operation-id").is_some());
    let replayed = keyed(&app, reqwest::Method::DELETE, &path, "del-1", None).await;
    assert_eq!((replayed.status, replayed.header("idempotent-replay")), (200, Some("true")));
    let unkeyed = app.send(app.request(reqwest::Method::DELETE, &path, Some(ALPHA_ADMIN))).await;
    assert_eq!(unkeyed.code().as_str(), Some("suppression_not_found"));
    // An error after the claim is replayed too.
    let missing = keyed(&app, reqwest::Method::DELETE, "/contacts/suppressions/sup_missing", "del-2", None).await;
    assert_eq!(missing.status, 404);
    let missing_again = keyed(&app, reqwest::Method::DELETE, "/contacts/suppressions/sup_missing", "del-2", None).await;
    assert_eq!((missing_again.status, missing_again.header("idempotent-replay")), (404, Some("true")));
}

#[tokio::test]
async fn twenty_concurrent_identical_batches_execute_once() {
    let app = TestApp::spawn().await;
    let batch = json!({"suppressions": [
        {"identifier": "c1@example.com", "reason": "manual"},
        {"identifier": "c2@example.com", "reason": "manual"},
    ]});
    let before = suppression_events(&app).await;
    let requests =
        (0..20).map(|_| keyed(&app, reqwest::Method::POST, "/contacts/suppressions/batch", "same", Some(&batch)));
    let answers = futures_util::future::join_all(requests).await;
    let created: Vec<&TestResponse> = answers.iter().filter(|answer| answer.status == 200).collect();
    assert!(!created.is_empty());
    assert!(created.iter().all(|answer| answer.body == created[0].body), "every 200 carries the one outcome");
    assert!(
        answers.iter().all(|answer| answer.status == 200 || answer.code().as_str() == Some("idempotency_conflict")),
        "{:?}",
        answers.iter().map(|a| (a.status, a.body.clone())).collect::<Vec<_>>()
    );
    assert_eq!(suppression_events(&app).await - before, 2, "the batch executed once");
}

#[tokio::test]
async fn a_batch_with_repeated_items_reports_them_as_existing() {
    let app = TestApp::spawn().await;
    let batch = json!({"suppressions": [
        {"identifier": "rep@example.com", "reason": "manual"},
        {"identifier": "REP@example.com", "reason": "manual"},
        {"identifier": "rep@example.com", "reason": "legal"},
    ]});
    let answer = app.post("/contacts/suppressions/batch", ALPHA_ADMIN, &batch).await;
    let statuses: Vec<&str> = answer.body["data"]["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|result| result["status"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(statuses, ["created", "exists", "created"], "{:?}", answer.body);
}

#[tokio::test]
async fn a_stalled_admission_answers_429_and_leaves_no_claim_behind() {
    let app = TestApp::spawn().await;
    // Another session holds the idempotency table: admission cannot complete.
    let (locker, connection) =
        tokio_postgres::connect(&app.database_url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    locker.batch_execute("BEGIN; LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE").await.expect("lock");
    let body = json!({"email": "stalled@example.com"});
    let started = std::time::Instant::now();
    let busy = app.create_with_key("stalled", &body).await;
    assert_eq!((busy.status, busy.code().as_str()), (429, Some("idempotency_admission_busy")), "{:?}", busy.body);
    assert!(busy.header("retry-after").is_some());
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    // The abandoned claim is withdrawn: the retry executes (possibly after a brief conflict).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let retry = app.create_with_key("stalled", &body).await;
        if retry.status == 201 {
            break;
        }
        assert_eq!(retry.code().as_str(), Some("idempotency_conflict"), "{:?}", retry.body);
        assert!(std::time::Instant::now() < deadline, "the abandoned claim was never withdrawn");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(record_count(&app).await, 1);
}

#[tokio::test]
async fn a_claim_that_lands_after_its_admission_gave_up_is_withdrawn_and_the_retry_runs() {
    let app = TestApp::spawn().await;
    // The calling key's scope, from a claim of its own.
    assert_eq!(app.create_with_key("probe", &json!({"email": "probe@example.com"})).await.status, 201);
    let client = app.pool.get().await.expect("client");
    let probe = client
        .query_one("SELECT key_id, method, path FROM idempotency_records WHERE idempotency_key = 'probe'", &[])
        .await
        .expect("the probe's claim");
    let (key_id, method, path): (String, String, String) = (probe.get(0), probe.get(1), probe.get(2));
    // Another transaction claims the key and stays open: the admission's claim statement waits
    // behind it, and gives up (429) while it waits.
    let (locker, connection) =
        tokio_postgres::connect(&app.database_url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(connection);
    locker.batch_execute("BEGIN").await.expect("begins");
    locker
        .execute(
            "INSERT INTO idempotency_records (scope_key, key_id, method, path, idempotency_key, body_hash,
                 operation_id, claim_token, state)
             VALUES (encode(sha256(convert_to($1 || chr(31) || $2 || chr(31) || $3 || chr(31) || 'late', 'UTF8')), 'hex'),
                     $1, $2, $3, 'late', 'x', 'op_other', gen_random_uuid(), 'processing')",
            &[&key_id, &method, &path],
        )
        .await
        .expect("a claim of the same key, not committed");
    let body = json!({"email": "late@example.com"});
    let busy = app.create_with_key("late", &body).await;
    assert_eq!((busy.status, busy.code().as_str()), (429, Some("idempotency_admission_busy")), "{:?}", busy.body);
    // That transaction ends without its claim: the admission's claim lands now, after its
    // first withdrawal found nothing to delete.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    locker.batch_execute("ROLLBACK").await.expect("rolls back");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let retry = app.create_with_key("late", &body).await;
        if retry.status == 201 {
            break;
        }
        assert_eq!(retry.code().as_str(), Some("idempotency_conflict"), "{:?}", retry.body);
        assert!(Instant::now() < deadline, "the claim that landed late was never withdrawn");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(record_count(&app).await, 2);
}

#[tokio::test]
async fn a_transient_failure_that_wrote_nothing_releases_the_claim() {
    let app = TestApp::spawn().await;
    // The log refuses every append for a while (as a database out of resources would: the
    // SQLSTATE class says the failure is transient).
    let client = app.pool.get().await.expect("client");
    client
        .batch_execute(
            "CREATE FUNCTION refuse_appends() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'injected failure' USING ERRCODE = '53000'; END; $$;
             CREATE TRIGGER refuse_appends BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION refuse_appends();",
        )
        .await
        .expect("install the failure");
    let body = json!({"email": "transient@example.com"});
    let failed = app.create_with_key("transient", &body).await;
    assert_eq!((failed.status, failed.code().as_str()), (503, Some("service_unavailable")), "{:?}", failed.body);
    client.batch_execute("DROP TRIGGER refuse_appends ON events").await.expect("remove the failure");
    // Not a replay of the 503: the retry executes.
    let retry = app.create_with_key("transient", &body).await;
    assert_eq!(retry.status, 201, "{:?}", retry.body);
    assert!(retry.header("idempotent-replay").is_none());
    assert_eq!(record_count(&app).await, 1);
}
