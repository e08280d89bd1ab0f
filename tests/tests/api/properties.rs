//! Property: any input the write path accepts is projected. Arbitrary JSON (any Unicode,
//! NUL included, numbers at their limits, nesting, unknown keys) is sent to the record and
//! event write endpoints; every answer is either a 4xx or an acceptance whose result becomes
//! readable, and no read model is left with a dead letter.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Number, Value};

use crate::helpers::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z0-9._%+-]{1,12}@[a-z0-9-]{1,10}\\.(com|org|io)",
        "\\PC{0,40}",
        Just("a\u{0}b".to_owned()),
        "[\\x00-\\x1f]{0,5}",
        "[a-z]{0,3000}",
        Just("+1 (555) 010-9999".to_owned()),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |number| Number::from_f64(number).map(Value::Number)),
        prop_oneof![Just(0.1_f64), Just(f64::MAX), Just(f64::MIN_POSITIVE), Just(-0.0)]
            .prop_filter_map("finite", |number| Number::from_f64(number).map(Value::Number)),
        text().prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6).prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// An input object: mostly known keys with values of a plausible type (so that many inputs
/// are accepted and reach the read models), sometimes anything at all.
fn input(fields: &'static [(&'static str, Kind)], required: (&'static str, Kind)) -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        6 => prop::sample::select(fields).prop_flat_map(|(key, kind)| (Just(key.to_owned()), plausible(kind))),
        1 => (prop::sample::select(fields).prop_map(|(key, _)| key.to_owned()), value()),
        1 => (prop_oneof![text(), Just("score".to_owned()), Just("createdAt".to_owned())], value()),
    ];
    (plausible(required.1), prop::collection::vec(field, 0..5)).prop_map(move |(first, fields)| {
        let mut object = Map::new();
        object.insert(required.0.to_owned(), first);
        object.extend(fields);
        Value::Object(object)
    })
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Text,
    Email,
    Phone,
    Integer,
    Number,
    Choice(&'static [&'static str]),
}

fn plausible(kind: Kind) -> BoxedStrategy<Value> {
    match kind {
        Kind::Text => text().prop_map(Value::String).boxed(),
        Kind::Email => "[a-z0-9.]{1,12}@[a-z0-9]{1,10}\\.com".prop_map(Value::String).boxed(),
        Kind::Phone => "\\+?[0-9]{5,15}".prop_map(Value::String).boxed(),
        Kind::Integer => prop_oneof![any::<i64>().prop_map(Value::from), Just(Value::Null)].boxed(),
        Kind::Number => prop_oneof![
            any::<f64>().prop_filter_map("finite", |number| Number::from_f64(number).map(Value::Number)),
            any::<i64>().prop_map(Value::from),
        ]
        .boxed(),
        Kind::Choice(options) => prop::sample::select(options).prop_map(Value::from).boxed(),
    }
}

const RECORD_FIELDS: &[(&str, Kind)] = &[
    ("firstName", Kind::Text),
    ("plan", Kind::Choice(&["free", "pro"])),
    ("age", Kind::Integer),
    ("email", Kind::Email),
    ("userId", Kind::Text),
    ("phone", Kind::Phone),
    ("id", Kind::Text),
];
const EVENT_FIELDS: &[(&str, Kind)] = &[
    ("amount", Kind::Number),
    ("amount", Kind::Integer),
    ("item", Kind::Text),
    ("category", Kind::Choice(&["books", "games"])),
    ("eventId", Kind::Text),
    ("occurredAt", Kind::Text),
];

fn runner() -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(96);
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

/// Sends one input; an acceptance must become readable (`read` gives the path of the read).
/// Counts acceptances in `accepted`.
async fn accepted_is_readable(
    accepted: &std::sync::atomic::AtomicUsize,
    app: &TestApp,
    write_path: &str,
    body: &Value,
    read: impl Fn(&Value) -> Option<String>,
) -> Result<(), TestCaseError> {
    let written = app.post(write_path, ALPHA_ADMIN, body).await;
    if written.status >= 500 {
        return Err(TestCaseError::fail(format!("{} for {body}: {:?}", written.status, written.body)));
    }
    if !(200..300).contains(&written.status) {
        prop_assert!(written.body["error"]["code"].is_string(), "an error envelope: {:?}", written.body);
        return Ok(());
    }
    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = read(&written.body).ok_or_else(|| TestCaseError::fail(format!("no id in {:?}", written.body)))?;
    let token = written.header("consistency-token").unwrap_or("0").to_owned();
    let read =
        app.send(app.request(reqwest::Method::GET, &path, Some(ALPHA_ADMIN)).header("Consistency-Token", token)).await;
    prop_assert_eq!(read.status, 200, "accepted {} but the read answered {:?}", body, read.body);
    prop_assert!(read.body["warnings"].is_null(), "the write was projected: {:?}", read.body);
    Ok(())
}

/// A property that only ever met refusals would prove nothing about projection.
fn enough_accepted(accepted: &std::sync::atomic::AtomicUsize) {
    let accepted = accepted.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("accepted inputs: {accepted}");
    assert!(accepted >= 10, "only {accepted} inputs were accepted; the generator is too wild");
}

async fn no_dead_letters(app: &TestApp) {
    app.wait_for_projections().await;
    assert_eq!(app.query_i64("SELECT count(*) FROM projection_dead_letters").await, 0, "no read model failed");
}

#[test]
fn any_record_input_the_write_path_accepts_is_projected() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let app = runtime.block_on(TestApp::spawn());
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = runner();
    runner
        .run(&input(RECORD_FIELDS, ("plan", Kind::Choice(&["free", "pro"]))), |body| {
            runtime.block_on(accepted_is_readable(&accepted, &app, "/schemas/contacts/records", &body, |written| {
                let id = written["data"]["id"].as_str()?;
                Some(format!("/schemas/contacts/records/{id}"))
            }))
        })
        .expect("every accepted record input is projected");
    runtime.block_on(no_dead_letters(&app));
    enough_accepted(&accepted);
}

#[test]
fn any_event_input_the_write_path_accepts_is_projected() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let app = runtime.block_on(TestApp::spawn());
    let accepted = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = runner();
    runner
        .run(&input(EVENT_FIELDS, ("amount", Kind::Number)), |body| {
            runtime.block_on(accepted_is_readable(&accepted, &app, "/events/purchase", &body, |written| {
                let id = written["data"]["id"].as_str()?;
                Some(format!("/events/purchase/{id}/status"))
            }))
        })
        .expect("every accepted event input is projected");
    runtime.block_on(no_dead_letters(&app));
    enough_accepted(&accepted);
}
