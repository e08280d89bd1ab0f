//! The filter language of segments and custom-filter webhook conditions (decision D5): one
//! expression type, [`Filter`], with a JSON form that is stored, a plain-words form that the
//! deterministic AI provider reads and that users are shown as a filter's description, and the
//! evaluation of a filter against a JSON document. Pure: no IO.
//!
//! # Plain words
//!
//! A filter is one or more conditions joined by `and`, `or` and commas. `and` binds tighter
//! than `or`, so `a or b and c` means `a or (b and c)`. A comma is an `and` that binds looser
//! than both: the text is a list of requirements separated by commas, all of which must hold.
//! So `a or b, c` means `(a or b) and c`, and `a, b or c and d` means `a and (b or (c and d))`:
//!
//! ```text
//! plan is pro or plan is enterprise, subscribed to newsletter
//!   = (plan is pro or plan is enterprise) and subscribed to newsletter
//! ```
//!
//! `, and` reads as a comma (`a, b, and c`). `, or` is refused as ambiguous, the comma already
//! meaning `and`: write `or` without the comma and group with parentheses. A comma with no
//! condition after it (`plan is pro,`) is refused too. Parentheses group, with the same rules
//! inside, and `not` negates what follows it: `not (plan is pro or plan is team)`. Keywords are
//! case-insensitive (`Plan IS pro OR Enterprise, SUBSCRIBED TO newsletter`); fields and values
//! keep their case.
//!
//! A condition is a field, a comparison and, for most comparisons, a value:
//!
//! | Comparison | Op | Example |
//! |---|---|---|
//! | `is`, `equals`, `is equal to`, `=`, `==` | `eq` | `plan is pro` |
//! | `is not`, `is not equal to`, `!=` | `ne` | `plan is not free` |
//! | `contains` | `contains` | `tags contains vip` |
//! | `does not contain` | `not` + `contains` | `name does not contain test` |
//! | `starts with` | `starts_with` | `phone starts with +44` |
//! | `ends with` | `ends_with` | `email ends with @acme.com` |
//! | `is greater than`, `is more than`, `is above`, `is over`, `>` | `gt` | `age is above 30` |
//! | `is at least`, `is greater than or equal to`, `>=` | `gte` | `orders >= 3` |
//! | `is less than`, `is below`, `is under`, `<` | `lt` | `score is below 0.5` |
//! | `is at most`, `is less than or equal to`, `<=` | `lte` | `signed_up_at <= 2024-05-01` |
//! | `is set`, `exists`, `is not missing` | `exists` | `company is set` |
//! | `is not set`, `is missing`, `does not exist` | `not_exists` | `phone is missing` |
//! | `is one of a, b, c` | `in` | `country is one of fr, de, "united kingdom"` |
//! | `is not one of a, b, c` | `not` + `in` | `plan is not one of free, trial` |
//!
//! The `is` before `greater than`, `more than`, `above`, `over`, `less than`, `below`, `under`,
//! `at least` and `at most` may be left out (`age over 30`).
//!
//! ## Lists of values
//!
//! After the value of `is` (`equals`, `=`), `contains`, `starts with` or `ends with`, an `or`
//! followed by a value standing alone (a value followed by the end, a comma, `)`, `and` or
//! `or`) repeats the field and the comparison:
//!
//! ```text
//! plan is pro or enterprise               = plan is pro or plan is enterprise
//! email ends with @acme.com or @acme.org  = email ends with @acme.com or email ends with @acme.org
//! ```
//!
//! Such a list is one condition, so `and`, commas and `not` take it whole: `plan is pro or
//! enterprise and country is fr` means `(plan is pro or plan is enterprise) and country is fr`,
//! and `not plan is pro or team` means `not (plan is pro or plan is team)`. A word that is a
//! contact fact on its own stays that fact: `plan is pro or opened` is `plan is pro or opened
//! an email`; quote it (`or "opened"`) to make it a value.
//!
//! `is one of` (and `is not one of`) separates its values with commas and may end them with
//! `or`: `country is one of fr, de or uk` and `country is one of fr, de, or uk` both list `fr`,
//! `de` and `uk`. A comma in such a list separates values until a condition or a contact fact
//! starts after it, which ends the list: `country is one of fr, de, plan is pro` means `country
//! is one of fr, de and plan is pro`, and `country is one of fr, de, subscribed to newsletter`
//! likewise. A value standing alone after a comma stays in the list, even `opened` or `clicked`
//! (`tags is one of new, opened`); write `and opened` for the contact fact.
//!
//! The other comparisons take one value each. After a negative comparison an `or` list is
//! refused rather than guessed, since `plan is not free or trial` could mean neither value or
//! either: write `plan is not one of free, trial` for neither. `plan is pro and enterprise` is
//! refused too, a field cannot equal two values; the message suggests `plan is pro or
//! enterprise`.
//!
//! A field is a dot-separated path into the document (`address.country`). Write it bare, or
//! quoted when it has spaces or reads as a keyword (`"first name" is Ada`).
//!
//! A value is one of:
//! - a string in double or single quotes, where `\` takes the next character literally
//!   (`name is "Ada Lovelace"`, `name is 'O\'Brien'`);
//! - a number in JSON syntax (`30`, `-2.5`, `1e3`);
//! - `true` or `false`;
//! - a bare token: a run of characters other than spaces and `( ) , = ! < >`, not starting
//!   with a quote, such as `pro`, `@acme.com`, `O'Brien` or `2024-05-01`. It is a string
//!   unless it reads as a number or a boolean; quote it to keep it a string (`code is "42"`).
//!
//! A value with spaces must be quoted. `starts with` and `ends with` take their value as text
//! even when it reads as a number. `null`, `and`, `or` and `not` are not values unless quoted.
//! `gt`, `gte`, `lt` and `lte` need a number, a string holding a number, or a date
//! (`YYYY-MM-DD`, optionally followed by a time).
//!
//! [`describe`] writes the canonical plain words of a filter: the first form of each row above
//! (`is`, `is not`, `contains`, `starts with`, `ends with`, `is greater than`, `is at least`,
//! `is less than`, `is at most`, `is set`, `is not set`, `is one of`), parentheses around every
//! nested group, `not (...)` for a negation, and quotes only where a bare token would read
//! differently; no commas between conditions and no lists after `or`. [`parse_plain`] reads it
//! back to an equal filter.
//!
//! Text that is not in the language is refused with a [`FilterError`] that says what was
//! expected, what was found and where, as a 1-based character position (for `plan is pro and
//! enterprise`: expected a condition after `and`, found the lone value `enterprise` at
//! character 17, then what to write instead).
//!
//! ## Contact facts (segments)
//!
//! Beside conditions on fields, a segment's filter may use phrases about the contact:
//!
//! | Phrase | Means |
//! |---|---|
//! | `performed <event>` (or `has performed`) | at least one occurrence of the event, ever |
//! | `performed <event> at least N times` | N or more occurrences |
//! | `performed <event> in the last N <unit>` (or `within [the last] N <unit>`) | inside the window ending now; units `seconds`, `minutes`, `hours`, `days`, `weeks` (singular too) |
//! | `did not perform <event> ...`, `has not performed <event> ...` | `not (performed ...)` |
//! | `subscribed to <topic>` | `subscriptions.<topic> is subscribed` |
//! | `has email consent`, `has no email consent` | `consent.email is true`, and its negation |
//!
//! `<event>` is the event schema's slug (quote it when it has spaces); the service resolves it,
//! and a topic's slug, to ids when the filter is made. Only segments evaluate these: a document
//! alone has no events ([`matches`] never satisfies `performed`), and the service refuses them
//! in a webhook's custom filter.
//!
//! ## Engagement (segments)
//!
//! | Phrase | Means |
//! |---|---|
//! | `opened [an email]` (or `has opened`) | a person opened an email sent to the contact |
//! | `clicked [a link]` (or `has clicked`) | a person followed a tracked link of such an email |
//! | `clicked a link containing <text>` | ... whose target contains the text (any case) |
//! | `... [in] an email from broadcast <b>` | ... of an email the broadcast sent |
//! | `... from template <t>` | ... of an email made from the template |
//! | `... from workflow <w>`, `... from step <s> of workflow <w>` | ... that the workflow (its send step) sent |
//! | `... in the last N <unit>` (or `within [the last] N <unit>`) | inside the window ending now |
//! | `... including machines` | opens and clicks flagged as a machine's count too |
//! | `did not open ...`, `has not opened ...`, `did not click ...`, `has not clicked ...` | `not (opened ...)`, `not (clicked ...)` |
//!
//! So `has not opened in the last 90 days` is the sunset rule, and `clicked a link containing
//! pricing in an email from broadcast spring-sale` finds who looked at prices. By default only
//! a person's opens and clicks count: a privacy proxy's prefetch and a link scanner's fetch
//! are recorded but flagged as a machine's (see ARCHITECTURE.md, "Engagement"). Names are
//! slugs or ids; the service resolves them to ids when the filter is made.
//!
//! # JSON form
//!
//! - `{"all": [<filter>, ...]}`: every filter holds;
//! - `{"any": [<filter>, ...]}`: at least one holds;
//! - `{"not": <filter>}`: the filter does not hold;
//! - `{"performed": {"event": "<slug or id>", "atLeast": <1..>, "withinSeconds": <seconds>}}`:
//!   `atLeast` defaults to 1 and `withinSeconds` to all time;
//! - `{"opened": {"from": <source>, "withinSeconds": <seconds>, "includeMachines": <bool>}}` and
//!   `{"clicked": {..., "linkContains": "<text>"}}`, where every key is optional and a source is
//!   `{"broadcast": <id>}`, `{"template": <id>}`, `{"workflow": <id>}` or `{"workflow": <id>,
//!   "step": <id>}` (absent: any email);
//! - `{"field": "address.country", "op": "<op>", "value": <value>}`: a condition. `eq`, `ne`
//!   and `contains` take a string, number or boolean; `starts_with` and `ends_with` a string;
//!   `gt`, `gte`, `lt` and `lte` a number, numeric string or date string; `in` a non-empty
//!   array of strings, numbers and booleans; `exists` and `not_exists` no value (or `null`).
//!
//! Unknown keys, empty `all`/`any` lists and other `null` values are rejected. [`from_json`]
//! normalises: an `all` inside an `all` (or `any` inside `any`) is merged into it, and an
//! `all`/`any` of a single filter is that filter.
//!
//! # Limits
//!
//! At most [`MAX_DEPTH`] levels of nesting (a lone condition is one level, each `all`, `any`
//! and `not` adds one), [`MAX_CONDITIONS`] conditions, [`MAX_LIST_VALUES`] values in an `in`,
//! [`MAX_FIELD_PATH_CHARS`] characters in a field path and [`MAX_VALUE_CHARS`] in a string
//! value. A field path has no empty segment, no segment starting or ending with a space and no
//! control character.
//!
//! # Evaluation
//!
//! [`matches`] tests a filter against a JSON document (a record's or event's data):
//! - A field path walks nested objects. A field is missing when a step is absent or not an
//!   object, or when its value is `null`.
//! - A missing field satisfies `not_exists` and `ne` (so `plan is not pro` includes contacts
//!   without a plan) and nothing else. `not` negates the whole condition, so
//!   `not (age > 30)` also matches a missing age.
//! - Against an array, a comparison holds when it holds for some element (`tags is vip`), and
//!   `ne` when no element equals the value; `contains` holds when some element equals the
//!   value. Nested arrays and objects never match a value.
//! - Strings compare case-insensitively (by their Unicode lowercase form) in `eq`, `ne`,
//!   `contains`, `starts_with`, `ends_with` and `in`. `contains`, `starts_with` and
//!   `ends_with` apply to strings only; `contains` looks for the text of a number or boolean
//!   value.
//! - Numbers compare numerically, and a string holding a JSON number (spaces around it
//!   ignored) compares with a number as that number: `"30"` equals `30`. Two strings are
//!   equal only as text.
//! - `true` and `false` equal the booleans and the strings `"true"` and `"false"` in any case.
//! - `gt`, `gte`, `lt` and `lte` compare numbers (or numeric strings) numerically. Two strings
//!   that both start with a date `YYYY-MM-DD` compare as text, which orders ISO 8601 dates and
//!   date-times correctly when they share one format and time zone (store UTC, `Z`); a date
//!   alone comes before every time of that day. Anything else never satisfies an ordering.

use std::cmp::Ordering;
use std::fmt;

mod engaged;

pub use engaged::{Action, Engaged, Engagement, Source};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value, json};

/// The deepest a filter may nest; a lone condition is one level.
pub const MAX_DEPTH: usize = 8;
/// The most conditions one filter may hold.
pub const MAX_CONDITIONS: usize = 50;
/// The most values one `in` may list.
pub(crate) const MAX_LIST_VALUES: usize = 100;
/// The longest field path, in characters.
pub(crate) const MAX_FIELD_PATH_CHARS: usize = 200;
/// The longest string value, in characters.
pub(crate) const MAX_VALUE_CHARS: usize = 1_000;
/// The most occurrences `performed ... at least N times` may ask for.
pub(crate) const MAX_AT_LEAST: u32 = 1_000_000;
/// The longest window of `performed ... in the last`, in seconds (ten years).
pub(crate) const MAX_WINDOW_SECONDS: u64 = 10 * 365 * 86_400;

/// A filter over JSON documents. Those that [`parse_plain`] and [`from_json`] return are
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
pub struct FieldPath(String);

/// Why a text or a JSON expression is not a filter; the message says what was expected and
/// where (a character position in plain words, a path such as `filter.all[1].op` in JSON).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FilterError {
    message: String,
}

/// Reads the plain-words language (see the module documentation).
pub fn parse_plain(text: &str) -> Result<Filter, FilterError> {
    let tokens = tokenize(text)?;
    if tokens.is_empty() {
        return Err(FilterError::new("the requirements are empty; expected a condition such as `plan is pro`"));
    }
    let mut parser = Parser { tokens, next: 0, nesting: 0, end_position: text.chars().count() + 1 };
    let filter = parser.expression()?;
    if let Some(token) = parser.peek() {
        return Err(match &token.kind {
            TokenKind::Close => {
                FilterError::new(format!("found `)` at character {} without a matching `(`", token.position))
            }
            TokenKind::Word(_) => FilterError::new(format!(
                "{}; quote a value that has spaces",
                parser.expected("`and`, `or` or the end of the text")
            )),
            _ => parser.expected("`and`, `or` or the end of the text"),
        });
    }
    check_limits(&filter)?;
    Ok(filter)
}

/// Reads and checks the JSON form (see the module documentation).
pub fn from_json(value: &Value) -> Result<Filter, FilterError> {
    let mut conditions = 0;
    read_expression(value, "filter", 1, &mut conditions)
}

/// The canonical plain words of `filter`, which [`parse_plain`] reads back to an equal filter.
pub fn describe(filter: &Filter) -> String {
    match filter {
        Filter::All(parts) => parts.iter().map(describe_part).collect::<Vec<_>>().join(" and "),
        Filter::Any(parts) => parts.iter().map(describe_part).collect::<Vec<_>>().join(" or "),
        Filter::Not(inner) => match inner.as_ref() {
            // `has not opened ...` reads back as this negation.
            Filter::Engaged(engaged) => format!("has not {}", engaged.describe()),
            inner => format!("not ({})", describe(inner)),
        },
        Filter::Condition(condition) => describe_condition(condition),
        Filter::Performed(performed) => describe_performed(performed),
        Filter::Engaged(engaged) => engaged.describe(),
    }
}

/// Whether `document` satisfies `filter` (see the module documentation for the rules).
/// A document has no events, so `performed` never holds here; see [`matches_facts`].
pub fn matches(filter: &Filter, document: &Value) -> bool {
    let events = std::collections::HashMap::new();
    matches_facts(filter, &Facts { document, events: &events, engagement: &[], now_ms: 0 })
}

/// Whether `facts` satisfy `filter`: conditions against the document, `performed` against
/// the events in its window ending at `facts.now_ms` (an occurrence at `t` is inside a window
/// of `w` seconds while `now - w*1000 < t <= now`).
pub fn matches_facts(filter: &Filter, facts: &Facts<'_>) -> bool {
    match filter {
        Filter::All(parts) => parts.iter().all(|part| matches_facts(part, facts)),
        Filter::Any(parts) => parts.iter().any(|part| matches_facts(part, facts)),
        Filter::Not(inner) => !matches_facts(inner, facts),
        Filter::Condition(condition) => condition_matches(condition, facts.document),
        Filter::Performed(performed) => {
            let times = facts.events.get(&performed.event).map_or(&[][..], Vec::as_slice);
            let counted = times.iter().filter(|&&time| performed.counts(time, facts.now_ms)).count();
            counted >= usize::try_from(performed.at_least).unwrap_or(usize::MAX)
        }
        Filter::Engaged(engaged) => engaged.holds(facts.engagement, facts.now_ms),
    }
}

/// The earliest time after `facts.now_ms` at which the answer of [`matches_facts`] can change
/// with no new fact: when an occurrence enters a window (one dated in the future) or leaves
/// it. `None` when only new facts can change it.
pub fn next_change_ms(filter: &Filter, facts: &Facts<'_>) -> Option<i64> {
    let engaged =
        engaged_parts(filter).into_iter().filter_map(|engaged| engaged.changes(facts.engagement, facts.now_ms));
    performed_parts(filter)
        .into_iter()
        .flat_map(|performed| {
            let times = facts.events.get(&performed.event).map_or(&[][..], Vec::as_slice);
            times.iter().flat_map(move |&time| {
                let leaves = performed.window_ms().map(|window| time.saturating_add(window));
                [Some(time), leaves].into_iter().flatten()
            })
        })
        .filter(|&time| time > facts.now_ms)
        .chain(engaged)
        .min()
}

/// Every `performed` of `filter`.
pub fn performed_parts(filter: &Filter) -> Vec<&Performed> {
    match filter {
        Filter::All(parts) | Filter::Any(parts) => parts.iter().flat_map(performed_parts).collect(),
        Filter::Not(inner) => performed_parts(inner),
        Filter::Condition(_) | Filter::Engaged(_) => Vec::new(),
        Filter::Performed(performed) => vec![performed],
    }
}

/// Every `opened` and `clicked` of `filter`.
pub fn engaged_parts(filter: &Filter) -> Vec<&Engaged> {
    match filter {
        Filter::All(parts) | Filter::Any(parts) => parts.iter().flat_map(engaged_parts).collect(),
        Filter::Not(inner) => engaged_parts(inner),
        Filter::Condition(_) | Filter::Performed(_) => Vec::new(),
        Filter::Engaged(engaged) => vec![engaged],
    }
}

/// `filter` with each condition and `performed` replaced by what `replace` makes of it (the
/// groups kept, then normalised), or the first error `replace` gives.
pub fn rewrite<E>(filter: Filter, replace: &mut impl FnMut(Filter) -> Result<Filter, E>) -> Result<Filter, E> {
    Ok(match filter {
        Filter::All(parts) => {
            all_of(parts.into_iter().map(|part| rewrite(part, replace)).collect::<Result<Vec<_>, _>>()?)
        }
        Filter::Any(parts) => {
            any_of(parts.into_iter().map(|part| rewrite(part, replace)).collect::<Result<Vec<_>, _>>()?)
        }
        Filter::Not(inner) => Filter::Not(Box::new(rewrite(*inner, replace)?)),
        leaf => replace(leaf)?,
    })
}

impl Performed {
    fn window_ms(&self) -> Option<i64> {
        self.within_seconds.map(|seconds| i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
    }

    /// Whether an occurrence at `time` counts at `now`.
    fn counts(&self, time: i64, now: i64) -> bool {
        time <= now && self.window_ms().is_none_or(|window| time > now.saturating_sub(window))
    }
}

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

    fn depth(&self) -> usize {
        match self {
            Filter::All(parts) | Filter::Any(parts) => 1 + parts.iter().map(Filter::depth).max().unwrap_or(0),
            Filter::Not(inner) => 1 + inner.depth(),
            Filter::Condition(_) | Filter::Performed(_) | Filter::Engaged(_) => 1,
        }
    }

    fn conditions(&self) -> usize {
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
    fn with_value(&self, text: &str, quoted: bool) -> Op {
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
    fn text(&self) -> String {
        match self {
            Scalar::String(text) => text.clone(),
            Scalar::Number(number) => number.to_string(),
            Scalar::Bool(flag) => flag.to_string(),
        }
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

impl FilterError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// The words that [`describe`] quotes when a field or string value is one of them, since the
/// parser could read them as part of a comparison.
const RESERVED_WORDS: &[&str] = &[
    "above",
    "and",
    "at",
    "below",
    "contain",
    "contains",
    "did",
    "does",
    "ends",
    "equal",
    "equals",
    "exist",
    "exists",
    "false",
    "greater",
    "has",
    "in",
    "is",
    "least",
    "less",
    "missing",
    "more",
    "most",
    "not",
    "null",
    "of",
    "one",
    "or",
    "over",
    "performed",
    "set",
    "starts",
    "subscribed",
    "than",
    "time",
    "times",
    "to",
    "true",
    "under",
    "with",
    "within",
];

/// `parts` joined by `and`, normalised (nested `all`s merged, a single part alone).
pub fn all_of(parts: Vec<Filter>) -> Filter {
    let mut flat = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Filter::All(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    match <[Filter; 1]>::try_from(flat) {
        Ok([only]) => only,
        Err(flat) => Filter::All(flat),
    }
}

/// `parts` joined by `or`, normalised (nested `any`s merged, a single part alone).
pub fn any_of(parts: Vec<Filter>) -> Filter {
    let mut flat = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Filter::Any(inner) => flat.extend(inner),
            other => flat.push(other),
        }
    }
    match <[Filter; 1]>::try_from(flat) {
        Ok([only]) => only,
        Err(flat) => Filter::Any(flat),
    }
}

fn check_limits(filter: &Filter) -> Result<(), FilterError> {
    let depth = filter.depth();
    if depth > MAX_DEPTH {
        return Err(FilterError::new(format!("the filter nests {depth} levels deep, deeper than {MAX_DEPTH} levels")));
    }
    let conditions = filter.conditions();
    if conditions > MAX_CONDITIONS {
        return Err(FilterError::new(format!(
            "the filter has {conditions} conditions; at most {MAX_CONDITIONS} are allowed"
        )));
    }
    Ok(())
}

/// Checks what the types leave open: string lengths, the values an ordering can compare and
/// the size of an `in` list.
fn checked_op(op: Op) -> Result<Op, String> {
    match &op {
        Op::Eq(value) | Op::Ne(value) | Op::Contains(value) => check_scalar(value)?,
        Op::StartsWith(text) | Op::EndsWith(text) => check_text(text)?,
        Op::Gt(value) | Op::Gte(value) | Op::Lt(value) | Op::Lte(value) => {
            check_scalar(value)?;
            let orderable = match value {
                Scalar::Number(_) => true,
                Scalar::String(text) => number_in_text(text.trim()).is_some() || looks_like_date(text),
                Scalar::Bool(_) => false,
            };
            if !orderable {
                return Err(format!(
                    "a greater-than or less-than comparison needs a number or a date such as 2024-05-01, found `{}`",
                    describe_scalar(value)
                ));
            }
        }
        Op::Exists | Op::NotExists => {}
        Op::In(values) => {
            if values.is_empty() {
                return Err("`in` needs at least one value".to_owned());
            }
            if values.len() > MAX_LIST_VALUES {
                return Err(format!("`in` lists {} values; at most {MAX_LIST_VALUES} are allowed", values.len()));
            }
            for value in values {
                check_scalar(value)?;
            }
        }
    }
    Ok(op)
}

fn check_scalar(value: &Scalar) -> Result<(), String> {
    match value {
        Scalar::String(text) => check_text(text),
        Scalar::Number(_) | Scalar::Bool(_) => Ok(()),
    }
}

fn check_text(text: &str) -> Result<(), String> {
    if text.chars().count() > MAX_VALUE_CHARS {
        return Err(format!("a value is longer than {MAX_VALUE_CHARS} characters"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The JSON form.

fn read_expression(value: &Value, at: &str, depth: usize, conditions: &mut usize) -> Result<Filter, FilterError> {
    if depth > MAX_DEPTH {
        return Err(FilterError::new(format!("`{at}`: the filter nests deeper than {MAX_DEPTH} levels")));
    }
    let Value::Object(object) = value else {
        return Err(FilterError::new(format!(
            "`{at}`: expected an object such as {{\"field\": \"plan\", \"op\": \"eq\", \"value\": \"pro\"}}, \
             {{\"all\": [...]}}, {{\"any\": [...]}} or {{\"not\": ...}}, found {}",
            json_kind(value)
        )));
    };
    if object.contains_key("field") || object.contains_key("op") {
        return read_condition(object, at, conditions).map(Filter::Condition);
    }
    let mut entries = object.iter();
    let (Some((key, inner)), None) = (entries.next(), entries.next()) else {
        return Err(FilterError::new(format!(
            "`{at}`: expected exactly one of the keys all, any and not, or a condition with field and op"
        )));
    };
    match key.as_str() {
        "all" | "any" => {
            let Value::Array(items) = inner else {
                return Err(FilterError::new(format!(
                    "`{at}.{key}`: expected an array of filters, found {}",
                    json_kind(inner)
                )));
            };
            if items.is_empty() {
                return Err(FilterError::new(format!("`{at}.{key}`: needs at least one filter")));
            }
            let parts = items
                .iter()
                .enumerate()
                .map(|(index, item)| read_expression(item, &format!("{at}.{key}[{index}]"), depth + 1, conditions))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(if key == "all" { all_of(parts) } else { any_of(parts) })
        }
        "not" => Ok(Filter::Not(Box::new(read_expression(inner, &format!("{at}.not"), depth + 1, conditions)?))),
        "performed" => read_performed(inner, &format!("{at}.performed"), conditions).map(Filter::Performed),
        "opened" | "clicked" => {
            *conditions += 1;
            if *conditions > MAX_CONDITIONS {
                return Err(FilterError::new(format!("`{at}`: the filter has more than {MAX_CONDITIONS} conditions")));
            }
            let action = if key == "opened" { Action::Opened } else { Action::Clicked };
            engaged::read(action, inner, &format!("{at}.{key}")).map(Filter::Engaged)
        }
        other => Err(FilterError::new(format!(
            "`{at}`: unknown key `{other}`; expected all, any, not, performed, opened, clicked, or a condition with \
             field and op"
        ))),
    }
}

fn read_performed(value: &Value, at: &str, conditions: &mut usize) -> Result<Performed, FilterError> {
    *conditions += 1;
    if *conditions > MAX_CONDITIONS {
        return Err(FilterError::new(format!("`{at}`: the filter has more than {MAX_CONDITIONS} conditions")));
    }
    let Value::Object(object) = value else {
        return Err(FilterError::new(format!(
            "`{at}`: expected an object such as {{\"event\": \"purchase\", \"atLeast\": 1, \"withinSeconds\": 2592000}}, \
             found {}",
            json_kind(value)
        )));
    };
    if let Some(unknown) = object.keys().find(|key| !matches!(key.as_str(), "event" | "atLeast" | "withinSeconds")) {
        return Err(FilterError::new(format!(
            "`{at}`: unknown key `{unknown}`; expected event, atLeast, withinSeconds"
        )));
    }
    let event = match object.get("event") {
        Some(Value::String(event)) => event.clone(),
        _ => return Err(FilterError::new(format!("`{at}.event`: expected the event schema's slug or id"))),
    };
    let at_least = match object.get("atLeast") {
        None | Some(Value::Null) => 1,
        Some(value) => value.as_u64().and_then(|count| u32::try_from(count).ok()).ok_or_else(|| {
            FilterError::new(format!("`{at}.atLeast`: expected a whole number from 1 to {MAX_AT_LEAST}"))
        })?,
    };
    let within_seconds = match object.get("withinSeconds") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| {
            FilterError::new(format!("`{at}.withinSeconds`: expected a whole number from 1 to {MAX_WINDOW_SECONDS}"))
        })?),
    };
    checked_performed(Performed { event, at_least, within_seconds })
        .map_err(|message| FilterError::new(format!("`{at}`: {message}")))
}

/// Checks a `performed`: an event name that is a valid field-like name, a positive count and a
/// window within bounds.
fn checked_performed(performed: Performed) -> Result<Performed, String> {
    if performed.event.trim().is_empty() || performed.event.chars().any(char::is_control) {
        return Err("`performed` needs the name of an event".to_owned());
    }
    if performed.event.chars().count() > MAX_FIELD_PATH_CHARS {
        return Err(format!("an event name is longer than {MAX_FIELD_PATH_CHARS} characters"));
    }
    if !(1..=MAX_AT_LEAST).contains(&performed.at_least) {
        return Err(format!("`at least` needs a whole number from 1 to {MAX_AT_LEAST} times"));
    }
    if performed.within_seconds.is_some_and(|seconds| !(1..=MAX_WINDOW_SECONDS).contains(&seconds)) {
        return Err(format!("a window is from 1 second to {MAX_WINDOW_SECONDS} seconds (ten years)"));
    }
    Ok(performed)
}

fn read_condition(object: &Map<String, Value>, at: &str, conditions: &mut usize) -> Result<Condition, FilterError> {
    *conditions += 1;
    if *conditions > MAX_CONDITIONS {
        return Err(FilterError::new(format!("`{at}`: the filter has more than {MAX_CONDITIONS} conditions")));
    }
    if let Some(unknown) = object.keys().find(|key| !matches!(key.as_str(), "field" | "op" | "value")) {
        return Err(FilterError::new(format!("`{at}`: unknown key `{unknown}`; a condition has field, op and value")));
    }
    let field = match object.get("field") {
        Some(Value::String(path)) => {
            FieldPath::parse(path).map_err(|error| FilterError::new(format!("`{at}.field`: {error}")))?
        }
        Some(other) => {
            return Err(FilterError::new(format!(
                "`{at}.field`: expected a string path such as \"address.country\", found {}",
                json_kind(other)
            )));
        }
        None => return Err(FilterError::new(format!("`{at}`: a condition needs a field"))),
    };
    let Some(Value::String(op_name)) = object.get("op") else {
        return Err(FilterError::new(format!("`{at}.op`: expected one of {}", OP_NAMES.join(", "))));
    };
    let value = object.get("value");
    let value_at = format!("{at}.value");
    let op = match op_name.as_str() {
        "exists" | "not_exists" => {
            if let Some(value) = value.filter(|value| !value.is_null()) {
                return Err(FilterError::new(format!(
                    "`{value_at}`: `{op_name}` takes no value, found {}",
                    json_kind(value)
                )));
            }
            if op_name == "exists" { Op::Exists } else { Op::NotExists }
        }
        "in" => match value {
            Some(Value::Array(items)) => Op::In(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| scalar_from_json(item, &format!("{value_at}[{index}]")))
                    .collect::<Result<_, _>>()?,
            ),
            other => {
                return Err(FilterError::new(format!(
                    "`{value_at}`: `in` needs an array of values, found {}",
                    other.map_or("nothing", json_kind)
                )));
            }
        },
        "starts_with" | "ends_with" => {
            let Some(Value::String(text)) = value else {
                return Err(FilterError::new(format!(
                    "`{value_at}`: `{op_name}` needs a string, found {}",
                    value.map_or("nothing", json_kind)
                )));
            };
            if op_name == "starts_with" { Op::StartsWith(text.clone()) } else { Op::EndsWith(text.clone()) }
        }
        "eq" | "ne" | "contains" | "gt" | "gte" | "lt" | "lte" => {
            let Some(value) = value else {
                return Err(FilterError::new(format!("`{at}`: `{op_name}` needs a value")));
            };
            let scalar = scalar_from_json(value, &value_at)?;
            match op_name.as_str() {
                "eq" => Op::Eq(scalar),
                "ne" => Op::Ne(scalar),
                "contains" => Op::Contains(scalar),
                "gt" => Op::Gt(scalar),
                "gte" => Op::Gte(scalar),
                "lt" => Op::Lt(scalar),
                _ => Op::Lte(scalar),
            }
        }
        other => {
            return Err(FilterError::new(format!(
                "`{at}.op`: unknown op `{other}`; expected one of {}",
                OP_NAMES.join(", ")
            )));
        }
    };
    let op = checked_op(op).map_err(|message| FilterError::new(format!("`{at}`: {message}")))?;
    Ok(Condition { field, op })
}

const OP_NAMES: &[&str] =
    &["eq", "ne", "contains", "starts_with", "ends_with", "gt", "gte", "lt", "lte", "exists", "not_exists", "in"];

fn scalar_from_json(value: &Value, at: &str) -> Result<Scalar, FilterError> {
    match value {
        Value::String(text) => Ok(Scalar::String(text.clone())),
        Value::Number(number) => Ok(Scalar::Number(number.clone())),
        Value::Bool(flag) => Ok(Scalar::Bool(*flag)),
        other => {
            Err(FilterError::new(format!("`{at}`: expected a string, number or boolean, found {}", json_kind(other))))
        }
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

// ---------------------------------------------------------------------------------------------
// Plain words: tokens.

#[derive(Debug, Clone, PartialEq)]
struct Token {
    kind: TokenKind,
    /// The 1-based character position of its first character.
    position: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum TokenKind {
    Word(String),
    Quoted(String),
    Symbol(Symbol),
    Open,
    Close,
    Comma,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Symbol {
    Eq,
    Ne,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl fmt::Display for TokenKind {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenKind::Word(word) => write!(formatter, "`{word}`"),
            TokenKind::Quoted(text) => write!(formatter, "{}", Value::String(text.clone())),
            TokenKind::Symbol(symbol) => write!(formatter, "`{symbol}`"),
            TokenKind::Open => formatter.write_str("`(`"),
            TokenKind::Close => formatter.write_str("`)`"),
            TokenKind::Comma => formatter.write_str("`,`"),
        }
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Symbol::Eq => "=",
            Symbol::Ne => "!=",
            Symbol::Gt => ">",
            Symbol::Gte => ">=",
            Symbol::Lt => "<",
            Symbol::Lte => "<=",
        })
    }
}

fn is_word_char(character: char) -> bool {
    !character.is_whitespace() && !matches!(character, '(' | ')' | ',' | '=' | '!' | '<' | '>')
}

fn tokenize(text: &str) -> Result<Vec<Token>, FilterError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut index = 0;
    while let Some(&character) = chars.get(index) {
        let position = index + 1;
        let next_is_equals = chars.get(index + 1) == Some(&'=');
        let kind = match character {
            _ if character.is_whitespace() => {
                index += 1;
                continue;
            }
            '(' | ')' | ',' => {
                index += 1;
                match character {
                    '(' => TokenKind::Open,
                    ')' => TokenKind::Close,
                    _ => TokenKind::Comma,
                }
            }
            '"' | '\'' => {
                let (content, after) = read_quoted(&chars, index)?;
                index = after;
                TokenKind::Quoted(content)
            }
            '=' => {
                index += if next_is_equals { 2 } else { 1 };
                TokenKind::Symbol(Symbol::Eq)
            }
            '!' if next_is_equals => {
                index += 2;
                TokenKind::Symbol(Symbol::Ne)
            }
            '!' => {
                return Err(FilterError::new(format!(
                    "expected `!=` at character {position}, found a lone `!`; quote a value that contains it"
                )));
            }
            '>' | '<' => {
                index += if next_is_equals { 2 } else { 1 };
                TokenKind::Symbol(match (character, next_is_equals) {
                    ('>', false) => Symbol::Gt,
                    ('>', true) => Symbol::Gte,
                    (_, false) => Symbol::Lt,
                    (_, true) => Symbol::Lte,
                })
            }
            _ => {
                let start = index;
                while chars.get(index).is_some_and(|&character| is_word_char(character)) {
                    index += 1;
                }
                TokenKind::Word(chars[start..index].iter().collect())
            }
        };
        tokens.push(Token { kind, position });
    }
    Ok(tokens)
}

/// The content of the quoted string opening at `open` and the index just past it.
fn read_quoted(chars: &[char], open: usize) -> Result<(String, usize), FilterError> {
    let quote = chars.get(open).copied();
    let unclosed = || FilterError::new(format!("the quote opened at character {} is never closed", open + 1));
    let mut content = String::new();
    let mut index = open + 1;
    loop {
        match chars.get(index).copied() {
            None => return Err(unclosed()),
            Some('\\') => {
                content.push(*chars.get(index + 1).ok_or_else(unclosed)?);
                index += 2;
            }
            Some(character) if Some(character) == quote => return Ok((content, index + 1)),
            Some(character) => {
                content.push(character);
                index += 1;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Plain words: grammar.
//
//     expression     := or_expression ("," ["and"] or_expression)*
//     or_expression  := and_expression ("or" and_expression)*
//     and_expression := unary ("and" unary)*
//     unary          := "not" unary | "(" expression ")" | contact_fact | condition
//     condition      := field comparison ("or" lone_value)*
//
// The comma is an `and` of the lowest precedence, as people write a list of requirements
// (`plan is pro or plan is team, subscribed to news`). A comma inside `is one of` separates
// values unless a condition starts after it, and a lone value (a value followed by the end,
// `,`, `)`, `and` or `or`) after `or` repeats the condition's field and comparison unless it
// starts a contact fact (`opened`): what parsed before these forms existed parses the same.

struct Parser {
    tokens: Vec<Token>,
    next: usize,
    /// How many `(` and `not` enclose the current position, bounded so that recursion is.
    nesting: usize,
    end_position: usize,
}

/// A value standing alone where a condition could start (`enterprise` in `plan is pro or
/// enterprise`).
struct LoneValue {
    text: String,
    quoted: bool,
    /// The 1-based character position of the value.
    position: usize,
    /// The value as an error message shows it.
    shown: String,
}

impl Parser {
    /// Requirements separated by commas, all of which hold: `a or b, c` is `(a or b) and c`.
    /// `, and` reads as `,`; `, or` is refused, since the comma already means `and`.
    fn expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.or_expression()?];
        while let Some(Token { kind: TokenKind::Comma, position }) = self.peek().cloned() {
            self.next += 1;
            let and = self.eat_keyword("and");
            let after_comma = format!("a condition such as `plan is pro` after the `,` at character {position}");
            if !and && self.keyword_at(0, "or") {
                return Err(FilterError::new(format!(
                    "{}; a comma means `and`, so `, or` is ambiguous: write `or` without the comma and group \
                     with parentheses, as in `(plan is pro or plan is team), subscribed to news`",
                    self.expected(&after_comma)
                )));
            }
            if self.peek().is_none_or(|token| token.kind == TokenKind::Close) {
                return Err(self.expected(&after_comma));
            }
            parts.push(self.or_expression()?);
        }
        Ok(all_of(parts))
    }

    fn or_expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.and_expression()?];
        while self.eat_keyword("or") {
            parts.push(self.and_expression()?);
        }
        Ok(any_of(parts))
    }

    fn and_expression(&mut self) -> Result<Filter, FilterError> {
        let mut parts = vec![self.unary()?];
        while self.eat_keyword("and") {
            parts.push(self.unary()?);
        }
        Ok(all_of(parts))
    }

    fn unary(&mut self) -> Result<Filter, FilterError> {
        if self.eat_keyword("not") {
            self.enter()?;
            let inner = self.unary()?;
            self.nesting -= 1;
            return Ok(Filter::Not(Box::new(inner)));
        }
        if let Some(Token { kind: TokenKind::Open, position }) = self.peek().cloned() {
            self.next += 1;
            self.enter()?;
            let inner = self.expression()?;
            if self.peek().is_some_and(|token| token.kind == TokenKind::Close) {
                self.next += 1;
            } else {
                return Err(self.expected(&format!("`)` to close the `(` at character {position}")));
            }
            self.nesting -= 1;
            return Ok(inner);
        }
        if let Some(filter) = self.contact_fact()? {
            return Ok(filter);
        }
        self.condition()
    }

    /// The phrases about a contact beside its fields: `performed <event> ...`, `has performed`,
    /// `has not performed`, `did not perform`, `subscribed to <topic>` and `has email consent`
    /// (`has no email consent`). A field of one of those names followed by a comparison is
    /// still a condition (`performed is true`).
    fn contact_fact(&mut self) -> Result<Option<Filter>, FilterError> {
        if let Some(fact) = self.engaged_fact()? {
            return Ok(Some(fact));
        }
        let value_follows = |parser: &Self, offset: usize| {
            matches!(parser.tokens.get(parser.next + offset), Some(Token { kind: TokenKind::Quoted(_), .. }))
                || matches!(parser.tokens.get(parser.next + offset),
                    Some(Token { kind: TokenKind::Word(word), .. }) if !is_comparison_word(word))
        };
        if self.keyword_at(0, "performed") && value_follows(self, 1) {
            self.next += 1;
            return self.performed().map(Some);
        }
        if self.keyword_at(0, "has") && self.keyword_at(1, "performed") {
            self.next += 2;
            return self.performed().map(Some);
        }
        let negated_performed =
            (self.keyword_at(0, "has") && self.keyword_at(1, "not") && self.keyword_at(2, "performed"))
                || (self.keyword_at(0, "did") && self.keyword_at(1, "not") && self.keyword_at(2, "perform"));
        if negated_performed {
            self.next += 3;
            return Ok(Some(Filter::Not(Box::new(self.performed()?))));
        }
        if self.keyword_at(0, "subscribed") && self.keyword_at(1, "to") {
            self.next += 2;
            let (topic, position) = match self.peek() {
                Some(Token { kind: TokenKind::Word(word) | TokenKind::Quoted(word), position }) => {
                    (word.clone(), *position)
                }
                None | Some(_) => return Err(self.expected("a topic after `subscribed to`")),
            };
            self.next += 1;
            let field = FieldPath::parse(&format!("{SUBSCRIPTIONS}.{topic}"))
                .map_err(|error| FilterError::new(format!("{error} (the topic at character {position})")))?;
            return Ok(Some(Filter::Condition(Condition { field, op: Op::Eq(Scalar::String(SUBSCRIBED.to_owned())) })));
        }
        let consent = |negated: bool| {
            let condition = Filter::Condition(Condition {
                field: FieldPath(CONSENT_EMAIL.to_owned()),
                op: Op::Eq(Scalar::Bool(true)),
            });
            if negated { Filter::Not(Box::new(condition)) } else { condition }
        };
        if self.keyword_at(0, "has") && self.keyword_at(1, "email") && self.keyword_at(2, "consent") {
            self.next += 3;
            return Ok(Some(consent(false)));
        }
        if self.keyword_at(0, "has")
            && self.keyword_at(1, "no")
            && self.keyword_at(2, "email")
            && self.keyword_at(3, "consent")
        {
            self.next += 4;
            return Ok(Some(consent(true)));
        }
        Ok(None)
    }

    /// After `performed`: `<event> [at least N time(s)] [in the last | within [the last] N <unit>]`.
    fn performed(&mut self) -> Result<Filter, FilterError> {
        let (event, position) = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), position }) if !is_connective(word) => (word.clone(), *position),
            Some(Token { kind: TokenKind::Quoted(text), position }) => (text.clone(), *position),
            _ => return Err(self.expected("the name of an event after `performed`")),
        };
        self.next += 1;
        let mut at_least = 1;
        if self.keyword_at(0, "at") && self.keyword_at(1, "least") {
            self.next += 2;
            at_least = self.whole_number("`at least`")?;
            if !(self.eat_keyword("times") || self.eat_keyword("time")) {
                return Err(self.expected("`times` after the count"));
            }
        }
        let within_seconds = self.window()?;
        let performed = checked_performed(Performed { event, at_least, within_seconds })
            .map_err(|message| FilterError::new(format!("{message} (in `performed` at character {position})")))?;
        Ok(Filter::Performed(performed))
    }

    /// `in the last N <unit>` or `within [the last] N <unit>`, when it comes next: its seconds.
    fn window(&mut self) -> Result<Option<u64>, FilterError> {
        let window_opens = if self.keyword_at(0, "in") && self.keyword_at(1, "the") && self.keyword_at(2, "last") {
            self.next += 3;
            true
        } else if self.eat_keyword("within") {
            if self.keyword_at(0, "the") && self.keyword_at(1, "last") {
                self.next += 2;
            }
            true
        } else {
            false
        };
        if window_opens {
            let count = u64::from(self.whole_number("`in the last`")?);
            let unit = match self.peek() {
                Some(Token { kind: TokenKind::Word(word), .. }) => unit_seconds(word),
                _ => None,
            };
            let Some(unit) = unit else {
                return Err(self.expected("a unit: seconds, minutes, hours, days or weeks"));
            };
            self.next += 1;
            return Ok(Some(count.saturating_mul(unit)));
        }
        Ok(None)
    }

    /// A whole number from 1 up.
    fn whole_number(&mut self, after: &str) -> Result<u32, FilterError> {
        let number = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), .. }) => word.parse::<u32>().ok().filter(|&number| number > 0),
            _ => None,
        };
        let Some(number) = number else {
            return Err(self.expected(&format!("a whole number from 1 after {after}")));
        };
        self.next += 1;
        Ok(number)
    }

    fn enter(&mut self) -> Result<(), FilterError> {
        self.nesting += 1;
        if self.nesting > MAX_DEPTH {
            let position = self.peek().map_or(self.end_position, |token| token.position);
            return Err(FilterError::new(format!(
                "the filter nests deeper than {MAX_DEPTH} levels at character {position}"
            )));
        }
        Ok(())
    }

    fn condition(&mut self) -> Result<Filter, FilterError> {
        let field_token = match self.peek() {
            Some(Token { kind: TokenKind::Word(word), position }) if !is_connective(word) => (word.clone(), *position),
            Some(Token { kind: TokenKind::Quoted(text), position }) => (text.clone(), *position),
            _ => return Err(self.expected("a condition such as `plan is pro`")),
        };
        let (name, position) = field_token;
        self.next += 1;
        let field =
            FieldPath::parse(&name).map_err(|error| FilterError::new(format!("{error} (at character {position})")))?;
        let (op, negated) = self.comparison(&name)?;
        let in_condition = |message: String| {
            FilterError::new(format!("{message} (in the condition on `{name}` at character {position})"))
        };
        let first = Condition { field, op: checked_op(op).map_err(in_condition)? };
        let takes_value = !matches!(first.op, Op::Exists | Op::NotExists);
        // `plan is pro or enterprise`: each lone value after `or` repeats the field and comparison.
        let mut values_written: Vec<String> = value_words(&first.op).into_iter().collect();
        let mut alternatives = Vec::new();
        while takes_value
            && self.keyword_at(0, "or")
            && let Some(value) = self.lone_value(1)
        {
            if negated || !matches!(first.op, Op::Eq(_) | Op::Contains(_) | Op::StartsWith(_) | Op::EndsWith(_)) {
                return Err(or_list_refusal(&first, negated, &value));
            }
            self.next += 1;
            let (text, quoted) = self.value_token("`or`")?;
            let op = checked_op(first.op.with_value(&text, quoted)).map_err(in_condition)?;
            values_written.push(value.written());
            alternatives.push(Filter::Condition(Condition { field: first.field.clone(), op }));
        }
        // `plan is pro and enterprise`: a lone value where a condition must come.
        let joiner = match self.peek() {
            Some(Token { kind: TokenKind::Comma, .. }) if self.keyword_at(1, "and") => Some(("`, and`", 2)),
            Some(Token { kind: TokenKind::Comma, .. }) => Some(("`,`", 1)),
            _ if self.keyword_at(0, "and") => Some(("`and`", 1)),
            _ => None,
        };
        if takes_value
            && let Some((joiner, skip)) = joiner
            && let Some(value) = self.lone_value(skip)
        {
            return Err(lone_value_refusal(joiner, &first, negated, &values_written, &value));
        }
        let condition = Filter::Condition(first);
        let condition = if negated { Filter::Not(Box::new(condition)) } else { condition };
        Ok(if alternatives.is_empty() {
            condition
        } else {
            any_of(std::iter::once(condition).chain(alternatives).collect())
        })
    }

    /// The comparison after a field, and whether the condition is negated (`does not
    /// contain`, `is not one of`, `is not greater than`).
    fn comparison(&mut self, field: &str) -> Result<(Op, bool), FilterError> {
        if let Some(Token { kind: TokenKind::Symbol(symbol), .. }) = self.peek().cloned() {
            self.next += 1;
            let value = self.scalar(&format!("`{symbol}`"))?;
            let op = match symbol {
                Symbol::Eq => Op::Eq(value),
                Symbol::Ne => Op::Ne(value),
                Symbol::Gt => Op::Gt(value),
                Symbol::Gte => Op::Gte(value),
                Symbol::Lt => Op::Lt(value),
                Symbol::Lte => Op::Lte(value),
            };
            return Ok((op, false));
        }
        if self.eat_keyword("is") {
            if self.eat_keyword("not") {
                if self.eat_keyword("set") {
                    return Ok((Op::NotExists, false));
                }
                if self.eat_keyword("missing") {
                    return Ok((Op::Exists, false));
                }
                if self.eat_keyword("one") {
                    self.expect_keyword("of", "one")?;
                    return Ok((Op::In(self.list()?), true));
                }
                return Ok(match self.ordering_or_equality()? {
                    Some(Op::Eq(value)) => (Op::Ne(value), false),
                    Some(op) => (op, true),
                    None => (Op::Ne(self.scalar("`is not`")?), false),
                });
            }
            if self.eat_keyword("set") {
                return Ok((Op::Exists, false));
            }
            if self.eat_keyword("missing") {
                return Ok((Op::NotExists, false));
            }
            if self.eat_keyword("one") {
                self.expect_keyword("of", "one")?;
                return Ok((Op::In(self.list()?), false));
            }
            return Ok(match self.ordering_or_equality()? {
                Some(op) => (op, false),
                None => (Op::Eq(self.scalar("`is`")?), false),
            });
        }
        if let Some(op) = self.ordering_or_equality()? {
            return Ok((op, false));
        }
        if self.eat_keyword("equals") {
            return Ok((Op::Eq(self.scalar("`equals`")?), false));
        }
        if self.eat_keyword("contains") {
            return Ok((Op::Contains(self.scalar("`contains`")?), false));
        }
        if self.eat_keyword("starts") {
            self.expect_keyword("with", "starts")?;
            return Ok((Op::StartsWith(self.text("`starts with`")?), false));
        }
        if self.eat_keyword("ends") {
            self.expect_keyword("with", "ends")?;
            return Ok((Op::EndsWith(self.text("`ends with`")?), false));
        }
        if self.eat_keyword("exists") {
            return Ok((Op::Exists, false));
        }
        if self.eat_keyword("does") {
            self.expect_keyword("not", "does")?;
            if self.eat_keyword("contain") {
                return Ok((Op::Contains(self.scalar("`does not contain`")?), true));
            }
            if self.eat_keyword("exist") {
                return Ok((Op::NotExists, false));
            }
            return Err(self.expected("`contain` or `exist` after `does not`"));
        }
        Err(self.expected(&format!(
            "`is`, `equals`, `contains`, `starts with`, `ends with`, `exists` or a comparison such as `>` \
             after the field `{field}`"
        )))
    }

    /// `greater than`, `more than`, `above`, `over`, `less than`, `below`, `under`, `at least`,
    /// `at most` and `equal to`, each with its value; `None` when none of them comes next.
    fn ordering_or_equality(&mut self) -> Result<Option<Op>, FilterError> {
        for word in ["greater", "more", "less"] {
            if self.eat_keyword(word) {
                self.expect_keyword("than", word)?;
                let or_equal = self.keyword_at(0, "or") && self.keyword_at(1, "equal");
                if or_equal {
                    self.next += 2;
                    self.expect_keyword("to", "or equal")?;
                }
                let value = self.scalar(&format!("`{word} than`"))?;
                return Ok(Some(match (word, or_equal) {
                    ("less", false) => Op::Lt(value),
                    ("less", true) => Op::Lte(value),
                    (_, false) => Op::Gt(value),
                    (_, true) => Op::Gte(value),
                }));
            }
        }
        for word in ["above", "over"] {
            if self.eat_keyword(word) {
                return Ok(Some(Op::Gt(self.scalar(&format!("`{word}`"))?)));
            }
        }
        for word in ["below", "under"] {
            if self.eat_keyword(word) {
                return Ok(Some(Op::Lt(self.scalar(&format!("`{word}`"))?)));
            }
        }
        if self.eat_keyword("at") {
            if self.eat_keyword("least") {
                return Ok(Some(Op::Gte(self.scalar("`at least`")?)));
            }
            if self.eat_keyword("most") {
                return Ok(Some(Op::Lte(self.scalar("`at most`")?)));
            }
            return Err(self.expected("`least` or `most` after `at`"));
        }
        if self.eat_keyword("equal") {
            self.expect_keyword("to", "equal")?;
            return Ok(Some(Op::Eq(self.scalar("`equal to`")?)));
        }
        Ok(None)
    }

    /// The values of `one of`: `a, b, c`, `a, b or c` or `a, b, or c`. A comma followed by a
    /// value standing alone separates values, as it always did (even `opened`); one followed
    /// by a condition, a contact fact or `and` ends the list and joins what follows. After the
    /// value of an `or`, a comma always ends the list.
    fn list(&mut self) -> Result<Vec<Scalar>, FilterError> {
        let mut values = vec![self.scalar("`one of`")?];
        let mut after_or = false;
        loop {
            let comma = self.peek().is_some_and(|token| token.kind == TokenKind::Comma);
            if comma && !after_or && self.value_alone_at(1) {
                self.next += 1;
                values.push(self.scalar("`,`")?);
            } else if comma && !after_or && self.keyword_at(1, "or") && self.lone_value(2).is_some() {
                self.next += 2;
                values.push(self.scalar("`or`")?);
                after_or = true;
            } else if comma
                && !after_or
                && !self.keyword_at(1, "and")
                && !self.keyword_at(1, "or")
                && !self.condition_at(1)
            {
                // Not a value alone either: read it as one, to say what is wrong with it.
                self.next += 1;
                values.push(self.scalar("`,`")?);
            } else if !comma && self.keyword_at(0, "or") && self.lone_value(1).is_some() {
                self.next += 1;
                values.push(self.scalar("`or`")?);
                after_or = true;
            } else {
                return Ok(values);
            }
        }
    }

    /// Whether the token at `offset` is a value standing alone: a quoted text or a bare word
    /// (not `and`, `or` or `not`) followed by the end, `,`, `)`, `and` or `or`.
    fn value_alone_at(&self, offset: usize) -> bool {
        let value = match self.tokens.get(self.next + offset).map(|token| &token.kind) {
            Some(TokenKind::Quoted(_)) => true,
            Some(TokenKind::Word(word)) => !is_connective(word) && !word.eq_ignore_ascii_case("not"),
            _ => false,
        };
        let alone = match self.tokens.get(self.next + offset + 1).map(|token| &token.kind) {
            None | Some(TokenKind::Comma | TokenKind::Close) => true,
            Some(TokenKind::Word(word)) => is_connective(word),
            Some(_) => false,
        };
        value && alone
    }

    /// The value standing alone at `offset` where no condition or contact fact starts: `opened`
    /// alone stays the contact fact it always was.
    fn lone_value(&mut self, offset: usize) -> Option<LoneValue> {
        if !self.value_alone_at(offset) || self.condition_at(offset) {
            return None;
        }
        let token = self.tokens.get(self.next + offset)?;
        let (text, quoted) = match &token.kind {
            TokenKind::Quoted(text) => (text.clone(), true),
            TokenKind::Word(word) => (word.clone(), false),
            _ => return None,
        };
        Some(LoneValue { text, quoted, position: token.position, shown: token.kind.to_string() })
    }

    /// Whether a condition starts at `offset`: `(`, `not`, a contact fact (a malformed one too,
    /// so that its own error is the one reported) or a field followed by a comparison. The
    /// contact facts are recognised by reading one and going back, so that this stays what
    /// [`Parser::unary`] accepts.
    fn condition_at(&mut self, offset: usize) -> bool {
        let start = self.next;
        self.next += offset;
        let starts = match self.peek().map(|token| &token.kind) {
            None => false,
            Some(TokenKind::Open) => true,
            Some(_) if self.keyword_at(0, "not") => true,
            Some(kind) => {
                let field = match kind {
                    TokenKind::Quoted(_) => true,
                    TokenKind::Word(word) => !is_connective(word),
                    _ => false,
                };
                let comparison = match self.tokens.get(self.next + 1).map(|token| &token.kind) {
                    Some(TokenKind::Symbol(_)) => true,
                    Some(TokenKind::Word(word)) => is_comparison_word(word),
                    _ => false,
                };
                (field && comparison) || !matches!(self.contact_fact(), Ok(None))
            }
        };
        self.next = start;
        starts
    }

    /// A value: quoted text is a string, a bare token a boolean, number or string.
    fn scalar(&mut self, after: &str) -> Result<Scalar, FilterError> {
        let (word, quoted) = self.value_token(after)?;
        Ok(if quoted { Scalar::String(word) } else { bare_scalar(&word) })
    }

    /// A value taken as text, however it reads.
    fn text(&mut self, after: &str) -> Result<String, FilterError> {
        self.value_token(after).map(|(text, _)| text)
    }

    /// The next value's text and whether it was quoted.
    fn value_token(&mut self, after: &str) -> Result<(String, bool), FilterError> {
        let value = match self.peek() {
            Some(Token { kind: TokenKind::Quoted(text), .. }) => (text.clone(), true),
            Some(Token { kind: TokenKind::Word(word), position }) if word.eq_ignore_ascii_case("null") => {
                return Err(FilterError::new(format!(
                    "`null` at character {position} is not a value; use `is set` or `is not set`, or quote it"
                )));
            }
            Some(Token { kind: TokenKind::Word(word), .. })
                if !is_connective(word) && !word.eq_ignore_ascii_case("not") =>
            {
                (word.clone(), false)
            }
            _ => return Err(self.expected(&format!("a value after {after}"))),
        };
        self.next += 1;
        Ok(value)
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.next)
    }

    fn keyword_at(&self, offset: usize, keyword: &str) -> bool {
        matches!(
            self.tokens.get(self.next + offset),
            Some(Token { kind: TokenKind::Word(word), .. }) if word.eq_ignore_ascii_case(keyword)
        )
    }

    fn eat_keyword(&mut self, keyword: &str) -> bool {
        let found = self.keyword_at(0, keyword);
        if found {
            self.next += 1;
        }
        found
    }

    fn expect_keyword(&mut self, keyword: &str, after: &str) -> Result<(), FilterError> {
        if self.eat_keyword(keyword) { Ok(()) } else { Err(self.expected(&format!("`{keyword}` after `{after}`"))) }
    }

    fn expected(&self, what: &str) -> FilterError {
        match self.peek() {
            Some(token) => {
                FilterError::new(format!("expected {what}, found {} at character {}", token.kind, token.position))
            }
            None => FilterError::new(format!("expected {what}, found the end of the text")),
        }
    }
}

/// The root of the fields holding a contact's topic subscriptions: `subscriptions.<topic>` is
/// `subscribed`, `pending` or `unsubscribed` (`subscribed to <topic>` reads as the first).
pub const SUBSCRIPTIONS: &str = "subscriptions";
/// The subscription state `subscribed to` asks for.
pub(crate) const SUBSCRIBED: &str = "subscribed";
/// The field `has email consent` reads (`consent.email is true`).
pub const CONSENT_EMAIL: &str = "consent.email";

/// The words that begin a comparison after a field.
fn is_comparison_word(word: &str) -> bool {
    [
        "is", "equals", "contains", "starts", "ends", "exists", "does", "greater", "more", "less", "above", "over",
        "below", "under", "at", "equal",
    ]
    .iter()
    .any(|keyword| keyword.eq_ignore_ascii_case(word))
}

/// The refusal of `or <value>` after a comparison that takes no list of values (`plan is not
/// free or trial`, `age > 30 or 40`), with what to write instead.
fn or_list_refusal(first: &Condition, negated: bool, value: &LoneValue) -> FilterError {
    let field = plain_text(first.field.as_str());
    let written = value.written();
    let hint = match (&first.op, negated) {
        // People mean neither value, while two negative conditions joined by `or` hold for
        // almost everyone: refused rather than read one way or the other.
        (Op::Ne(excluded), false) => format!(
            "a negative comparison takes one value: to exclude both, write `{field} is not one of {}, {written}`",
            describe_scalar(excluded)
        ),
        (Op::Contains(_), true) => format!(
            "a negative comparison takes one value: to exclude both, write `not ({} or {written})`",
            describe_condition(first)
        ),
        _ => format!(
            "only `is`, `contains`, `starts with`, `ends with` and `is one of` take more values after `or`: \
             repeat the field and comparison, as in `{field} {} {written}`",
            comparison_words(&first.op, negated)
        ),
    };
    FilterError::new(format!(
        "expected a condition after `or`, found the lone value {} at character {}; {hint}",
        value.shown, value.position
    ))
}

/// The refusal of a lone value after `and` or a comma (`plan is pro and enterprise`), with what
/// to write instead; `values_written` are the condition's values so far, as written.
fn lone_value_refusal(
    joiner: &str,
    first: &Condition,
    negated: bool,
    values_written: &[String],
    value: &LoneValue,
) -> FilterError {
    let field = plain_text(first.field.as_str());
    let comparison = comparison_words(&first.op, negated);
    let written = value.written();
    let hint = match (&first.op, negated) {
        (Op::Eq(_), false) => format!(
            "a field cannot equal two values: to match either, write `{field} is {} or {written}`",
            values_written.join(" or ")
        ),
        (Op::Ne(_), false) => {
            format!("to exclude both values, write `{field} is not one of {}, {written}`", values_written.join(", "))
        }
        (Op::In(_), _) => {
            format!("to list another value, write `{field} {comparison} {}, {written}`", values_written.join(", "))
        }
        _ => format!(
            "{joiner} joins conditions: repeat the field and comparison, as in `{field} {comparison} {written}`"
        ),
    };
    FilterError::new(format!(
        "expected a condition after {joiner}, found the lone value {} at character {}; {hint}",
        value.shown, value.position
    ))
}

impl LoneValue {
    /// The value as plain words write it: as typed when bare, quoted when it needs quotes.
    fn written(&self) -> String {
        if self.quoted { plain_text(&self.text) } else { self.text.clone() }
    }
}

/// Seconds in one `unit` (singular or plural).
fn unit_seconds(unit: &str) -> Option<u64> {
    let unit = unit.to_ascii_lowercase();
    Some(match unit.strip_suffix('s').unwrap_or(&unit) {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        "week" => 604_800,
        _ => return None,
    })
}

fn is_connective(word: &str) -> bool {
    word.eq_ignore_ascii_case("and") || word.eq_ignore_ascii_case("or")
}

fn bare_scalar(word: &str) -> Scalar {
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
fn number_in_text(text: &str) -> Option<Number> {
    let looks_numeric = text.starts_with(|character: char| character == '-' || character.is_ascii_digit());
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Number(number)) if looks_numeric => Some(number),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Describing.

fn describe_part(part: &Filter) -> String {
    match part {
        Filter::All(_) | Filter::Any(_) => format!("({})", describe(part)),
        _ => describe(part),
    }
}

fn describe_performed(performed: &Performed) -> String {
    let mut words = format!("performed {}", plain_text(&performed.event));
    if performed.at_least > 1 {
        words.push_str(&format!(" at least {} times", performed.at_least));
    }
    if let Some(seconds) = performed.within_seconds {
        words.push_str(&window_words(seconds));
    }
    words
}

/// ` in the last N <unit>`, in the largest unit that divides `seconds`.
fn window_words(seconds: u64) -> String {
    // Whole weeks from two on (`7 days` reads better than `1 week`), else the largest unit.
    let (size, unit) = [(604_800, "weeks"), (86_400, "days"), (3_600, "hours"), (60, "minutes")]
        .into_iter()
        .find(|(size, unit)| seconds.is_multiple_of(*size) && (*unit != "weeks" || seconds / size >= 2))
        .unwrap_or((1, "seconds"));
    let count = seconds / size;
    let unit = if count == 1 { unit.trim_end_matches('s') } else { unit };
    format!(" in the last {count} {unit}")
}

fn describe_condition(condition: &Condition) -> String {
    let path = condition.field.as_str();
    if let (Some(topic), Op::Eq(Scalar::String(state))) =
        (path.strip_prefix(SUBSCRIPTIONS).and_then(|rest| rest.strip_prefix('.')), &condition.op)
        && state == SUBSCRIBED
        && !topic.contains('.')
    {
        return format!("subscribed to {}", plain_text(topic));
    }
    if path == CONSENT_EMAIL && condition.op == Op::Eq(Scalar::Bool(true)) {
        return "has email consent".to_owned();
    }
    let field = plain_text(condition.field.as_str());
    let comparison = comparison_words(&condition.op, false);
    match value_words(&condition.op) {
        Some(value) => format!("{field} {comparison} {value}"),
        None => format!("{field} {comparison}"),
    }
}

/// The canonical words of a comparison, or of its negation where the language has words for it
/// (`does not contain`, `is not one of`, `is not greater than`; the parser negates no `starts
/// with` or `ends with`).
fn comparison_words(op: &Op, negated: bool) -> &'static str {
    match (op, negated) {
        (Op::Eq(_), false) | (Op::Ne(_), true) => "is",
        (Op::Ne(_), false) | (Op::Eq(_), true) => "is not",
        (Op::Contains(_), false) => "contains",
        (Op::Contains(_), true) => "does not contain",
        (Op::StartsWith(_), _) => "starts with",
        (Op::EndsWith(_), _) => "ends with",
        (Op::Gt(_), false) => "is greater than",
        (Op::Gt(_), true) => "is not greater than",
        (Op::Gte(_), false) => "is at least",
        (Op::Gte(_), true) => "is not at least",
        (Op::Lt(_), false) => "is less than",
        (Op::Lt(_), true) => "is not less than",
        (Op::Lte(_), false) => "is at most",
        (Op::Lte(_), true) => "is not at most",
        (Op::Exists, false) | (Op::NotExists, true) => "is set",
        (Op::NotExists, false) | (Op::Exists, true) => "is not set",
        (Op::In(_), false) => "is one of",
        (Op::In(_), true) => "is not one of",
    }
}

/// The canonical words of a comparison's value (values, for `in`); none for `exists` and
/// `not_exists`.
fn value_words(op: &Op) -> Option<String> {
    match op {
        Op::Eq(value)
        | Op::Ne(value)
        | Op::Contains(value)
        | Op::Gt(value)
        | Op::Gte(value)
        | Op::Lt(value)
        | Op::Lte(value) => Some(describe_scalar(value)),
        Op::StartsWith(text) | Op::EndsWith(text) => Some(plain_text(text)),
        Op::Exists | Op::NotExists => None,
        Op::In(values) => Some(values.iter().map(describe_scalar).collect::<Vec<_>>().join(", ")),
    }
}

fn describe_scalar(value: &Scalar) -> String {
    match value {
        Scalar::String(text) => plain_text(text),
        Scalar::Number(number) => number.to_string(),
        Scalar::Bool(flag) => flag.to_string(),
    }
}

/// `text` bare when the parser reads it back as the same string, quoted otherwise.
fn plain_text(text: &str) -> String {
    let needs_quotes = text.is_empty()
        || text.starts_with(['"', '\''])
        || text.chars().any(|character| !is_word_char(character) || character.is_control())
        || RESERVED_WORDS.iter().any(|word| word.eq_ignore_ascii_case(text))
        || number_in_text(text).is_some();
    if needs_quotes { format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"")) } else { text.to_owned() }
}

// ---------------------------------------------------------------------------------------------
// Evaluation.

fn condition_matches(condition: &Condition, document: &Value) -> bool {
    let found = lookup(document, &condition.field);
    match (&condition.op, found) {
        (Op::Exists, found) => found.is_some(),
        (Op::NotExists, found) => found.is_none(),
        (Op::Ne(_), None) => true,
        (_, None) => false,
        (Op::Eq(expected), Some(actual)) => some_element(actual, |element| scalar_equals(element, expected)),
        (Op::Ne(expected), Some(actual)) => !some_element(actual, |element| scalar_equals(element, expected)),
        (Op::Contains(expected), Some(Value::Array(elements))) => {
            elements.iter().any(|element| scalar_equals(element, expected))
        }
        (Op::Contains(expected), Some(Value::String(text))) => {
            text.to_lowercase().contains(&expected.text().to_lowercase())
        }
        (Op::Contains(_), Some(_)) => false,
        (Op::StartsWith(prefix), Some(actual)) => some_element(actual, |element| {
            element.as_str().is_some_and(|text| text.to_lowercase().starts_with(&prefix.to_lowercase()))
        }),
        (Op::EndsWith(suffix), Some(actual)) => some_element(actual, |element| {
            element.as_str().is_some_and(|text| text.to_lowercase().ends_with(&suffix.to_lowercase()))
        }),
        (Op::Gt(expected), Some(actual)) => {
            some_element(actual, |element| compare(element, expected) == Some(Ordering::Greater))
        }
        (Op::Gte(expected), Some(actual)) => some_element(actual, |element| {
            matches!(compare(element, expected), Some(Ordering::Greater | Ordering::Equal))
        }),
        (Op::Lt(expected), Some(actual)) => {
            some_element(actual, |element| compare(element, expected) == Some(Ordering::Less))
        }
        (Op::Lte(expected), Some(actual)) => {
            some_element(actual, |element| matches!(compare(element, expected), Some(Ordering::Less | Ordering::Equal)))
        }
        (Op::In(options), Some(actual)) => {
            some_element(actual, |element| options.iter().any(|option| scalar_equals(element, option)))
        }
    }
}

/// The value at `path`, or `None` when it is missing or null.
fn lookup<'a>(document: &'a Value, path: &FieldPath) -> Option<&'a Value> {
    let mut current = document;
    for segment in path.segments() {
        current = current.as_object()?.get(segment)?;
    }
    (!current.is_null()).then_some(current)
}

/// Whether `test` holds for `value`, or for some element when `value` is an array.
fn some_element(value: &Value, test: impl Fn(&Value) -> bool) -> bool {
    match value {
        Value::Array(elements) => elements.iter().any(test),
        other => test(other),
    }
}

fn scalar_equals(actual: &Value, expected: &Scalar) -> bool {
    match (actual, expected) {
        (Value::String(actual), Scalar::String(expected)) => actual.to_lowercase() == expected.to_lowercase(),
        (Value::Number(actual), Scalar::Number(expected)) => compare_numbers(actual, expected) == Some(Ordering::Equal),
        (Value::Number(actual), Scalar::String(expected)) => number_in_text(expected.trim())
            .is_some_and(|expected| compare_numbers(actual, &expected) == Some(Ordering::Equal)),
        (Value::String(actual), Scalar::Number(expected)) => number_in_text(actual.trim())
            .is_some_and(|actual| compare_numbers(&actual, expected) == Some(Ordering::Equal)),
        (Value::Bool(actual), Scalar::Bool(expected)) => actual == expected,
        (Value::Bool(actual), Scalar::String(text)) | (Value::String(text), Scalar::Bool(actual)) => {
            text.trim().eq_ignore_ascii_case(if *actual { "true" } else { "false" })
        }
        _ => false,
    }
}

fn compare(actual: &Value, expected: &Scalar) -> Option<Ordering> {
    let expected_number = match expected {
        Scalar::Number(number) => Some(number.clone()),
        Scalar::String(text) => number_in_text(text.trim()),
        Scalar::Bool(_) => None,
    };
    match actual {
        Value::Number(actual) => compare_numbers(actual, &expected_number?),
        Value::String(actual) => {
            if let (Some(actual), Some(expected)) = (number_in_text(actual.trim()), &expected_number) {
                return compare_numbers(&actual, expected);
            }
            match expected {
                Scalar::String(expected) if looks_like_date(actual) && looks_like_date(expected) => {
                    Some(actual.as_str().cmp(expected.as_str()))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Integers compare exactly; anything else as `f64`.
fn compare_numbers(left: &Number, right: &Number) -> Option<Ordering> {
    if let (Some(left), Some(right)) = (left.as_i64(), right.as_i64()) {
        return Some(left.cmp(&right));
    }
    if let (Some(left), Some(right)) = (left.as_u64(), right.as_u64()) {
        return Some(left.cmp(&right));
    }
    left.as_f64()?.partial_cmp(&right.as_f64()?)
}

/// Whether `text` starts with a `YYYY-MM-DD` date (and, if more follows, a `T` or a space).
fn looks_like_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits =
        |range: std::ops::Range<usize>| bytes.get(range).is_some_and(|part| part.iter().all(u8::is_ascii_digit));
    digits(0..4)
        && bytes.get(4) == Some(&b'-')
        && digits(5..7)
        && bytes.get(7) == Some(&b'-')
        && digits(8..10)
        && matches!(bytes.get(10), None | Some(b'T' | b't' | b' '))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(field: &str, op: Op) -> Filter {
        Filter::Condition(Condition { field: FieldPath::parse(field).expect("a valid field path"), op })
    }

    fn text(value: &str) -> Scalar {
        Scalar::String(value.to_owned())
    }

    fn number(value: i64) -> Scalar {
        Scalar::Number(value.into())
    }

    fn parsed(text: &str) -> Filter {
        parse_plain(text).unwrap_or_else(|error| panic!("{text:?} should parse: {error}"))
    }

    fn parse_error(text: &str) -> String {
        match parse_plain(text) {
            Ok(filter) => panic!("{text:?} should not parse, got {filter:?}"),
            Err(error) => error.message().to_owned(),
        }
    }

    fn json_error(value: Value) -> String {
        match from_json(&value) {
            Ok(filter) => panic!("{value} should be rejected, got {filter:?}"),
            Err(error) => error.message().to_owned(),
        }
    }

    // Parsing plain words.

    #[test]
    fn given_the_decision_example_when_parsed_then_both_conditions_are_joined_by_all() {
        let filter = parsed("plan is pro and email ends with @acme.com");

        assert_eq!(
            filter,
            Filter::All(vec![
                condition("plan", Op::Eq(text("pro"))),
                condition("email", Op::EndsWith("@acme.com".to_owned())),
            ])
        );
    }

    #[test]
    fn given_every_comparison_form_when_parsed_then_each_gives_its_op() {
        let cases = [
            ("plan is pro", condition("plan", Op::Eq(text("pro")))),
            ("plan equals pro", condition("plan", Op::Eq(text("pro")))),
            ("plan is equal to pro", condition("plan", Op::Eq(text("pro")))),
            ("plan = pro", condition("plan", Op::Eq(text("pro")))),
            ("plan == pro", condition("plan", Op::Eq(text("pro")))),
            ("plan is not pro", condition("plan", Op::Ne(text("pro")))),
            ("plan is not equal to pro", condition("plan", Op::Ne(text("pro")))),
            ("plan != pro", condition("plan", Op::Ne(text("pro")))),
            ("tags contains vip", condition("tags", Op::Contains(text("vip")))),
            ("name does not contain test", Filter::Not(Box::new(condition("name", Op::Contains(text("test")))))),
            ("phone starts with +44", condition("phone", Op::StartsWith("+44".to_owned()))),
            ("zip starts with 75", condition("zip", Op::StartsWith("75".to_owned()))),
            ("email ends with @acme.com", condition("email", Op::EndsWith("@acme.com".to_owned()))),
            ("age is greater than 30", condition("age", Op::Gt(number(30)))),
            ("age is more than 30", condition("age", Op::Gt(number(30)))),
            ("age is above 30", condition("age", Op::Gt(number(30)))),
            ("age over 30", condition("age", Op::Gt(number(30)))),
            ("age > 30", condition("age", Op::Gt(number(30)))),
            ("age is at least 30", condition("age", Op::Gte(number(30)))),
            ("age is greater than or equal to 30", condition("age", Op::Gte(number(30)))),
            ("age >= 30", condition("age", Op::Gte(number(30)))),
            ("age is less than 30", condition("age", Op::Lt(number(30)))),
            ("age is below 30", condition("age", Op::Lt(number(30)))),
            ("age under 30", condition("age", Op::Lt(number(30)))),
            ("age < 30", condition("age", Op::Lt(number(30)))),
            ("age is at most 30", condition("age", Op::Lte(number(30)))),
            ("age is less than or equal to 30", condition("age", Op::Lte(number(30)))),
            ("age <= 30", condition("age", Op::Lte(number(30)))),
            ("age is not greater than 30", Filter::Not(Box::new(condition("age", Op::Gt(number(30)))))),
            ("company is set", condition("company", Op::Exists)),
            ("company exists", condition("company", Op::Exists)),
            ("company is not missing", condition("company", Op::Exists)),
            ("company is not set", condition("company", Op::NotExists)),
            ("company is missing", condition("company", Op::NotExists)),
            ("company does not exist", condition("company", Op::NotExists)),
            ("plan is one of pro, team", condition("plan", Op::In(vec![text("pro"), text("team")]))),
            ("plan is not one of free", Filter::Not(Box::new(condition("plan", Op::In(vec![text("free")]))))),
        ];

        for (input, expected) in cases {
            assert_eq!(parsed(input), expected, "{input}");
        }
    }

    #[test]
    fn given_values_of_each_kind_when_parsed_then_they_keep_their_type() {
        assert_eq!(parsed("x is 'single quoted'"), condition("x", Op::Eq(text("single quoted"))));
        assert_eq!(parsed(r#"x is "say \"hi\"""#), condition("x", Op::Eq(text("say \"hi\""))));
        assert_eq!(
            parsed("x is -2.5"),
            condition("x", Op::Eq(Scalar::Number(Number::from_f64(-2.5).expect("finite"))))
        );
        assert_eq!(parsed("x is TRUE"), condition("x", Op::Eq(Scalar::Bool(true))));
        assert_eq!(parsed("x is \"true\""), condition("x", Op::Eq(text("true"))));
        assert_eq!(parsed("x is \"42\""), condition("x", Op::Eq(text("42"))));
        assert_eq!(parsed("zip is 01234"), condition("zip", Op::Eq(text("01234"))), "not a JSON number");
        assert_eq!(parsed("name is O'Brien"), condition("name", Op::Eq(text("O'Brien"))));
        assert_eq!(parsed("signed_up_at > 2024-05-01"), condition("signed_up_at", Op::Gt(text("2024-05-01"))));
        assert_eq!(parsed("\"first name\" is Ada"), condition("first name", Op::Eq(text("Ada"))));
        assert_eq!(parsed("data.address.country is fr"), condition("data.address.country", Op::Eq(text("fr"))));
    }

    #[test]
    fn given_mixed_case_keywords_when_parsed_then_they_are_recognised_and_values_keep_their_case() {
        assert_eq!(
            parsed("Plan IS Pro AND Email Ends With @Acme.com"),
            Filter::All(vec![
                condition("Plan", Op::Eq(text("Pro"))),
                condition("Email", Op::EndsWith("@Acme.com".to_owned())),
            ])
        );
    }

    #[test]
    fn given_and_and_or_when_parsed_then_and_binds_tighter() {
        let a = condition("a", Op::Eq(number(1)));
        let b = condition("b", Op::Eq(number(2)));
        let c = condition("c", Op::Eq(number(3)));

        assert_eq!(
            parsed("a is 1 or b is 2 and c is 3"),
            Filter::Any(vec![a.clone(), Filter::All(vec![b.clone(), c.clone()])])
        );
        assert_eq!(
            parsed("a is 1 and b is 2 or c is 3"),
            Filter::Any(vec![Filter::All(vec![a.clone(), b.clone()]), c.clone()])
        );
        assert_eq!(
            parsed("(a is 1 or b is 2) and c is 3"),
            Filter::All(vec![Filter::Any(vec![a.clone(), b.clone()]), c.clone()])
        );
        assert_eq!(
            parsed("not a is 1 and b is 2"),
            Filter::All(vec![Filter::Not(Box::new(a.clone())), b.clone()]),
            "not binds tighter than and"
        );
        assert_eq!(parsed("not (a is 1 or b is 2)"), Filter::Not(Box::new(Filter::Any(vec![a.clone(), b.clone()]))));
    }

    #[test]
    fn given_redundant_groups_when_parsed_then_they_are_flattened() {
        let a = condition("a", Op::Eq(number(1)));
        let b = condition("b", Op::Eq(number(2)));
        let c = condition("c", Op::Eq(number(3)));

        assert_eq!(parsed("((a is 1))"), a.clone());
        assert_eq!(parsed("a is 1 and (b is 2 and c is 3)"), Filter::All(vec![a, b, c]));
    }

    #[test]
    fn given_malformed_text_when_parsed_then_the_error_says_what_was_expected_and_where() {
        let cases = [
            ("", "the requirements are empty; expected a condition such as `plan is pro`"),
            ("   ", "the requirements are empty; expected a condition such as `plan is pro`"),
            ("plan is", "expected a value after `is`, found the end of the text"),
            (
                "plan",
                "expected `is`, `equals`, `contains`, `starts with`, `ends with`, `exists` or a comparison such as `>` after the field `plan`, found the end of the text",
            ),
            ("plan is pro and", "expected a condition such as `plan is pro`, found the end of the text"),
            ("plan is pro or or x is 1", "expected a condition such as `plan is pro`, found `or` at character 16"),
            (
                "name is Ada Lovelace",
                "expected `and`, `or` or the end of the text, found `Lovelace` at character 13; quote a value that has spaces",
            ),
            ("(plan is pro", "expected `)` to close the `(` at character 1, found the end of the text"),
            ("plan is pro)", "found `)` at character 12 without a matching `(`"),
            ("name is \"Ada", "the quote opened at character 9 is never closed"),
            ("plan ! pro", "expected `!=` at character 6, found a lone `!`; quote a value that contains it"),
            ("age is at 30", "expected `least` or `most` after `at`, found `30` at character 11"),
            ("email starts pro", "expected `with` after `starts`, found `pro` at character 14"),
            ("plan is null", "`null` at character 9 is not a value; use `is set` or `is not set`, or quote it"),
            ("plan is one of pro,", "expected a value after `,`, found the end of the text"),
            (
                "age > old",
                "a greater-than or less-than comparison needs a number or a date such as 2024-05-01, found `old` (in the condition on `age` at character 1)",
            ),
            (
                "a..b is 1",
                "the field path `a..b` has an empty segment; separate names with single dots (at character 1)",
            ),
        ];

        for (input, expected) in cases {
            assert_eq!(parse_error(input), expected, "{input:?}");
        }
    }

    #[test]
    fn given_commas_between_conditions_when_parsed_then_they_are_an_and_looser_than_or() {
        let a = condition("a", Op::Eq(number(1)));
        let b = condition("b", Op::Eq(number(2)));
        let c = condition("c", Op::Eq(number(3)));
        let d = condition("d", Op::Eq(number(4)));
        let newsletter = condition("subscriptions.newsletter", Op::Eq(text("subscribed")));

        assert_eq!(
            parsed("plan is pro or plan is enterprise, subscribed to newsletter"),
            Filter::All(vec![
                Filter::Any(vec![
                    condition("plan", Op::Eq(text("pro"))),
                    condition("plan", Op::Eq(text("enterprise")))
                ]),
                newsletter,
            ])
        );
        assert_eq!(
            parsed("a is 1 or b is 2, c is 3"),
            parsed("(a is 1 or b is 2) and c is 3"),
            "the comma binds looser than `or`"
        );
        assert_eq!(
            parsed("a is 1, b is 2 or c is 3 and d is 4"),
            Filter::All(vec![a.clone(), Filter::Any(vec![b.clone(), Filter::All(vec![c.clone(), d])])])
        );
        assert_eq!(parsed("a is 1, b is 2, c is 3"), Filter::All(vec![a.clone(), b.clone(), c.clone()]));
        assert_eq!(parsed("a is 1, b is 2, and c is 3"), parsed("a is 1, b is 2, c is 3"), "`, and` is a comma");
        assert_eq!(parsed("a is 1 and b is 2, c is 3"), Filter::All(vec![a.clone(), b.clone(), c.clone()]));
        assert_eq!(
            parsed("(a is 1, b is 2) or c is 3"),
            Filter::Any(vec![Filter::All(vec![a.clone(), b.clone()]), c.clone()]),
            "the same rules inside parentheses"
        );
        assert_eq!(
            parsed("not a is 1, b is 2"),
            Filter::All(vec![Filter::Not(Box::new(a)), b]),
            "not binds tighter than the comma"
        );
        assert_eq!(
            parsed("performed purchase in the last 30 days, has email consent, opened"),
            Filter::All(vec![
                performed("purchase", 1, Some(30 * 86_400)),
                condition("consent.email", Op::Eq(Scalar::Bool(true))),
                parsed("opened"),
            ])
        );
    }

    #[test]
    fn given_an_or_list_of_values_when_parsed_then_it_is_the_spelled_out_conditions() {
        let cases = [
            ("plan is pro or enterprise", "plan is pro or plan is enterprise"),
            ("plan = pro or enterprise or team", "plan is pro or plan is enterprise or plan is team"),
            ("plan equals pro or 'big corp'", "plan is pro or plan is \"big corp\""),
            ("age is 30 or 40", "age is 30 or age is 40"),
            ("tags contains vip or beta", "tags contains vip or tags contains beta"),
            ("phone starts with +44 or +33", "phone starts with +44 or phone starts with +33"),
            ("zip starts with 75 or 92", "zip starts with \"75\" or zip starts with \"92\""),
            ("email ends with @acme.com or @acme.org", "email ends with @acme.com or email ends with @acme.org"),
            ("plan is pro or enterprise and country is fr", "(plan is pro or plan is enterprise) and country is fr"),
            ("country is fr and plan is pro or enterprise", "country is fr and (plan is pro or plan is enterprise)"),
            ("not plan is pro or team", "not (plan is pro or plan is team)"),
            ("(plan is pro or enterprise)", "plan is pro or plan is enterprise"),
            ("plan is pro or \"opened\"", "plan is pro or plan is opened"),
        ];
        for (input, spelled_out) in cases {
            assert_eq!(parsed(input), parsed(spelled_out), "{input}");
        }
        assert_eq!(
            parsed("plan is pro or enterprise"),
            Filter::Any(vec![condition("plan", Op::Eq(text("pro"))), condition("plan", Op::Eq(text("enterprise")))])
        );
        assert_eq!(
            parsed("plan is pro or opened"),
            Filter::Any(vec![condition("plan", Op::Eq(text("pro"))), parsed("opened an email")]),
            "a contact fact on its own stays that fact"
        );
        assert_eq!(parsed("plan is pro or clicked, plan is set"), parsed("(plan is pro or clicked) and plan is set"));
    }

    #[test]
    fn given_commas_in_a_one_of_list_when_parsed_then_a_condition_after_a_comma_ends_the_list() {
        let fr_de = condition("country", Op::In(vec![text("fr"), text("de")]));
        assert_eq!(
            parsed("country is one of fr, de, subscribed to newsletter"),
            Filter::All(vec![fr_de.clone(), condition("subscriptions.newsletter", Op::Eq(text("subscribed")))])
        );
        assert_eq!(
            parsed("country is one of fr, de, plan is pro"),
            Filter::All(vec![fr_de.clone(), condition("plan", Op::Eq(text("pro")))])
        );
        assert_eq!(
            parsed("country is one of fr, de, and plan is pro"),
            parsed("country is one of fr, de, plan is pro")
        );
        for (input, spelled_out) in [
            ("country is one of fr, de, has email consent", "country is one of fr, de and has email consent"),
            ("country is one of fr, de, not plan is pro", "country is one of fr, de and not (plan is pro)"),
            ("country is one of fr, de, (a is 1 or b is 2)", "country is one of fr, de and (a is 1 or b is 2)"),
            ("country is one of fr, de, performed purchase", "country is one of fr, de and performed purchase"),
            ("country is one of fr, de, has not opened", "country is one of fr, de and has not opened"),
            ("country is one of fr, de or uk", "country is one of fr, de, uk"),
            ("country is one of fr, de, or uk", "country is one of fr, de, uk"),
            ("country is one of fr or de or uk", "country is one of fr, de, uk"),
            ("country is not one of fr, de or uk", "not (country is one of fr, de, uk)"),
            ("country is one of fr, de or uk, plan is pro", "country is one of fr, de, uk and plan is pro"),
        ] {
            assert_eq!(parsed(input), parsed(spelled_out), "{input}");
        }
        assert_eq!(
            parsed("tags is one of new, opened"),
            condition("tags", Op::In(vec![text("new"), text("opened")])),
            "a value standing alone after a comma stays in the list, as it always did"
        );
        assert_eq!(
            parsed("tags is one of new or opened"),
            Filter::Any(vec![condition("tags", Op::In(vec![text("new")])), parsed("opened")]),
            "as `or opened` always was the contact fact"
        );
    }

    #[test]
    fn given_keywords_in_any_case_with_commas_and_or_lists_when_parsed_then_values_keep_their_case() {
        assert_eq!(
            parsed("Plan IS pro OR Enterprise, SUBSCRIBED TO newsletter"),
            Filter::All(vec![
                Filter::Any(vec![
                    condition("Plan", Op::Eq(text("pro"))),
                    condition("Plan", Op::Eq(text("Enterprise")))
                ]),
                condition("subscriptions.newsletter", Op::Eq(text("subscribed"))),
            ])
        );
        assert_eq!(
            parsed("Country IS ONE OF FR, De OR uk, AND Has Email Consent"),
            Filter::All(vec![
                condition("Country", Op::In(vec![text("FR"), text("De"), text("uk")])),
                condition("consent.email", Op::Eq(Scalar::Bool(true))),
            ])
        );
    }

    #[test]
    fn given_text_that_still_does_not_parse_when_parsed_then_the_error_says_what_was_expected_and_where() {
        let cases = [
            (
                "Pro and enterprise customers who get the newsletter",
                "expected `is`, `equals`, `contains`, `starts with`, `ends with`, `exists` or a comparison such as `>` after the field `Pro`, found `and` at character 5",
            ),
            (
                "plan is pro,",
                "expected a condition such as `plan is pro` after the `,` at character 12, found the end of the text",
            ),
            (
                "(plan is pro, )",
                "expected a condition such as `plan is pro` after the `,` at character 13, found `)` at character 15",
            ),
            (
                "plan is pro, or plan is team",
                "expected a condition such as `plan is pro` after the `,` at character 12, found `or` at character 14; a comma means `and`, so `, or` is ambiguous: write `or` without the comma and group with parentheses, as in `(plan is pro or plan is team), subscribed to news`",
            ),
            (
                "plan is pro and enterprise",
                "expected a condition after `and`, found the lone value `enterprise` at character 17; a field cannot equal two values: to match either, write `plan is pro or enterprise`",
            ),
            (
                "plan is pro or team and enterprise",
                "expected a condition after `and`, found the lone value `enterprise` at character 25; a field cannot equal two values: to match either, write `plan is pro or team or enterprise`",
            ),
            (
                "plan is pro, enterprise",
                "expected a condition after `,`, found the lone value `enterprise` at character 14; a field cannot equal two values: to match either, write `plan is pro or enterprise`",
            ),
            (
                "plan is not free or trial",
                "expected a condition after `or`, found the lone value `trial` at character 21; a negative comparison takes one value: to exclude both, write `plan is not one of free, trial`",
            ),
            (
                "plan != free and 'free trial'",
                "expected a condition after `and`, found the lone value \"free trial\" at character 18; to exclude both values, write `plan is not one of free, \"free trial\"`",
            ),
            (
                "name does not contain test or demo",
                "expected a condition after `or`, found the lone value `demo` at character 31; a negative comparison takes one value: to exclude both, write `not (name contains test or demo)`",
            ),
            (
                "age > 30 or 40",
                "expected a condition after `or`, found the lone value `40` at character 13; only `is`, `contains`, `starts with`, `ends with` and `is one of` take more values after `or`: repeat the field and comparison, as in `age is greater than 40`",
            ),
            (
                "tags contains vip and beta",
                "expected a condition after `and`, found the lone value `beta` at character 23; `and` joins conditions: repeat the field and comparison, as in `tags contains beta`",
            ),
            (
                "country is one of fr and de",
                "expected a condition after `and`, found the lone value `de` at character 26; to list another value, write `country is one of fr, de`",
            ),
            (
                "country is not one of fr, de, and uk",
                "expected a condition after `, and`, found the lone value `uk` at character 35; to list another value, write `country is not one of fr, de, uk`",
            ),
            (
                "country is one of fr, de, or plan is pro",
                "expected a condition such as `plan is pro` after the `,` at character 25, found `or` at character 27; a comma means `and`, so `, or` is ambiguous: write `or` without the comma and group with parentheses, as in `(plan is pro or plan is team), subscribed to news`",
            ),
            ("plan is pro or null", "`null` at character 16 is not a value; use `is set` or `is not set`, or quote it"),
            (
                "company is set or acme",
                "expected `is`, `equals`, `contains`, `starts with`, `ends with`, `exists` or a comparison such as `>` after the field `acme`, found the end of the text",
            ),
            (
                "country is one of fr, de, has performed",
                "expected the name of an event after `performed`, found the end of the text",
            ),
        ];

        for (input, expected) in cases {
            assert_eq!(parse_error(input), expected, "{input:?}");
        }
    }

    #[test]
    fn given_commas_and_or_lists_when_described_then_the_canonical_words_read_back_the_same() {
        for input in [
            "plan is pro or enterprise, subscribed to newsletter",
            "country is one of fr, de, opened, plan is pro or team",
            "tags is one of a, b or c, not (email ends with @acme.com or @acme.org), has email consent",
            "Plan IS pro OR Enterprise, SUBSCRIBED TO newsletter",
        ] {
            let filter = parsed(input);
            let described = describe(&filter);
            assert!(!described.contains(", subscribed") && !described.contains(", has"), "{described}");
            assert_eq!(parsed(&described), filter, "{input} -> {described}");
        }
        assert_eq!(
            describe(&parsed("plan is pro or enterprise, subscribed to newsletter")),
            "(plan is pro or plan is enterprise) and subscribed to newsletter"
        );
    }

    #[test]
    fn given_too_deep_or_too_many_conditions_when_parsed_then_the_limits_apply() {
        let deep_enough = format!("{}a is 1", "not ".repeat(MAX_DEPTH - 1));
        assert_eq!(parsed(&deep_enough).depth(), MAX_DEPTH);
        let too_deep = format!("{}a is 1", "not ".repeat(MAX_DEPTH));
        assert!(parse_error(&too_deep).contains("deeper than 8 levels"), "{}", parse_error(&too_deep));
        let parens = format!("{}a is 1{}", "(".repeat(1000), ")".repeat(1000));
        assert!(parse_error(&parens).contains("deeper than 8 levels"));

        let clauses = |count: usize| (0..count).map(|index| format!("f{index} is {index}")).collect::<Vec<_>>();
        assert_eq!(parsed(&clauses(MAX_CONDITIONS).join(" and ")).conditions(), MAX_CONDITIONS);
        assert_eq!(
            parse_error(&clauses(MAX_CONDITIONS + 1).join(" or ")),
            "the filter has 51 conditions; at most 50 are allowed"
        );
    }

    // The JSON form.

    #[test]
    fn given_a_json_expression_when_read_then_it_gives_the_same_filter_as_plain_words() {
        let value = json!({"all": [
            {"field": "plan", "op": "eq", "value": "pro"},
            {"any": [
                {"field": "email", "op": "ends_with", "value": "@acme.com"},
                {"not": {"field": "data.age", "op": "lt", "value": 18}},
            ]},
            {"field": "country", "op": "in", "value": ["fr", "de"]},
            {"field": "company", "op": "exists"},
        ]});

        let filter = from_json(&value).expect("valid");

        assert_eq!(
            filter,
            parsed(
                "plan is pro and (email ends with @acme.com or not (data.age < 18)) \
                 and country is one of fr, de and company is set"
            )
        );
        assert_eq!(filter.to_json(), value);
        let through_serde: Filter = serde_json::from_value(value.clone()).expect("deserialises");
        assert_eq!(serde_json::to_value(&through_serde).expect("serialises"), value);
    }

    #[test]
    fn given_redundant_json_groups_when_read_then_they_are_normalised() {
        let value = json!({"all": [
            {"all": [{"field": "a", "op": "eq", "value": 1}, {"field": "b", "op": "eq", "value": 2}]},
            {"any": [{"field": "c", "op": "eq", "value": 3}]},
        ]});

        assert_eq!(from_json(&value).expect("valid"), parsed("a is 1 and b is 2 and c is 3"));
        let null_value = json!({"field": "a", "op": "exists", "value": null});
        assert_eq!(from_json(&null_value), Ok(condition("a", Op::Exists)), "exists tolerates a null value");
    }

    #[test]
    fn given_invalid_json_when_read_then_the_error_names_the_place() {
        let cases = [
            (
                json!("plan is pro"),
                "`filter`: expected an object such as {\"field\": \"plan\", \"op\": \"eq\", \"value\": \"pro\"}, {\"all\": [...]}, {\"any\": [...]} or {\"not\": ...}, found a string",
            ),
            (
                json!({}),
                "`filter`: expected exactly one of the keys all, any and not, or a condition with field and op",
            ),
            (
                json!({"all": [], "any": []}),
                "`filter`: expected exactly one of the keys all, any and not, or a condition with field and op",
            ),
            (
                json!({"every": []}),
                "`filter`: unknown key `every`; expected all, any, not, performed, opened, clicked, or a condition with field \
                 and op",
            ),
            (json!({"all": []}), "`filter.all`: needs at least one filter"),
            (json!({"any": {"field": "a"}}), "`filter.any`: expected an array of filters, found an object"),
            (
                json!({"all": [{"field": "a", "op": "equals", "value": 1}]}),
                "`filter.all[0].op`: unknown op `equals`; expected one of eq, ne, contains, starts_with, ends_with, gt, gte, lt, lte, exists, not_exists, in",
            ),
            (json!({"field": "", "op": "exists"}), "`filter.field`: a field path must not be empty"),
            (
                json!({"field": "a.", "op": "exists"}),
                "`filter.field`: the field path `a.` has an empty segment; separate names with single dots",
            ),
            (
                json!({"field": 3, "op": "exists"}),
                "`filter.field`: expected a string path such as \"address.country\", found a number",
            ),
            (json!({"op": "exists"}), "`filter`: a condition needs a field"),
            (
                json!({"field": "a", "op": "exists", "value": true}),
                "`filter.value`: `exists` takes no value, found a boolean",
            ),
            (
                json!({"field": "a"}),
                "`filter.op`: expected one of eq, ne, contains, starts_with, ends_with, gt, gte, lt, lte, exists, not_exists, in",
            ),
            (json!({"field": "a", "op": "eq"}), "`filter`: `eq` needs a value"),
            (
                json!({"field": "a", "op": "eq", "value": null}),
                "`filter.value`: expected a string, number or boolean, found null",
            ),
            (
                json!({"field": "a", "op": "eq", "value": [1]}),
                "`filter.value`: expected a string, number or boolean, found an array",
            ),
            (
                json!({"field": "a", "op": "in", "value": "x"}),
                "`filter.value`: `in` needs an array of values, found a string",
            ),
            (json!({"field": "a", "op": "in", "value": []}), "`filter`: `in` needs at least one value"),
            (
                json!({"field": "a", "op": "in", "value": [1, {}]}),
                "`filter.value[1]`: expected a string, number or boolean, found an object",
            ),
            (
                json!({"field": "a", "op": "starts_with", "value": 4}),
                "`filter.value`: `starts_with` needs a string, found a number",
            ),
            (
                json!({"field": "a", "op": "gt", "value": true}),
                "`filter`: a greater-than or less-than comparison needs a number or a date such as 2024-05-01, found `true`",
            ),
            (
                json!({"field": "a", "op": "eq", "value": 1, "note": "x"}),
                "`filter`: unknown key `note`; a condition has field, op and value",
            ),
        ];

        for (value, expected) in cases {
            assert_eq!(json_error(value.clone()), expected, "{value}");
        }
        let result: Result<Filter, _> = serde_json::from_value(json!({"all": []}));
        assert!(result.is_err(), "deserialising checks too");
    }

    #[test]
    fn given_json_beyond_the_limits_when_read_then_it_is_rejected() {
        let leaf = json!({"field": "a", "op": "exists"});
        let nested = |levels: usize| (1..levels).fold(leaf.clone(), |inner, _| json!({"not": inner}));
        assert!(from_json(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(
            json_error(nested(MAX_DEPTH + 1)),
            "`filter.not.not.not.not.not.not.not.not`: the filter nests deeper than 8 levels"
        );

        let many = |count: usize| json!({"any": vec![leaf.clone(); count]});
        assert!(from_json(&many(MAX_CONDITIONS)).is_ok());
        assert_eq!(json_error(many(MAX_CONDITIONS + 1)), "`filter.any[50]`: the filter has more than 50 conditions");

        let long_list = json!({"field": "a", "op": "in", "value": vec![1; MAX_LIST_VALUES + 1]});
        assert_eq!(json_error(long_list), "`filter`: `in` lists 101 values; at most 100 are allowed");
        let long_field = json!({"field": "a".repeat(MAX_FIELD_PATH_CHARS + 1), "op": "exists"});
        assert_eq!(json_error(long_field), "`filter.field`: the field path is longer than 200 characters");
        let long_value = json!({"field": "a", "op": "eq", "value": "x".repeat(MAX_VALUE_CHARS + 1)});
        assert_eq!(json_error(long_value), "`filter`: a value is longer than 1000 characters");
    }

    // Describing.

    #[test]
    fn given_a_filter_when_described_then_the_words_are_canonical() {
        assert_eq!(
            describe(&parsed("plan = pro AND email ends with '@acme.com' or age >= 30")),
            "(plan is pro and email ends with @acme.com) or age is at least 30"
        );
        assert_eq!(
            describe(&parsed("name does not contain \"test\" and tags is one of vip,'key account', 3")),
            "not (name contains test) and tags is one of vip, \"key account\", 3"
        );
        assert_eq!(describe(&parsed("code is '42' and flag is true")), "code is \"42\" and flag is true");
    }

    #[test]
    fn given_any_filter_when_described_and_parsed_again_then_it_is_the_same_filter() {
        let awkward_strings = [
            "",
            "and",
            "OR",
            "not",
            "null",
            "set",
            "true",
            "42",
            "-1.5",
            "Ada Lovelace",
            "say \"hi\"",
            "back\\slash",
            "(x)",
            "a,b",
            ">=",
            "!",
            "'quoted",
            "\"quoted",
            "O'Brien",
            "Zoë",
            "@acme.com",
            "2024-05-01T10:00:00Z",
            "tab\there",
        ];
        let mut filters = Vec::new();
        for awkward in awkward_strings {
            filters.push(condition("name", Op::Eq(text(awkward))));
            filters.push(condition("name", Op::StartsWith(awkward.to_owned())));
            filters.push(condition("name", Op::In(vec![text(awkward), text("plain")])));
            if !awkward.is_empty() && !awkward.contains(['\t']) {
                filters.push(condition(awkward, Op::Exists));
            }
        }
        for op in [
            Op::Eq(Scalar::Bool(false)),
            Op::Ne(number(-3)),
            Op::Contains(Scalar::Number(Number::from_f64(30.0).expect("finite"))),
            Op::EndsWith("x".to_owned()),
            Op::Gt(Scalar::Number(Number::from_f64(1e300).expect("finite"))),
            Op::Gte(text("2024-05-01")),
            Op::Lt(text("12")),
            Op::Lte(number(7)),
            Op::NotExists,
            Op::In(vec![number(1), Scalar::Bool(true), text("x y")]),
        ] {
            filters.push(condition("data.value", op));
        }
        let a = condition("a", Op::Eq(number(1)));
        let b = condition("b", Op::Ne(text("two")));
        let c = condition("c", Op::Exists);
        filters.push(Filter::All(vec![a.clone(), Filter::Any(vec![b.clone(), c.clone()])]));
        filters.push(Filter::Any(vec![Filter::All(vec![a.clone(), b.clone()]), c.clone()]));
        filters.push(Filter::Not(Box::new(Filter::Not(Box::new(a.clone())))));
        filters.push(Filter::Not(Box::new(Filter::All(vec![a.clone(), Filter::Not(Box::new(b.clone()))]))));
        filters.push(Filter::Any(vec![Filter::Not(Box::new(Filter::Any(vec![a, b]))), c]));

        for filter in filters {
            let description = describe(&filter);
            let again = parse_plain(&description).unwrap_or_else(|error| panic!("{description:?} parses: {error}"));
            assert_eq!(again, filter, "{description}");
            assert_eq!(from_json(&filter.to_json()).expect("its JSON is valid"), filter, "{description}");
        }
    }

    // Evaluation.

    fn contact() -> Value {
        json!({
            "email": "Ada@Acme.com",
            "plan": "Pro",
            "age": 36,
            "score": "0.75",
            "vip": true,
            "newsletter": "FALSE",
            "nickname": null,
            "tags": ["VIP", "beta", 3],
            "signed_up_at": "2024-05-01T10:00:00Z",
            "address": {"country": "fr", "city": "Paris"},
        })
    }

    fn holds(text: &str) -> bool {
        matches(&parsed(text), &contact())
    }

    #[test]
    fn given_the_decision_example_when_matched_then_case_is_ignored() {
        assert!(holds("plan is pro and email ends with @acme.com"));
        assert!(!holds("plan is pro and email ends with @example.com"));
        assert!(holds("email starts with ADA@ and email contains acme"));
        assert!(holds("plan is one of free, PRO"));
    }

    #[test]
    fn given_missing_or_null_fields_when_matched_then_only_absence_and_ne_hold() {
        for field in ["company", "nickname", "address.zip", "plan.name", "address.country.code"] {
            assert!(holds(&format!("{field} is not set")), "{field}");
            assert!(!holds(&format!("{field} is set")), "{field}");
            assert!(holds(&format!("{field} is not x")), "{field}: ne holds for a missing field");
            for comparison in ["is x", "contains x", "starts with x", "ends with x", "> 1", "< 1", "is one of x, y"] {
                assert!(!holds(&format!("{field} {comparison}")), "{field} {comparison}");
            }
        }
        assert!(holds("not (company > 1)"), "not negates the whole condition");
        assert!(holds("address.country is FR and address.city is set"), "a path walks nested objects");
    }

    #[test]
    fn given_numbers_when_matched_then_they_compare_numerically() {
        assert!(holds("age is 36 and age = 36.0 and age is \"36\""));
        assert!(holds("age > 30 and age >= 36 and age < 36.5 and age <= 36"));
        assert!(!holds("age > 36 or age < 36"));
        assert!(holds("score is greater than 0.5 and score < 1 and score = 0.75"), "a numeric string is a number");
        assert!(!holds("score is \"0.750\""), "two strings are equal only as text");
        assert!(holds("age > \"9\""), "a numeric string value compares as a number, not as text");
    }

    #[test]
    fn given_booleans_when_matched_then_they_equal_booleans_and_their_words() {
        assert!(holds("vip is true and vip is not false and vip is \"TRUE\""));
        assert!(holds("newsletter is false"));
    }

    #[test]
    fn given_arrays_when_matched_then_some_element_decides() {
        assert!(holds("tags contains vip and tags contains 3 and tags is beta"));
        assert!(!holds("tags contains vi"), "contains on an array compares whole elements");
        assert!(holds("tags starts with BE and tags > 2 and tags is one of x, 3"));
        assert!(!holds("tags is not beta"));
        assert!(holds("tags is not gamma"));
    }

    #[test]
    fn given_dates_when_matched_then_iso_strings_compare_as_text() {
        assert!(holds("signed_up_at > 2024-04-30 and signed_up_at < 2024-05-02"));
        assert!(holds("signed_up_at >= 2024-05-01"), "a date alone comes before every time of that day");
        assert!(!holds("signed_up_at <= 2024-05-01"));
        assert!(holds("signed_up_at < 2024-05-01T10:00:01Z"));
        assert!(!holds("email > 2024-01-01"), "a string that is not a date never satisfies an ordering");
    }

    #[test]
    fn given_a_document_that_is_not_an_object_when_matched_then_every_field_is_missing() {
        let filter = parsed("plan is not set and plan is not pro");
        assert!(matches(&filter, &json!("text")));
        assert!(matches(&filter, &Value::Null));
    }

    #[test]
    fn given_contains_on_a_string_when_matched_then_it_is_a_case_insensitive_substring() {
        assert!(holds("address.city contains AR"));
        assert!(!holds("age contains 3"), "contains applies to strings and arrays only");
        assert!(matches(&parsed("title contains 101"), &json!({"title": "Room 101"})));
    }

    // Contact facts: events performed, subscriptions, consent.

    fn performed(event: &str, at_least: u32, within_seconds: Option<u64>) -> Filter {
        Filter::Performed(Performed { event: event.to_owned(), at_least, within_seconds })
    }

    #[test]
    fn given_performed_phrases_when_parsed_then_each_gives_its_count_and_window() {
        let cases = [
            ("performed purchase", performed("purchase", 1, None)),
            ("has performed purchase", performed("purchase", 1, None)),
            ("performed purchase in the last 30 days", performed("purchase", 1, Some(30 * 86_400))),
            ("performed purchase within 2 hours", performed("purchase", 1, Some(7_200))),
            ("performed purchase within the last 1 week", performed("purchase", 1, Some(604_800))),
            ("performed purchase at least 3 times in the last 5 seconds", performed("purchase", 3, Some(5))),
            ("performed 'page viewed' at least 1 time", performed("page viewed", 1, None)),
            (
                "did not perform purchase in the last 1 day",
                Filter::Not(Box::new(performed("purchase", 1, Some(86_400)))),
            ),
            ("has not performed purchase", Filter::Not(Box::new(performed("purchase", 1, None)))),
        ];
        for (text, expected) in cases {
            assert_eq!(parsed(text), expected, "{text}");
        }
        assert_eq!(parsed("performed is true"), condition("performed", Op::Eq(Scalar::Bool(true))), "still a field");
        assert!(parse_error("performed purchase in the last 3 fortnights").contains("a unit"));
        assert!(parse_error("performed purchase at least 0 times").contains("whole number"));
        assert!(parse_error("performed purchase at least 2").contains("`times`"));
    }

    #[test]
    fn given_subscription_and_consent_phrases_when_parsed_then_they_read_the_contact_fields() {
        assert_eq!(
            parsed("subscribed to newsletter"),
            condition("subscriptions.newsletter", Op::Eq(text("subscribed")))
        );
        assert_eq!(
            parsed("not subscribed to newsletter"),
            Filter::Not(Box::new(condition("subscriptions.newsletter", Op::Eq(text("subscribed")))))
        );
        assert_eq!(parsed("has email consent"), condition("consent.email", Op::Eq(Scalar::Bool(true))));
        assert_eq!(
            parsed("has no email consent"),
            Filter::Not(Box::new(condition("consent.email", Op::Eq(Scalar::Bool(true)))))
        );
        assert!(parse_error("subscribed to").contains("a topic"));
    }

    #[test]
    fn given_contact_facts_when_described_then_they_read_back_the_same() {
        for text in [
            "performed purchase at least 2 times in the last 30 days and subscribed to newsletter",
            "has email consent or not (performed \"page viewed\" in the last 90 minutes)",
            "performed \"in\" in the last 7 seconds",
        ] {
            let filter = parsed(text);
            let described = describe(&filter);
            assert_eq!(parsed(&described), filter, "{text} -> {described}");
            assert_eq!(from_json(&filter.to_json()).expect("the JSON form reads back"), filter);
        }
        assert_eq!(
            describe(&parsed("performed purchase within 48 hours")),
            "performed purchase in the last 2 days",
            "the largest whole unit"
        );
    }

    #[test]
    fn given_the_json_form_of_performed_when_invalid_then_it_is_refused_with_the_path() {
        assert!(json_error(json!({"performed": {"event": "p", "atLeast": 0}})).contains("filter.performed"));
        assert!(json_error(json!({"performed": {"event": "p", "withinSeconds": -1}})).contains("withinSeconds"));
        assert!(json_error(json!({"performed": {"event": ""}})).contains("name of an event"));
        assert!(json_error(json!({"performed": {"event": "p", "extra": 1}})).contains("unknown key"));
        assert_eq!(from_json(&json!({"performed": {"event": "p"}})).expect("defaults"), performed("p", 1, None));
    }

    #[test]
    fn given_events_when_evaluated_at_a_time_then_only_the_window_counts_and_the_next_change_is_when_one_leaves() {
        let filter = parsed("performed purchase at least 2 times in the last 10 seconds");
        let events = std::collections::HashMap::from([("purchase".to_owned(), vec![1_000, 5_000, 20_000])]);
        let document = json!({});
        let at = |now_ms| Facts { document: &document, events: &events, engagement: &[], now_ms };
        assert!(matches_facts(&filter, &at(6_000)), "1 s and 5 s are inside (−4 s, 6 s]");
        assert_eq!(next_change_ms(&filter, &at(6_000)), Some(11_000), "1 s leaves at 11 s");
        assert!(!matches_facts(&filter, &at(11_000)), "at 11 s only 5 s is inside");
        assert_eq!(next_change_ms(&filter, &at(11_000)), Some(15_000));
        assert!(!matches_facts(&filter, &at(19_999)));
        assert!(!matches_facts(&filter, &at(20_000)), "20 s is inside but 5 s left at 15 s");
        assert!(!matches(&filter, &document), "a document alone has no events");
        let ever = parsed("performed purchase");
        assert!(matches_facts(&ever, &at(2_000)));
        assert!(!matches_facts(&ever, &at(500)), "an occurrence dated later does not count yet");
        assert_eq!(next_change_ms(&ever, &at(500)), Some(1_000), "it enters when its time comes");
        assert_eq!(next_change_ms(&ever, &at(30_000)), None);
    }

    #[test]
    fn given_a_filter_when_rewritten_then_each_leaf_is_replaced_and_errors_stop_it() {
        let filter = parsed("performed purchase and (plan is pro or subscribed to news)");
        let renamed = rewrite(filter.clone(), &mut |leaf| {
            Ok::<_, ()>(match leaf {
                Filter::Performed(mut performed) => {
                    performed.event = "sch_1".into();
                    Filter::Performed(performed)
                }
                other => other,
            })
        })
        .expect("no error");
        assert_eq!(performed_parts(&renamed)[0].event, "sch_1");
        assert_eq!(rewrite(filter, &mut |_| Err::<Filter, _>("nope")), Err("nope"));
    }
}
