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
//! are recorded but flagged as a machine's (see the projector's engagement worker, "Engagement"). Names are
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

mod ast;
mod checks;
mod describe;
mod engaged;
mod error;
mod eval;
mod json;
mod lexer;
mod parser;

pub use ast::{Condition, Facts, FieldPath, Filter, Op, Performed, Scalar};
pub use engaged::{Action, Engaged, Engagement, Source};
pub use error::FilterError;
use serde_json::Value;

use crate::checks::check_limits;
use crate::describe::{describe_condition, describe_part, describe_performed};
use crate::eval::condition_matches;
use crate::json::read_expression;
use crate::lexer::{TokenKind, tokenize};
use crate::parser::Parser;

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

/// The root of the fields holding a contact's topic subscriptions: `subscriptions.<topic>` is
/// `subscribed`, `pending` or `unsubscribed` (`subscribed to <topic>` reads as the first).
pub const SUBSCRIPTIONS: &str = "subscriptions";
/// The subscription state `subscribed to` asks for.
pub(crate) const SUBSCRIBED: &str = "subscribed";
/// The field `has email consent` reads (`consent.email is true`).
pub const CONSENT_EMAIL: &str = "consent.email";

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

#[cfg(test)]
mod tests;
