//! The one interface AI-backed features (attribute auto-fill, filters generated from free-text
//! requirements) go through, so callers neither know nor care whether an OpenAI-compatible
//! service or the built-in deterministic provider answers, and every answer reaches them
//! already checked: a value against the attribute's type, a filter against the rules of
//! [`filter::from_json`].
//!
//! Two providers:
//! - `openai`: an OpenAI-compatible chat-completions client. It POSTs
//!   `{endpoint}/chat/completions` asking for a JSON object (`{"value": ...}` to fill an
//!   attribute, `{"filter": <expression>}` for a filter) and reads
//!   `choices[0].message.content`.
//! - `deterministic` (the default): no network. A filter is the requirements read as the
//!   plain-words language of [`filter`]; text outside that language is `Unfit`. An
//!   attribute's value is derived from the SHA-256 of the
//!   attribute key, the prompt (`autoFill.prompt`, or the key when there is none) and the
//!   canonical JSON of the input values, so the same task always gives the same value. By the
//!   attribute's type, with `hex8` the first 8 hex digits of the hash and `n` its first 8 bytes
//!   read as a big-endian integer:
//!   - string, text: `"{prompt}: {hex8}"`
//!   - email: `"auto-{hex8}@example.invalid"`
//!   - phone: `"+1555"` followed by `n mod 10^7` as 7 digits
//!   - integer: `n mod 1000`
//!   - number: `(n mod 100000) / 100`
//!   - boolean: whether the lowest bit of `n` is set
//!   - date: 2000-01-01 plus `n mod 10000` days, as `YYYY-MM-DD`
//!   - datetime: that date at `12:00:00.000Z`
//!   - select: the option at `n mod len` (unfit when the definition has no options)
//!   - multiselect: a one-element array of that option
//!   - json and any other type: `{"prompt": prompt}`
//!
//!   Test hooks: a prompt or requirements containing `[refuse]` give `Refused`, `[unfit]`
//!   gives `Unfit`, `[unknown]` gives `OutcomeUnknown` and `[transient]` gives `Transient`
//!   (checked in that order, before anything else).
//!
//! Whatever the provider, a value passes through [`normalize_value`] and a filter through
//! [`filter::from_json`]'s checks before it is returned.

use std::time::Duration;

use anyhow::Context;
use chrono::NaiveDate;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use domain::attributes::{attribute_type, normalize_value, options};
use filter::{self, Filter, MAX_CONDITIONS, MAX_DEPTH};
use platform::settings::{AiSettings, ProviderKind};
use secrecy::{ExposeSecret, SecretString};

/// One auto-fill request: fill attribute `attribute_key` (its definition carries
/// `autoFill.prompt`) from the `input` values of the event or record.
#[derive(Debug, Clone, Copy)]
pub struct FillTask<'a> {
    pub attribute_key: &'a str,
    pub definition: &'a Value,
    pub input: &'a Map<String, Value>,
}

/// Why a provider call gave no value. The variants differ in what a caller may do next:
/// only `Transient` is known not to have reached the provider.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AiError {
    /// The provider answered and refused (HTTP 4xx other than 408/429, a `refusal`, or
    /// finish_reason `content_filter`).
    #[error("the AI provider refused: {0}")]
    Refused(String),
    /// The provider answered, but its output is missing, null, unparseable, not a value of the
    /// attribute's type or not a valid filter.
    #[error("the AI provider's output does not fit what was asked: {0}")]
    Unfit(String),
    /// Known not to have produced an output, so safe to retry: the connection failed before
    /// the request was sent, or HTTP 408, 429 or 5xx.
    #[error("the AI provider is unavailable: {0}")]
    Transient(String),
    /// The call may or may not have been processed: a timeout after sending, or the
    /// connection was lost while waiting for or reading the response.
    #[error("the outcome of the AI provider call is unknown: {0}")]
    OutcomeUnknown(String),
}

/// A configured AI provider; cheap to clone (the HTTP client shares its connection pool).
#[derive(Debug, Clone)]
pub enum AiProvider {
    Deterministic,
    OpenAiCompatible(OpenAiClient),
}

/// An OpenAI-compatible chat-completions client.
#[derive(Debug, Clone)]
pub struct OpenAiClient {
    http: reqwest::Client,
    completions_url: String,
    model: String,
    api_key: Option<SecretString>,
}

impl AiError {
    /// Whether the call reached the provider and so spends a credit.
    pub fn spent(&self) -> bool {
        !matches!(self, AiError::Transient(_))
    }
}

impl AiProvider {
    pub fn new(settings: &AiSettings) -> anyhow::Result<Self> {
        match settings.provider {
            ProviderKind::Deterministic => Ok(AiProvider::Deterministic),
            ProviderKind::OpenAi => Ok(AiProvider::OpenAiCompatible(OpenAiClient::new(settings)?)),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            AiProvider::Deterministic => "deterministic",
            AiProvider::OpenAiCompatible(_) => "openai",
        }
    }

    /// Exactly one provider call. The value is already checked and normalised against
    /// `task.definition`.
    #[tracing::instrument(skip_all, fields(provider = self.name(), attribute = task.attribute_key))]
    pub async fn fill(&self, task: &FillTask<'_>) -> Result<Value, AiError> {
        let outcome = match self {
            AiProvider::Deterministic => deterministic_fill(task),
            AiProvider::OpenAiCompatible(client) => client.fill(task).await,
        };
        if let Err(error) = &outcome {
            tracing::debug!(%error, "auto-fill call gave no value");
        }
        outcome
    }

    /// Exactly one provider call that turns free-text `requirements` into a filter, already
    /// checked like [`filter::from_json`] checks a stored expression.
    #[tracing::instrument(skip_all, fields(provider = self.name()))]
    pub async fn filter(&self, requirements: &str) -> Result<Filter, AiError> {
        let outcome = match self {
            AiProvider::Deterministic => deterministic_filter(requirements),
            AiProvider::OpenAiCompatible(client) => client.filter(requirements).await,
        };
        if let Err(error) = &outcome {
            tracing::debug!(%error, "filter call gave no filter");
        }
        outcome
    }
}

impl OpenAiClient {
    pub fn new(settings: &AiSettings) -> anyhow::Result<Self> {
        let endpoint = settings.endpoint.trim().trim_end_matches('/');
        anyhow::ensure!(!endpoint.is_empty(), "the AI endpoint must be set for the openai provider");
        anyhow::ensure!(!settings.model.trim().is_empty(), "the AI model must be set for the openai provider");
        let url =
            reqwest::Url::parse(endpoint).with_context(|| format!("the AI endpoint {endpoint:?} is not a URL"))?;
        anyhow::ensure!(
            matches!(url.scheme(), "http" | "https"),
            "the AI endpoint {endpoint:?} must be an http or https URL"
        );
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(settings.timeout_millis))
            .build()
            .context("building the AI provider's HTTP client")?;
        Ok(Self {
            http,
            completions_url: format!("{endpoint}/chat/completions"),
            model: settings.model.trim().to_owned(),
            api_key: settings.api_key.clone(),
        })
    }

    async fn fill(&self, task: &FillTask<'_>) -> Result<Value, AiError> {
        let answer = self.complete(&system_instructions(task.definition), &user_message(task)).await?;
        let value = answer_value(&answer)?;
        normalize_value(task.definition, value).map_err(AiError::Unfit)
    }

    async fn filter(&self, requirements: &str) -> Result<Filter, AiError> {
        let answer = self.complete(&filter_instructions(), &format!("Requirements: {requirements}")).await?;
        answer_filter(&answer)
    }

    /// One chat completion with a system and a user message; the JSON object its first choice
    /// answers with.
    async fn complete(&self, system: &str, user: &str) -> Result<Value, AiError> {
        let body = json!({
            "model": self.model,
            "temperature": 0,
            "response_format": {"type": "json_object"},
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
        });
        let mut request = self.http.post(&self.completions_url).json(&body);
        if let Some(api_key) = &self.api_key {
            request = request.bearer_auth(api_key.expose_secret());
        }
        let response = request.send().await.map_err(classify_send_error)?;
        let status = response.status();
        if !status.is_success() {
            // The status alone decides; the body only adds detail to the message.
            let text = response.text().await.unwrap_or_default();
            let detail = format!("HTTP {status}: {}", excerpt(&text));
            return Err(match status.as_u16() {
                408 | 429 | 500..=599 => AiError::Transient(detail),
                _ => AiError::Refused(detail),
            });
        }
        let text = response
            .text()
            .await
            .map_err(|error| AiError::OutcomeUnknown(format!("reading the response failed: {error}")))?;
        parse_completion(&text)
    }
}

fn classify_send_error(error: reqwest::Error) -> AiError {
    let message = error_chain(&error);
    if error.is_connect() { AiError::Transient(message) } else { AiError::OutcomeUnknown(message) }
}

/// reqwest's own message hides the cause (e.g. "connection refused"), so follow the chain.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// The JSON content of the first choice.
fn parse_completion(text: &str) -> Result<Value, AiError> {
    let body: Value = serde_json::from_str(text)
        .map_err(|error| AiError::Unfit(format!("the response is not JSON ({error}): {}", excerpt(text))))?;
    let choice = body
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or_else(|| AiError::Unfit(format!("the response has no choices: {}", excerpt(text))))?;
    let message = choice.get("message");
    if let Some(refusal) = message.and_then(|message| message.get("refusal")).and_then(Value::as_str) {
        return Err(AiError::Refused(refusal.to_owned()));
    }
    if choice.get("finish_reason").and_then(Value::as_str) == Some("content_filter") {
        return Err(AiError::Refused("the answer was withheld by the content filter".to_owned()));
    }
    let content = message
        .and_then(|message| message.get("content"))
        .and_then(Value::as_str)
        .ok_or_else(|| AiError::Unfit("the answer has no content".to_owned()))?;
    serde_json::from_str(content.trim())
        .map_err(|error| AiError::Unfit(format!("the answer is not JSON ({error}): {}", excerpt(content))))
}

/// The `value` of an auto-fill answer, not yet checked against the type.
fn answer_value(answer: &Value) -> Result<Value, AiError> {
    match answer.get("value") {
        None | Some(Value::Null) => {
            Err(AiError::Unfit(format!("the answer has no value: {}", excerpt(&answer.to_string()))))
        }
        Some(value) => Ok(value.clone()),
    }
}

/// The checked `filter` of a filter answer.
fn answer_filter(answer: &Value) -> Result<Filter, AiError> {
    match answer.get("filter") {
        None | Some(Value::Null) => {
            Err(AiError::Unfit(format!("the answer has no filter: {}", excerpt(&answer.to_string()))))
        }
        Some(expression) => filter::from_json(expression).map_err(|error| AiError::Unfit(error.to_string())),
    }
}

fn excerpt(text: &str) -> String {
    const LIMIT: usize = 200;
    let text = text.trim();
    match text.char_indices().nth(LIMIT) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

fn system_instructions(definition: &Value) -> String {
    format!(
        "You fill one attribute of a CRM record or event from the values given. \
         Answer with a JSON object {{\"value\": <value>}} and nothing else. \
         The value must be {}.",
        type_description(definition)
    )
}

fn filter_instructions() -> String {
    format!(
        "You turn a description of which CRM records or events to select into a filter expression. \
         Answer with a JSON object {{\"filter\": <expression>}} and nothing else. \
         An expression is one of: \
         {{\"all\": [<expression>, ...]}} (every expression holds); \
         {{\"any\": [<expression>, ...]}} (at least one holds); \
         {{\"not\": <expression>}} (the expression does not hold); \
         or a condition {{\"field\": <path>, \"op\": <op>, \"value\": <value>}}. \
         A path is a string naming a field of the record's data; dots reach into nested objects, \
         e.g. \"plan\" or \"address.country\". \
         The ops are: \"eq\" and \"ne\" (equal, not equal), \"contains\" (a substring of a string, \
         or an element of an array), \"starts_with\" and \"ends_with\" (value a string), \
         \"gt\", \"gte\", \"lt\" and \"lte\" (value a number, or a date such as \"2024-05-01\"), \
         \"in\" (value a non-empty array of values), \"exists\" and \"not_exists\" (no value). \
         A value is a string, number or boolean, never null. Strings compare ignoring case. \
         Use at most {MAX_DEPTH} levels of nesting and at most {MAX_CONDITIONS} conditions."
    )
}

fn type_description(definition: &Value) -> String {
    let quoted_options =
        || options(definition).iter().map(|option| Value::String((*option).to_owned()).to_string()).collect::<Vec<_>>();
    match attribute_type(definition) {
        "string" => "a short string".to_owned(),
        "text" => "a string".to_owned(),
        "email" => "an email address string".to_owned(),
        "phone" => "a phone number string, e.g. \"+1 555 010 2030\"".to_owned(),
        "number" => "a JSON number".to_owned(),
        "integer" => "a JSON integer".to_owned(),
        "boolean" => "true or false".to_owned(),
        "date" => "a date string formatted YYYY-MM-DD".to_owned(),
        "datetime" => "an RFC 3339 date-time string such as \"2026-11-21T15:49:41.123Z\"".to_owned(),
        "timezone" => "an IANA time zone name such as \"Europe/Berlin\"".to_owned(),
        "select" => format!("exactly one of these strings: {}", quoted_options().join(", ")),
        "multiselect" => format!("a JSON array of strings, each one of: {}", quoted_options().join(", ")),
        _ => "any JSON value".to_owned(),
    }
}

fn user_message(task: &FillTask<'_>) -> String {
    let input = serde_json::to_string(task.input).unwrap_or_else(|_| "{}".to_owned());
    format!("Attribute: {}\nInstructions: {}\nInput values (JSON): {input}", task.attribute_key, prompt(task))
}

fn prompt<'a>(task: &FillTask<'a>) -> &'a str {
    task.definition
        .get("autoFill")
        .and_then(|auto_fill| auto_fill.get("prompt"))
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|prompt| !prompt.is_empty())
        .unwrap_or(task.attribute_key)
}

/// The deterministic provider's test hooks, the same for every kind of call.
fn test_hooks(prompt: &str) -> Result<(), AiError> {
    if prompt.contains("[refuse]") {
        return Err(AiError::Refused("the prompt asks for a refusal".to_owned()));
    }
    if prompt.contains("[unfit]") {
        return Err(AiError::Unfit("the prompt asks for an unfit answer".to_owned()));
    }
    if prompt.contains("[unknown]") {
        return Err(AiError::OutcomeUnknown("the prompt asks for an unknown outcome".to_owned()));
    }
    if prompt.contains("[transient]") {
        return Err(AiError::Transient("the prompt asks for a transient failure".to_owned()));
    }
    Ok(())
}

fn deterministic_filter(requirements: &str) -> Result<Filter, AiError> {
    test_hooks(requirements)?;
    filter::parse_plain(requirements).map_err(|error| AiError::Unfit(error.to_string()))
}

fn deterministic_fill(task: &FillTask<'_>) -> Result<Value, AiError> {
    let prompt = prompt(task);
    test_hooks(prompt)?;

    let digest = deterministic_digest(task.attribute_key, prompt, task.input);
    let hex8 = hex::encode(&digest[..4]);
    let mut first_bytes = [0_u8; 8];
    first_bytes.copy_from_slice(&digest[..8]);
    let number = u64::from_be_bytes(first_bytes);
    let date = || {
        NaiveDate::from_ymd_opt(2000, 1, 1)
            .and_then(|start| start.checked_add_days(chrono::Days::new(number % 10_000)))
            .map(|date| date.format("%Y-%m-%d").to_string())
            .ok_or_else(|| AiError::Unfit("the derived date is out of range".to_owned()))
    };
    let pick_option = || {
        let options = options(task.definition);
        let index = usize::try_from(number % options.len().max(1) as u64).unwrap_or_default();
        options
            .get(index)
            .map(|option| Value::String((*option).to_owned()))
            .ok_or_else(|| AiError::Unfit("the definition has no options to choose from".to_owned()))
    };

    let value = match attribute_type(task.definition) {
        "string" | "text" => Value::String(format!("{prompt}: {hex8}")),
        "email" => Value::String(format!("auto-{hex8}@example.invalid")),
        "phone" => Value::String(format!("+1555{:07}", number % 10_000_000)),
        "integer" => json!(number % 1000),
        "number" => json!((number % 100_000) as f64 / 100.0),
        "boolean" => Value::Bool(number & 1 == 1),
        "date" => Value::String(date()?),
        "datetime" => Value::String(format!("{}T12:00:00.000Z", date()?)),
        "timezone" => Value::String("Etc/UTC".to_owned()),
        "select" => pick_option()?,
        "multiselect" => Value::Array(vec![pick_option()?]),
        _ => json!({"prompt": prompt}),
    };
    normalize_value(task.definition, value).map_err(AiError::Unfit)
}

/// Each part is length-prefixed so that moving text between the parts changes the hash.
fn deterministic_digest(attribute_key: &str, prompt: &str, input: &Map<String, Value>) -> [u8; 32] {
    let input = serde_json::to_string(input).unwrap_or_default();
    let mut hasher = Sha256::new();
    for part in [attribute_key, prompt, input.as_str()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> Map<String, Value> {
        let Value::Object(map) = json!({"name": "Ada Lovelace", "company": "Analytical Engines"}) else {
            unreachable!()
        };
        map
    }

    async fn fill(definition: Value) -> Result<Value, AiError> {
        let input = input();
        let task = FillTask { attribute_key: "summary", definition: &definition, input: &input };
        AiProvider::Deterministic.fill(&task).await
    }

    #[tokio::test]
    async fn every_type_gets_a_value_of_that_type() {
        let string = fill(json!({"type": "string", "autoFill": {"prompt": "Describe"}})).await.expect("string");
        let string = string.as_str().expect("a string");
        assert!(string.starts_with("Describe: "), "{string}");
        assert_eq!(string.len(), "Describe: ".len() + 8);

        let text = fill(json!({"type": "text"})).await.expect("text");
        assert!(text.as_str().expect("a string").starts_with("summary: "), "the key stands in for the prompt");

        let email = fill(json!({"type": "email"})).await.expect("email");
        let email = email.as_str().expect("a string");
        assert!(email.starts_with("auto-") && email.ends_with("@example.invalid"), "{email}");

        let phone = fill(json!({"type": "phone"})).await.expect("phone");
        let phone = phone.as_str().expect("a string");
        assert!(phone.starts_with("+1555") && phone.len() == 12, "{phone}");
        assert!(phone[1..].chars().all(|c| c.is_ascii_digit()), "{phone}");

        let integer = fill(json!({"type": "integer"})).await.expect("integer");
        assert!(integer.as_u64().is_some_and(|n| n < 1000), "{integer}");

        let number = fill(json!({"type": "number"})).await.expect("number");
        assert!(number.as_f64().is_some_and(|n| (0.0..1000.0).contains(&n)), "{number}");

        assert!(fill(json!({"type": "boolean"})).await.expect("boolean").is_boolean());

        let date = fill(json!({"type": "date"})).await.expect("date");
        let date = NaiveDate::parse_from_str(date.as_str().expect("a string"), "%Y-%m-%d").expect("a date");
        let start = NaiveDate::from_ymd_opt(2000, 1, 1).expect("a date");
        assert!(date >= start && (date - start).num_days() < 10_000, "{date}");

        let datetime = fill(json!({"type": "datetime"})).await.expect("datetime");
        assert!(datetime.as_str().expect("a string").ends_with("T12:00:00.000Z"), "{datetime}");

        let select = fill(json!({"type": "select", "options": ["a", {"value": "b"}, "c"]})).await.expect("select");
        assert!(["a", "b", "c"].contains(&select.as_str().expect("a string")), "{select}");

        let multiselect = fill(json!({"type": "multiselect", "options": ["x", "y"]})).await.expect("multiselect");
        let items = multiselect.as_array().expect("an array");
        assert_eq!(items.len(), 1);
        assert!(["x", "y"].contains(&items[0].as_str().expect("a string")), "{multiselect}");

        assert_eq!(
            fill(json!({"type": "json", "autoFill": {"prompt": "Extract"}})).await,
            Ok(json!({"prompt": "Extract"}))
        );
        assert_eq!(fill(json!({"type": "mystery"})).await, Ok(json!({"prompt": "summary"})));
    }

    #[tokio::test]
    async fn a_select_without_options_is_unfit() {
        assert!(matches!(fill(json!({"type": "select"})).await, Err(AiError::Unfit(_))));
        assert!(matches!(fill(json!({"type": "multiselect", "options": []})).await, Err(AiError::Unfit(_))));
    }

    #[tokio::test]
    async fn the_same_task_gives_the_same_value_and_a_different_one_differs() {
        let definition = json!({"type": "string", "autoFill": {"enabled": true, "prompt": "Say"}});
        let first = fill(definition.clone()).await.expect("first");
        assert_eq!(fill(definition.clone()).await.expect("second"), first);

        let mut other_input = input();
        other_input.insert("name".to_owned(), json!("Grace Hopper"));
        let task = FillTask { attribute_key: "summary", definition: &definition, input: &other_input };
        assert_ne!(AiProvider::Deterministic.fill(&task).await.expect("other input"), first);

        let input = input();
        let task = FillTask { attribute_key: "other", definition: &definition, input: &input };
        assert_ne!(AiProvider::Deterministic.fill(&task).await.expect("other key"), first);
    }

    #[tokio::test]
    async fn prompt_hooks_give_each_error() {
        let with_prompt = |prompt: &str| json!({"type": "string", "autoFill": {"prompt": prompt}});
        assert!(matches!(fill(with_prompt("please [refuse]")).await, Err(AiError::Refused(_))));
        assert!(matches!(fill(with_prompt("[unfit] now")).await, Err(AiError::Unfit(_))));
        assert!(matches!(fill(with_prompt("x [unknown]")).await, Err(AiError::OutcomeUnknown(_))));
        assert!(matches!(fill(with_prompt("[transient]")).await, Err(AiError::Transient(_))));
    }

    #[test]
    fn only_transient_errors_are_not_spent() {
        assert!(AiError::Refused(String::new()).spent());
        assert!(AiError::Unfit(String::new()).spent());
        assert!(AiError::OutcomeUnknown(String::new()).spent());
        assert!(!AiError::Transient(String::new()).spent());
    }

    #[test]
    fn settings_choose_the_provider() {
        let deterministic = AiProvider::new(&AiSettings::deterministic()).expect("deterministic");
        assert_eq!(deterministic.name(), "deterministic");
        let settings = AiSettings::openai("http://127.0.0.1:9/v1/", "m", Some("k"), Duration::from_secs(1));
        let openai = AiProvider::new(&settings).expect("openai");
        assert_eq!(openai.name(), "openai");
        let AiProvider::OpenAiCompatible(client) = openai else { unreachable!() };
        assert_eq!(client.completions_url, "http://127.0.0.1:9/v1/chat/completions");
        assert!(!format!("{client:?}").contains("\"k\""), "the key never prints");
        assert!(AiProvider::new(&AiSettings::openai("", "m", None, Duration::from_secs(1))).is_err());
        assert!(AiProvider::new(&AiSettings::openai("http://x/v1", "", None, Duration::from_secs(1))).is_err());
    }

    #[test]
    fn completions_are_parsed_and_refusals_recognised() {
        let answer = |content: Value| {
            json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})
                .to_string()
        };
        let value = |text: &str| parse_completion(text).and_then(|answer| answer_value(&answer));
        assert_eq!(value(&answer(json!("{\"value\": 42}"))), Ok(json!(42)));
        assert!(matches!(value(&answer(json!("{\"value\": null}"))), Err(AiError::Unfit(_))));
        assert!(matches!(value(&answer(json!("{}"))), Err(AiError::Unfit(_))));
        assert!(matches!(value(&answer(json!("not json"))), Err(AiError::Unfit(_))));
        assert!(matches!(parse_completion(&answer(Value::Null)), Err(AiError::Unfit(_))));
        assert!(matches!(parse_completion("{\"choices\": []}"), Err(AiError::Unfit(_))));
        let filtered = json!({"choices": [{"finish_reason": "content_filter", "message": {"content": null}}]});
        assert!(matches!(parse_completion(&filtered.to_string()), Err(AiError::Refused(_))));
    }

    #[test]
    fn the_system_message_names_the_type_and_options() {
        let instructions = system_instructions(&json!({"type": "select", "options": ["red", {"value": "blue"}]}));
        assert!(instructions.contains("{\"value\": <value>}"), "{instructions}");
        assert!(instructions.contains("\"red\", \"blue\""), "{instructions}");
    }

    #[tokio::test]
    async fn given_plain_requirements_when_the_deterministic_provider_filters_then_it_reads_the_language() {
        let filter = AiProvider::Deterministic.filter("plan is pro and email ends with @acme.com").await;

        assert_eq!(filter, Ok(filter::parse_plain("plan is pro and email ends with @acme.com").expect("valid")));
        let filter = filter.expect("a filter");
        assert!(filter::matches(&filter, &json!({"plan": "PRO", "email": "ada@acme.com"})));
    }

    #[tokio::test]
    async fn given_requirements_outside_the_language_when_the_deterministic_provider_filters_then_they_are_unfit() {
        let outcome = AiProvider::Deterministic.filter("everyone who bought twice last month").await;

        let Err(AiError::Unfit(message)) = outcome else { panic!("unfit expected: {outcome:?}") };
        assert!(message.contains("expected"), "the parse error says what was expected: {message}");
    }

    #[tokio::test]
    async fn given_a_test_hook_when_the_deterministic_provider_filters_then_the_hook_wins() {
        let filter = |requirements: &'static str| AiProvider::Deterministic.filter(requirements);
        assert!(matches!(filter("plan is pro [refuse]").await, Err(AiError::Refused(_))));
        assert!(matches!(filter("[unfit] plan is pro").await, Err(AiError::Unfit(_))));
        assert!(matches!(filter("plan is pro [unknown]").await, Err(AiError::OutcomeUnknown(_))));
        assert!(matches!(filter("[transient]").await, Err(AiError::Transient(_))));
        assert!(matches!(filter("[refuse] [transient]").await, Err(AiError::Refused(_))), "checked in order");
    }

    #[test]
    fn given_a_completion_when_its_filter_is_read_then_it_is_checked() {
        let answer = |content: Value| {
            json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})
                .to_string()
        };
        let read = |content: Value| parse_completion(&answer(content)).and_then(|answer| answer_filter(&answer));

        let expression = json!({"all": [
            {"field": "plan", "op": "eq", "value": "pro"},
            {"field": "email", "op": "ends_with", "value": "@acme.com"},
        ]});
        let content = json!({"filter": expression}).to_string();
        assert_eq!(
            read(json!(content)),
            Ok(filter::parse_plain("plan is pro and email ends with @acme.com").expect("valid"))
        );

        for unfit in [
            json!({}),
            json!({"filter": null}),
            json!({"filter": "plan is pro"}),
            json!({"filter": {"field": "plan", "op": "equals", "value": "pro"}}),
            json!({"filter": {"all": []}}),
        ] {
            let outcome = read(json!(unfit.to_string()));
            assert!(matches!(outcome, Err(AiError::Unfit(_))), "{unfit}: {outcome:?}");
        }
        let Err(AiError::Unfit(message)) =
            read(json!(json!({"filter": {"field": "plan", "op": "equals"}}).to_string()))
        else {
            panic!("unfit expected")
        };
        assert!(message.contains("unknown op `equals`"), "the message says what is wrong: {message}");
        let refused = json!({"choices": [{"message": {"refusal": "no"}}]}).to_string();
        assert!(matches!(
            parse_completion(&refused).and_then(|answer| answer_filter(&answer)),
            Err(AiError::Refused(_))
        ));
    }

    #[test]
    fn the_filter_instructions_describe_the_expression_grammar() {
        let instructions = filter_instructions();
        assert!(instructions.contains("{\"filter\": <expression>}"), "{instructions}");
        for word in ["\"all\"", "\"any\"", "\"not\"", "\"starts_with\"", "\"not_exists\"", "\"in\"", "at most 8 levels"]
        {
            assert!(instructions.contains(word), "{word} in {instructions}");
        }
    }
}
