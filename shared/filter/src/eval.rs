//! Evaluation: whether a condition holds for a document, and when a `performed` occurrence
//! counts.

use std::cmp::Ordering;

use serde_json::{Number, Value};

use crate::ast::number_in_text;
use crate::{Condition, FieldPath, Op, Performed, Scalar};

impl Performed {
    pub(crate) fn window_ms(&self) -> Option<i64> {
        self.within_seconds.map(|seconds| i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX))
    }

    /// Whether an occurrence at `time` counts at `now`.
    pub(crate) fn counts(&self, time: i64, now: i64) -> bool {
        time <= now && self.window_ms().is_none_or(|window| time > now.saturating_sub(window))
    }
}

pub(crate) fn condition_matches(condition: &Condition, document: &Value) -> bool {
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
pub(crate) fn looks_like_date(text: &str) -> bool {
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
    use serde_json::{Value, json};

    use crate::matches;
    use crate::tests::parsed;

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
}
