//! The event log: gapless total order under concurrent writer processes, optimistic
//! concurrency per stream, and append-only rows.

use std::time::Duration;

use platform::events::LogEvent;
use platform::log::{
    AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, Metadata, NewEvent, SetValue, StreamAppend,
};
use platform::proto;
use serde_json::json;

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
    assert_batches_cover_each_event_once(&app, "records", max).await;
}

pub(crate) async fn wait_until_listening(http: &reqwest::Client, base_url: &str) {
    // 30 s: a process started while the rest of the suite loads both cores can take seconds.
    for _ in 0..600 {
        if http.get(format!("{base_url}/me")).send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base_url} did not start");
}

/// The committed batches of a projection never overlap, and every event of its types in
/// 1..=head lies in one of them: each was applied exactly once, in order; and its checkpoint
/// is the head.
pub(crate) async fn assert_batches_cover_each_event_once(app: &TestApp, name: &str, head: i64) {
    let client = app.pool.get().await.expect("client");
    let rows = client
        .query(
            "SELECT first_position, last_position FROM projection_batches WHERE name = $1 AND version = 1
             ORDER BY first_position",
            &[&name],
        )
        .await
        .expect("batches");
    // A span passed over without a batch (it held none of the read model's events) is a hole
    // only the read model's events may not fall in.
    let types = crate::helpers::read_model(name).event_types();
    let unapplied = "SELECT count(*) FROM events WHERE event_type = ANY($1) AND position BETWEEN $2 AND $3";
    let mut next = 1;
    for row in rows {
        let (first, last): (i64, i64) = (row.get(0), row.get(1));
        assert!(first >= next, "batches of {name} overlap at {first}");
        let missed: i64 = client.query_one(unapplied, &[&types, &next, &(first - 1)]).await.expect("count").get(0);
        assert_eq!(missed, 0, "no batch of {name} applied its events in {next}..{}", first - 1);
        assert!(last >= first);
        next = last + 1;
    }
    let missed: i64 = client.query_one(unapplied, &[&types, &next, &head]).await.expect("count").get(0);
    assert_eq!(missed, 0, "no batch of {name} applied its events in {next}..{head}");
    let position: i64 = client
        .query_one("SELECT position FROM projections WHERE name = $1 AND version = 1", &[&name])
        .await
        .expect("checkpoint")
        .get(0);
    assert_eq!(position, head, "{name} reached the head");
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

/// An appending process slow to read its answers (a busy one) does not hold the log's head:
/// its COMMIT goes out behind the statement that takes the positions, not after that
/// statement's answer has come back. Through a proxy that holds every answer 500 ms, the head
/// row is seen locked for well under that; sent after the answer, the COMMIT would keep it
/// locked at least 500 ms, and every other process's appends behind it.
#[tokio::test]
async fn the_log_head_is_not_held_while_its_appender_reads_the_answers() {
    let app = TestApp::spawn().await;
    let (proxy, proxied) = app.database_behind_proxy().await;
    let pool = platform::db::pool(&proxied, 2).expect("a pool through the proxy");
    let event_log = EventLog::start(pool, 64);
    // Prepares the batch's statements while answers pass at once.
    event_log.append(space_event("test/warm", ExpectedVersion::Any)).await.expect("appended");
    let delay = Duration::from_millis(500);
    proxy.set(crate::fault_proxy::Fault::DelayAnswers(delay));

    let probe = app.pool.get().await.expect("client");
    let appending = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let appended = event_log.append(space_event("test/held", ExpectedVersion::Any)).await;
        (appended, started.elapsed())
    });
    // The longest run of probes that found the head row locked, from the first to the last.
    let (mut longest, mut locked_since) = (Duration::ZERO, None);
    while !appending.is_finished() {
        let now = std::time::Instant::now();
        match probe.query("SELECT position FROM log_head FOR SHARE NOWAIT", &[]).await {
            Ok(_) => locked_since = None,
            Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                let since = *locked_since.get_or_insert(now);
                longest = longest.max(now - since);
            }
            Err(error) => panic!("the probe failed: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let (appended, took) = appending.await.expect("the append's task");
    appended.expect("appended through the slow answers");
    assert!(took >= delay, "the append waited for its held answers ({took:?})");
    assert!(longest < delay / 2, "the head stayed locked {longest:?} while its appender's answers were held {delay:?}");
    let events = app.query_i64("SELECT count(*) FROM events WHERE stream_id = 'test/held'").await;
    assert_eq!(events, 1);
}

/// A batch written set-wise opens its transaction with its first statements: its `BEGIN` is
/// not a round trip of its own, after which the transaction would sit open while the appender
/// waits for a core to send the rest. With every answer from PostgreSQL held, an append
/// takes three of them (the staging statements with the `BEGIN`, the positions with the
/// `COMMIT`, the followers' notification), where it took four.
#[tokio::test]
async fn a_set_write_sends_its_begin_with_its_first_statements() {
    let app = TestApp::spawn().await;
    let (proxy, proxied) = app.database_behind_proxy().await;
    // One connection: the write and the notification after it use the one that prepared the
    // statements.
    let pool = platform::db::pool(&proxied, 1).expect("a pool through the proxy");
    let event_log = EventLog::start(pool, 64);
    event_log.append(space_event("test/warm", ExpectedVersion::Any)).await.expect("appended");
    let delay = Duration::from_millis(500);
    proxy.set(crate::fault_proxy::Fault::DelayAnswers(delay));
    let started = std::time::Instant::now();
    event_log.append(space_event("test/begun", ExpectedVersion::Any)).await.expect("appended");
    let took = started.elapsed();
    assert!(took >= delay * 3, "every answer was held ({took:?})");
    assert!(took < delay * 7 / 2, "the append waited {took:?} for answers held {delay:?} each: four round trips");
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE stream_id = 'test/begun'").await, 1);
    // The connection went back to the pool outside a transaction.
    proxy.set(crate::fault_proxy::Fault::Pass);
    event_log.append(space_event("test/after", ExpectedVersion::Any)).await.expect("appended after");
    assert_eq!(app.query_i64("SELECT count(*) FROM events WHERE stream_id = 'test/after'").await, 1);
}

/// A claim of `value` with its set form, as the record identity guards are.
fn claim(value: &str, record_id: &str) -> Guard {
    let row = ["spc_x", "sch_x", "email", value, record_id];
    Guard::unique(
        "INSERT INTO record_identities (space_id, schema_id, kind, value, record_id) VALUES ($1, $2, $3, $4, $5)",
        row.iter().map(|value| Box::new((*value).to_owned()) as Box<_>).collect(),
        AppendError::Conflict { code: platform::error::Code::IdentifierConflict, message: value.to_owned() },
    )
    .with_set(
        "INSERT INTO record_identities (space_id, schema_id, kind, value, record_id)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])",
        row.iter().map(|value| SetValue::Text(Some((*value).to_owned()))).collect(),
    )
}

#[tokio::test]
async fn a_batch_written_set_wise_fails_exactly_the_commands_that_fail_alone() {
    let app = TestApp::spawn().await;
    let event_log = EventLog::start(app.pool.clone(), 64);
    event_log.append(space_event("test/advanced", ExpectedVersion::NoStream)).await.expect("advanced");
    event_log.append(space_event("test/extended", ExpectedVersion::NoStream)).await.expect("extended");
    let from = app.query_i64("SELECT position FROM log_head").await;
    // Forty commands at once: distinct new streams, each claiming a value; every fifth claims
    // the same value, so exactly one of those eight wins. One advances a stream from the
    // right version, one from a stale one, one appends to a stream at any version.
    let mut tasks = Vec::new();
    for index in 0..40 {
        let event_log = event_log.clone();
        tasks.push(tokio::spawn(async move {
            let (stream, expected) = match index {
                1 => ("test/advanced".to_owned(), ExpectedVersion::Exactly(1)),
                2 => ("test/advanced-stale".to_owned(), ExpectedVersion::Exactly(7)),
                3 => ("test/extended".to_owned(), ExpectedVersion::Any),
                _ => (format!("test/new-{index}"), ExpectedVersion::NoStream),
            };
            let mut request = space_event(&stream, expected);
            let value = if index % 5 == 0 { "taken-by-one".to_owned() } else { format!("value-{index}") };
            request.guards.push(claim(&value, &format!("rec_{index}")));
            (index, event_log.append(request).await)
        }));
    }
    let mut succeeded = Vec::new();
    let mut shared_claims = 0;
    for task in tasks {
        let (index, outcome) = task.await.expect("task");
        match (index, outcome) {
            (2, outcome) => assert!(matches!(outcome, Err(AppendError::WrongVersion { .. })), "{outcome:?}"),
            (index, Ok(appended)) => {
                if index % 5 == 0 {
                    shared_claims += 1;
                }
                succeeded.push((index, appended.last_position));
            }
            (index, Err(AppendError::Conflict { message, .. })) if index % 5 == 0 => {
                assert_eq!(message, "taken-by-one")
            }
            (index, Err(error)) => panic!("command {index} failed: {error:?}"),
        }
    }
    assert_eq!(shared_claims, 1, "exactly one claim of the shared value wins");
    assert_eq!(succeeded.len(), 40 - 1 - 7);
    // Every successful command's event and claim are there, at distinct positions that fill
    // the range without a gap; nothing of a failed command is.
    let mut positions: Vec<i64> = succeeded.iter().map(|(_, position)| *position).collect();
    positions.sort_unstable();
    let expected: Vec<i64> = (from + 1..=from + succeeded.len() as i64).collect();
    assert_eq!(positions, expected);
    assert_eq!(app.query_i64(&format!("SELECT count(*) FROM events WHERE position > {from}")).await, 32);
    assert_eq!(app.query_i64("SELECT count(*) FROM record_identities WHERE space_id = 'spc_x'").await, 32);
    let client = app.pool.get().await.expect("client");
    let winner: String = client
        .query_one("SELECT record_id FROM record_identities WHERE value = 'taken-by-one'", &[])
        .await
        .expect("the shared value is claimed")
        .get(0);
    assert!(succeeded.iter().any(|(index, _)| winner == format!("rec_{index}")));
    assert_eq!(app.query_i64("SELECT version FROM streams WHERE stream_id = 'test/advanced'").await, 2);
    assert_eq!(app.query_i64("SELECT version FROM streams WHERE stream_id = 'test/extended'").await, 2);
    assert_eq!(
        app.query_i64("SELECT max(stream_version) FROM events WHERE stream_id = 'test/extended'").await,
        2,
        "an append at any version continues the stream"
    );
    assert_eq!(app.query_i64("SELECT count(*) FROM streams WHERE stream_id = 'test/advanced-stale'").await, 0);
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

/// A service's appends go over a connection of their own, named `event-log`: they are the
/// largest messages a process sends, and tokio-postgres keeps each connection's buffers at
/// the largest it has sent. Over the process's shared pool, every connection came to hold
/// them in turn (the run engine grew by about 40 MB over a release of 50,000 held emails).
/// With the log's head held here, the create's append waits on it, and the connection seen
/// waiting is the log's.
#[tokio::test]
async fn a_services_appends_go_over_a_connection_of_their_own() {
    let app = TestApp::spawn().await;
    let mut holder = app.pool.get().await.expect("client");
    let holding = holder.transaction().await.expect("transaction");
    holding.query("SELECT position FROM log_head FOR UPDATE", &[]).await.expect("the head held");
    let creating = {
        let request = app
            .request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
            .json(&json!({"email": "own-connection@example.com"}));
        tokio::spawn(async move { request.send().await.map(|response| response.status().as_u16()) })
    };
    let probe = app.pool.get().await.expect("client");
    let waiting = "SELECT application_name FROM pg_stat_activity
                   WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%UPDATE log_head%'";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let names: Vec<String> = loop {
        let rows = probe.query(waiting, &[]).await.expect("pg_stat_activity");
        if !rows.is_empty() {
            break rows.iter().map(|row| row.get(0)).collect();
        }
        assert!(std::time::Instant::now() < deadline, "no append came to wait on the log's head");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(names, vec![platform::db::LOG_APPLICATION_NAME.to_owned()], "the connections waiting to append");
    holding.rollback().await.expect("the head let go");
    assert_eq!(creating.await.expect("the create").expect("an answer"), 201);
}
