//! The checks of what the types leave open: the limits of a whole filter, string lengths, the
//! values an ordering can compare, the size of an `in` list and a `performed`'s count and window.

use crate::ast::number_in_text;
use crate::describe::describe_scalar;
use crate::eval::looks_like_date;
use crate::{
    Filter, FilterError, MAX_AT_LEAST, MAX_CONDITIONS, MAX_DEPTH, MAX_FIELD_PATH_CHARS, MAX_LIST_VALUES,
    MAX_VALUE_CHARS, MAX_WINDOW_SECONDS, Op, Performed, Scalar,
};

pub(crate) fn check_limits(filter: &Filter) -> Result<(), FilterError> {
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
pub(crate) fn checked_op(op: Op) -> Result<Op, String> {
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

/// Checks a `performed`: an event name that is a valid field-like name, a positive count and a
/// window within bounds.
pub(crate) fn checked_performed(performed: Performed) -> Result<Performed, String> {
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
