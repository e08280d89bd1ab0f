//! The filter's types ([`Filter`], [`Condition`], [`Op`], ...) with their JSON values, and
//! what a text reads as: a number, and for a bare word a boolean, number or string.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value, json};

use crate::{Engaged, Engagement, FilterError, MAX_FIELD_PATH_CHARS, from_json};

/// A filter over JSON documents. Those that [`parse_plain`](crate::parse_plain) and [`from_json`] return are
/// within the limits and normalised (no `All` directly inside an `All`, no `Any` directly
/// inside an `Any`, no group of fewer than two filters).
#[derive(Debug, Clone, PartialEq)]
pub enum Filter {
    All(Vec<Filter>),
    Any(Vec<Filter>),
    Not(Box<Filter>),
    Condition(Condition),
    /// Events a contact performed: segments only (a document alone has no events).
    Performed(Performed),
    /// Emails a contact opened or clicked: segments only.
    Engaged(Engaged),
}

/// `performed <event> [at least N times] [in the last N <unit>]`: the contact has at least
/// `at_least` occurrences of the event, within the window ending at the evaluation time when
/// there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Performed {
    /// The event schema: the slug as written, or its id once the caller resolved it.
    pub event: String,
    /// At least this many occurrences (1 or more).
    pub at_least: u32,
    /// The window ending at the evaluation time, in seconds; `None` for all time.
    pub within_seconds: Option<u64>,
}

/// What a filter is evaluated against: a document, and for `performed` the times (Unix
/// milliseconds) of the subject's events by the name `Performed::event` holds, and the time
/// of the evaluation.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub document: &'a Value,
    pub events: &'a std::collections::HashMap<String, Vec<i64>>,
    /// The subject's opens and clicks, for `opened` and `clicked`.
    pub engagement: &'a [Engagement],
    pub now_ms: i64,
}

/// One comparison of the value at `field` in the document.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    pub field: FieldPath,
    pub op: Op,
}

/// A comparison and its value; the variants are the JSON form's `op`s.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Eq(Scalar),
    Ne(Scalar),
    Contains(Scalar),
    StartsWith(String),
    EndsWith(String),
    Gt(Scalar),
    Gte(Scalar),
    Lt(Scalar),
    Lte(Scalar),
    Exists,
    NotExists,
    In(Vec<Scalar>),
}

/// A value a condition compares with.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    String(String),
    Number(Number),
    Bool(bool),
}

/// A dot-separated path into a document (`address.country`), checked by [`FieldPath::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath(pub(crate) String);

impl Filter {
    /// The JSON form, as [`from_json`] reads it.
    pub fn to_json(&self) -> Value {
        match self {
            Filter::All(parts) => json!({"all": parts.iter().map(Filter::to_json).collect::<Vec<_>>()}),
            Filter::Any(parts) => json!({"any": parts.iter().map(Filter::to_json).collect::<Vec<_>>()}),
            Filter::Not(inner) => json!({"not": inner.to_json()}),
            Filter::Performed(performed) => {
                let mut inner = Map::new();
                inner.insert("event".to_owned(), Value::String(performed.event.clone()));
                inner.insert("atLeast".to_owned(), json!(performed.at_least));
                if let Some(seconds) = performed.within_seconds {
                    inner.insert("withinSeconds".to_owned(), json!(seconds));
                }
                json!({"performed": inner})
            }
            Filter::Engaged(engaged) => engaged.to_json(),
            Filter::Condition(condition) => {
                let mut object = Map::new();
                object.insert("field".to_owned(), Value::String(condition.field.as_str().to_owned()));
                object.insert("op".to_owned(), Value::String(condition.op.name().to_owned()));
                if let Some(value) = condition.op.value_json() {
                    object.insert("value".to_owned(), value);
                }
                Value::Object(object)
            }
        }
    }

    pub(crate) fn depth(&self) -> usize {
        match self {
            Filter::All(parts) | Filter::Any(parts) => 1 + parts.iter().map(Filter::depth).max().unwrap_or(0),
            Filter::Not(inner) => 1 + inner.depth(),
            Filter::Condition(_) | Filter::Performed(_) | Filter::Engaged(_) => 1,
        }
    }

    pub(crate) fn conditions(&self) -> usize {
        match self {
            Filter::All(parts) | Filter::Any(parts) => parts.iter().map(Filter::conditions).sum(),
            Filter::Not(inner) => inner.conditions(),
            Filter::Condition(_) | Filter::Performed(_) | Filter::Engaged(_) => 1,
        }
    }
}

impl Serialize for Filter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

/// Deserialising checks like [`from_json`], so a stored filter is always a valid one.
impl<'de> Deserialize<'de> for Filter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        from_json(&value).map_err(serde::de::Error::custom)
    }
}

impl Op {
    /// The name in the JSON form: `eq`, `ne`, `contains`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Op::Eq(_) => "eq",
            Op::Ne(_) => "ne",
            Op::Contains(_) => "contains",
            Op::StartsWith(_) => "starts_with",
            Op::EndsWith(_) => "ends_with",
            Op::Gt(_) => "gt",
            Op::Gte(_) => "gte",
            Op::Lt(_) => "lt",
            Op::Lte(_) => "lte",
            Op::Exists => "exists",
            Op::NotExists => "not_exists",
            Op::In(_) => "in",
        }
    }

    /// The same comparison with the value `text` instead (added to the list for `in`); `exists`
    /// and `not_exists` have no value to replace.
    pub(crate) fn with_value(&self, text: &str, quoted: bool) -> Op {
        let scalar = || if quoted { Scalar::String(text.to_owned()) } else { bare_scalar(text) };
        match self {
            Op::Eq(_) => Op::Eq(scalar()),
            Op::Ne(_) => Op::Ne(scalar()),
            Op::Contains(_) => Op::Contains(scalar()),
            Op::StartsWith(_) => Op::StartsWith(text.to_owned()),
            Op::EndsWith(_) => Op::EndsWith(text.to_owned()),
            Op::Gt(_) => Op::Gt(scalar()),
            Op::Gte(_) => Op::Gte(scalar()),
            Op::Lt(_) => Op::Lt(scalar()),
            Op::Lte(_) => Op::Lte(scalar()),
            Op::Exists | Op::NotExists => self.clone(),
            Op::In(values) => Op::In(values.iter().cloned().chain([scalar()]).collect()),
        }
    }

    fn value_json(&self) -> Option<Value> {
        match self {
            Op::Eq(value)
            | Op::Ne(value)
            | Op::Contains(value)
            | Op::Gt(value)
            | Op::Gte(value)
            | Op::Lt(value)
            | Op::Lte(value) => Some(value.to_json()),
            Op::StartsWith(text) | Op::EndsWith(text) => Some(Value::String(text.clone())),
            Op::Exists | Op::NotExists => None,
            Op::In(values) => Some(Value::Array(values.iter().map(Scalar::to_json).collect())),
        }
    }
}

impl Scalar {
    pub fn to_json(&self) -> Value {
        match self {
            Scalar::String(text) => Value::String(text.clone()),
            Scalar::Number(number) => Value::Number(number.clone()),
            Scalar::Bool(flag) => Value::Bool(*flag),
        }
    }

    /// The text `contains` looks for.
    pub(crate) fn text(&self) -> String {
        match self {
            Scalar::String(text) => text.clone(),
            Scalar::Number(number) => number.to_string(),
            Scalar::Bool(flag) => flag.to_string(),
        }
    }
}

pub(crate) fn bare_scalar(word: &str) -> Scalar {
    if word.eq_ignore_ascii_case("true") {
        Scalar::Bool(true)
    } else if word.eq_ignore_ascii_case("false") {
        Scalar::Bool(false)
    } else if let Some(number) = number_in_text(word) {
        Scalar::Number(number)
    } else {
        Scalar::String(word.to_owned())
    }
}

/// The number `text` holds in JSON syntax, if it holds exactly one.
pub(crate) fn number_in_text(text: &str) -> Option<Number> {
    let looks_numeric = text.starts_with(|character: char| character == '-' || character.is_ascii_digit());
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Number(number)) if looks_numeric => Some(number),
        _ => None,
    }
}

impl FieldPath {
    pub fn parse(path: &str) -> Result<Self, FilterError> {
        if path.is_empty() {
            return Err(FilterError::new("a field path must not be empty"));
        }
        if path.chars().count() > MAX_FIELD_PATH_CHARS {
            return Err(FilterError::new(format!("the field path is longer than {MAX_FIELD_PATH_CHARS} characters")));
        }
        if path.chars().any(char::is_control) {
            return Err(FilterError::new(format!("the field path {path:?} has a control character")));
        }
        for segment in path.split('.') {
            if segment.is_empty() {
                return Err(FilterError::new(format!(
                    "the field path `{path}` has an empty segment; separate names with single dots"
                )));
            }
            if segment.trim() != segment {
                return Err(FilterError::new(format!(
                    "the field path `{path}` has a segment that starts or ends with a space"
                )));
            }
        }
        Ok(Self(path.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('.')
    }
}
