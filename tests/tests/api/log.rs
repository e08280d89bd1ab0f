//! The event log: gapless total order under concurrent writer processes, optimistic
//! concurrency per stream, and append-only rows.

use std::time::Duration;

use serde_json::json;
use shared::events::LogEvent;
use shared::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, Metadata, NewEvent, StreamAppend};
use shared::proto;

use crate::helpers::*;

fn space_event(stream_id: &str, expected: ExpectedVersion) -> AppendRequest {
    AppendRequest {
        metadata: Metadata::default(),
        streams: vec![StreamAppend {
            stream_id: stream_id.to_owned(),
            expected,
            events: vec![NewEvent {
                event: LogEvent::SpaceDefined(proto::SpaceDefined {
                    space_id: "spc_x".into(),
                    slug: "x".into(),
                    name: "X".into(),
                }),
                subject_id: None,
                occurred_at: chrono::Utc::now(),
            }],
        }],
        guards: Vec::new(),
    }
}

#[tokio::test]
async fn several_writer_processes_append_every_event_once_in_order() {
    let app = TestApp::spawn().await;
    let head_before = app.query_i64("SELECT position FROM log_head").await;
    let mut writers = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..3 {
        let port = free_port();
        writers.push(spawn_binary(
            "command-service",
            &["serve"],
            &app.database_url,
            &[("APP__HTTP__PORT", port.to_string())],
        ));
        urls.push(format!("http://127.0.0.1:{port}/v1"));
    }
    for url in &urls {
        wait_until_listening(&app.http, url).await;
    }
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let url = urls[worker % urls.len()].clone();
        let http = app.http.clone();
        tasks.push(tokio::spawn(async move {
            for index in 0..25 {
                let response = http
                    .post(format!("{url}/schemas/contacts/records"))
                    .bearer_auth(if index % 2 == 0 { ALPHA_ADMIN } else { ALPHA_MEMBER })
                    .json(&json!({"email": format!("w{worker}-{index}@example.com")}))
                    .send()
                    .await
                    .expect("sent");
                assert_eq!(response.status().as_u16(), 201);
            }
        }));
    }
    for task in tasks {
        task.await.expect("writer task");
    }
    app.wait_for_projections().await;
    let client = app.pool.get().await.expect("client");
    let row = client.query_one("SELECT count(*), min(position), max(position) FROM events", &[]).await.expect("stats");
    let (count, min, max): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((min, max), (1, count), "positions are gapless from 1");
    assert_eq!(max - head_before, 300);
    let projected = client
        .query_one("SELECT count(*), count(DISTINCT record_id) FROM rm_records_v1.records", &[])
        .await
        .expect("count");
    assert_eq!((projected.get::<_, i64>(0), projected.get::<_, i64>(1)), (300, 300));
    let counted = app.query_i64("SELECT total FROM rm_records_v1.record_counts").await;
    assert_eq!(counted, 300);
    assert_batches_contiguous(&app, "records", max).await;
}

pub async fn wait_until_listening(http: &reqwest::Client, base_url: &str) {
    for _ in 0..200 {
        if http.get(format!("{base_url}/me")).send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base_url} did not start");
}

/// The committed batches of a projection cover 1..=head exactly once, in order.
pub async fn assert_batches_contiguous(app: &TestApp, name: &str, head: i64) {
    let client = app.pool.get().await.expect("client");
    let rows = client
        .query(
            "SELECT first_position, last_position FROM projection_batches WHERE name = $1 AND version = 1
             ORDER BY first_position",
            &[&name],
        )
        .await
        .expect("batches");
    let mut next = 1;
    for row in rows {
        let (first, last): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(first, next, "batches of {name} overlap or leave a hole");
        assert!(last >= first);
        next = last + 1;
    }
    assert_eq!(next - 1, head, "batches of {name} reach the head");
}

#[tokio::test]
async fn a_lost_race_on_a_stream_fails_only_that_command() {
    let app = TestApp::spawn().await;
    let event_log = EventLog::start(app.pool.clone(), 64);
    let mut tasks = Vec::new();
    for index in 0..20 {
        let event_log = event_log.clone();
        let stream = if index % 2 == 0 { "test/contended".to_owned() } else { format!("test/free-{index}") };
        tasks.push(tokio::spawn(async move {
            (index, event_log.append(space_event(&stream, ExpectedVersion::NoStream)).await)
        }));
    }
    let mut contended_ok = 0;
    for task in tasks {
        let (index, outcome) = task.await.expect("task");
        if index % 2 == 0 {
            match outcome {
                Ok(_) => contended_ok += 1,
                Err(AppendError::WrongVersion { stream_id }) => assert_eq!(stream_id, "test/contended"),
                Err(other) => panic!("unexpected {other:?}"),
            }
        } else {
            assert!(outcome.is_ok(), "an uncontended command succeeds despite its neighbours: {outcome:?}");
        }
    }
    assert_eq!(contended_ok, 1);
    let stale = event_log.append(space_event("test/contended", ExpectedVersion::Exactly(5))).await;
    assert!(matches!(stale, Err(AppendError::WrongVersion { .. })));
    let next = event_log.append(space_event("test/contended", ExpectedVersion::Exactly(1))).await;
    assert!(next.is_ok());
    let versions = app.query_i64("SELECT max(stream_version) FROM events WHERE stream_id = 'test/contended'").await;
    assert_eq!(versions, 2);
}

#[tokio::test]
async fn log_rows_are_never_updated_or_deleted() {
    let app = TestApp::spawn().await;
    let client = app.pool.get().await.expect("client");
    for statement in ["UPDATE events SET event_type = 'x'", "DELETE FROM events", "TRUNCATE events"] {
        let error = client.batch_execute(statement).await.expect_err("refused");
        assert!(
            error.to_string().contains("append-only") || format!("{error:?}").contains("append-only"),
            "{statement}: {error:?}"
        );
    }
}
