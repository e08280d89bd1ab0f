//! The OpenAI-compatible AI provider against the loopback fake: values come back normalised,
//! requests carry what the provider needs, and each failure lands in the right error kind.
//! No database.

use std::time::{Duration, Instant};

use ai_provider::{AiError, AiProvider, FillTask};
use platform::settings::AiSettings;
use serde_json::{Map, Value, json};

use crate::fake_ai::{FakeAi, Mode};

const MODEL: &str = "test-model";
const API_KEY: &str = "sk-fake-0001";

fn provider(endpoint: &str, timeout: Duration) -> AiProvider {
    AiProvider::new(&AiSettings::openai(endpoint, MODEL, Some(API_KEY), timeout)).expect("build the openai provider")
}

fn input() -> Map<String, Value> {
    let Value::Object(input) = json!({"name": "Ada Lovelace", "employees": 12}) else { unreachable!() };
    input
}

async fn fill(provider: &AiProvider, definition: Value) -> Result<Value, AiError> {
    let input = input();
    provider.fill(&FillTask { attribute_key: "size", definition: &definition, input: &input }).await
}

#[tokio::test]
async fn answers_come_back_checked_and_normalised() {
    let fake = FakeAi::start().await;
    let provider = provider(&fake.url, Duration::from_secs(5));
    assert_eq!(provider.name(), "openai");

    assert_eq!(fill(&provider, json!({"type": "string"})).await, Ok(json!("filled")), "the default answer");

    fake.set_mode(Mode::Answer(json!(42)));
    assert_eq!(fill(&provider, json!({"type": "integer"})).await, Ok(json!(42)));

    fake.set_mode(Mode::Answer(json!(" Ada@Example.COM ")));
    assert_eq!(fill(&provider, json!({"type": "email"})).await, Ok(json!("ada@example.com")));

    fake.set_mode(Mode::Answer(json!("2026-11-21T16:49:41+01:00")));
    assert_eq!(fill(&provider, json!({"type": "datetime"})).await, Ok(json!("2026-11-21T15:49:41.000Z")));

    fake.set_mode(Mode::Answer(json!("huge")));
    let outcome = fill(&provider, json!({"type": "select", "options": ["small", "large"]})).await;
    assert!(matches!(outcome, Err(AiError::Unfit(_))), "an answer outside the options is unfit: {outcome:?}");

    fake.set_mode(Mode::Answer(json!("many")));
    let outcome = fill(&provider, json!({"type": "integer"})).await;
    assert!(matches!(outcome, Err(AiError::Unfit(_))), "a string for an integer is unfit: {outcome:?}");

    fake.set_mode(Mode::Answer(Value::Null));
    let outcome = fill(&provider, json!({"type": "string"})).await;
    assert!(matches!(outcome, Err(AiError::Unfit(_))), "a null value is unfit: {outcome:?}");

    assert_eq!(fake.requests().len(), 7, "exactly one request per fill");
}

#[tokio::test]
async fn the_request_carries_the_model_key_prompt_and_input() {
    let fake = FakeAi::start().await;
    let provider = provider(&format!("{}/", fake.url), Duration::from_secs(5));
    let definition = json!({
        "type": "select",
        "options": ["small", {"value": "large"}],
        "autoFill": {"enabled": true, "prompt": "Guess the company size"},
    });
    fake.set_mode(Mode::Answer(json!("large")));
    assert_eq!(fill(&provider, definition).await, Ok(json!("large")));

    assert_eq!(fake.authorizations(), vec![Some(format!("Bearer {API_KEY}"))]);
    let requests = fake.requests();
    let [request] = requests.as_slice() else { panic!("one request expected: {requests:?}") };
    assert_eq!(request["model"], MODEL);
    assert_eq!(request["temperature"], 0);
    assert_eq!(request["response_format"], json!({"type": "json_object"}));
    assert_eq!(request["messages"][0]["role"], "system");
    let system = request["messages"][0]["content"].as_str().expect("system content");
    assert!(system.contains("\"value\"") && system.contains("\"small\", \"large\""), "{system}");
    assert_eq!(request["messages"][1]["role"], "user");
    let user = request["messages"][1]["content"].as_str().expect("user content");
    assert!(user.contains("size") && user.contains("Guess the company size"), "{user}");
    assert!(user.contains("Ada Lovelace"), "the input values are sent: {user}");

    let without_key =
        AiProvider::new(&AiSettings::openai(&fake.url, MODEL, None, Duration::from_secs(5))).expect("provider");
    assert_eq!(fill(&without_key, json!({"type": "string"})).await, Ok(json!("large")));
    assert_eq!(fake.authorizations().last(), Some(&None), "no key, no Authorization header");
}

#[tokio::test]
async fn refusals_and_garbage_are_spent_failures() {
    let fake = FakeAi::start().await;
    let provider = provider(&fake.url, Duration::from_secs(5));

    fake.set_mode(Mode::Refuse);
    let refused = fill(&provider, json!({"type": "string"})).await.expect_err("a refusal");
    assert!(matches!(refused, AiError::Refused(_)) && refused.spent(), "{refused:?}");

    fake.set_mode(Mode::Body(json!({
        "choices": [{"index": 0, "finish_reason": "content_filter", "message": {"role": "assistant", "content": null}}]
    })));
    let filtered = fill(&provider, json!({"type": "string"})).await.expect_err("a filtered answer");
    assert!(matches!(filtered, AiError::Refused(_)), "{filtered:?}");

    fake.set_mode(Mode::Garbage);
    let garbage = fill(&provider, json!({"type": "string"})).await.expect_err("garbage");
    assert!(matches!(garbage, AiError::Unfit(_)) && garbage.spent(), "{garbage:?}");

    fake.set_mode(Mode::Body(json!({"id": "x", "choices": []})));
    let empty = fill(&provider, json!({"type": "string"})).await.expect_err("no choices");
    assert!(matches!(empty, AiError::Unfit(_)), "{empty:?}");
}

#[tokio::test]
async fn a_hang_past_the_timeout_has_an_unknown_outcome() {
    let fake = FakeAi::start().await;
    let provider = provider(&fake.url, Duration::from_millis(300));
    fake.set_mode(Mode::Hang(Duration::from_secs(5)));
    let started_at = Instant::now();
    let outcome = fill(&provider, json!({"type": "string"})).await.expect_err("a timeout");
    assert!(matches!(outcome, AiError::OutcomeUnknown(_)) && outcome.spent(), "{outcome:?}");
    assert!(started_at.elapsed() < Duration::from_secs(3), "the timeout cut the call short");
    assert_eq!(fake.requests().len(), 1, "the request was sent");
}

#[tokio::test]
async fn error_statuses_are_transient_or_refused() {
    let fake = FakeAi::start().await;
    let provider = provider(&fake.url, Duration::from_secs(5));

    for status in [503, 500, 429, 408] {
        fake.set_mode(Mode::Status(status));
        let outcome = fill(&provider, json!({"type": "string"})).await.expect_err("an error status");
        assert!(matches!(outcome, AiError::Transient(_)) && !outcome.spent(), "{status}: {outcome:?}");
    }

    for status in [400, 401, 404] {
        fake.set_mode(Mode::Status(status));
        let outcome = fill(&provider, json!({"type": "string"})).await.expect_err("an error status");
        let AiError::Refused(message) = &outcome else { panic!("{status} should be refused: {outcome:?}") };
        assert!(message.contains(&status.to_string()), "the message names the status: {message}");
        assert!(message.contains("the fake AI answers"), "the message carries the body: {message}");
        assert!(outcome.spent());
    }
}

#[tokio::test]
async fn a_closed_port_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let provider = provider(&format!("http://127.0.0.1:{port}/v1"), Duration::from_secs(5));
    let outcome = fill(&provider, json!({"type": "string"})).await.expect_err("nothing listens");
    assert!(matches!(outcome, AiError::Transient(_)) && !outcome.spent(), "{outcome:?}");
}
