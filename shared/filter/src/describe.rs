//! Plain words written back: the canonical words of a filter, which the parser reads back to
//! an equal filter.

use crate::ast::number_in_text;
use crate::lexer::is_word_char;
use crate::{
    Action, CONSENT_EMAIL, Condition, Engaged, Filter, Op, Performed, SUBSCRIBED, SUBSCRIPTIONS, Scalar, Source,
    describe,
};

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

pub(crate) fn describe_part(part: &Filter) -> String {
    match part {
        Filter::All(_) | Filter::Any(_) => format!("({})", describe(part)),
        _ => describe(part),
    }
}

pub(crate) fn describe_performed(performed: &Performed) -> String {
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
pub(crate) fn window_words(seconds: u64) -> String {
    // Whole weeks from two on (`7 days` reads better than `1 week`), else the largest unit.
    let (size, unit) = [(604_800, "weeks"), (86_400, "days"), (3_600, "hours"), (60, "minutes")]
        .into_iter()
        .find(|(size, unit)| seconds.is_multiple_of(*size) && (*unit != "weeks" || seconds / size >= 2))
        .unwrap_or((1, "seconds"));
    let count = seconds / size;
    let unit = if count == 1 { unit.trim_end_matches('s') } else { unit };
    format!(" in the last {count} {unit}")
}

pub(crate) fn describe_condition(condition: &Condition) -> String {
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
pub(crate) fn comparison_words(op: &Op, negated: bool) -> &'static str {
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
pub(crate) fn value_words(op: &Op) -> Option<String> {
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

pub(crate) fn describe_scalar(value: &Scalar) -> String {
    match value {
        Scalar::String(text) => plain_text(text),
        Scalar::Number(number) => number.to_string(),
        Scalar::Bool(flag) => flag.to_string(),
    }
}

/// `text` bare when the parser reads it back as the same string, quoted otherwise.
pub(crate) fn plain_text(text: &str) -> String {
    let needs_quotes = text.is_empty()
        || text.starts_with(['"', '\''])
        || text.chars().any(|character| !is_word_char(character) || character.is_control())
        || RESERVED_WORDS.iter().any(|word| word.eq_ignore_ascii_case(text))
        || number_in_text(text).is_some();
    if needs_quotes { format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\"")) } else { text.to_owned() }
}

impl Engaged {
    /// The plain words of an engagement fact.
    pub(crate) fn describe(&self) -> String {
        let source = match &self.source {
            Source::Any => String::new(),
            Source::Broadcast(id) => format!(" from broadcast {}", plain_text(id)),
            Source::Template(id) => format!(" from template {}", plain_text(id)),
            Source::Workflow { workflow, step: None } => format!(" from workflow {}", plain_text(workflow)),
            Source::Workflow { workflow, step: Some(step) } => {
                format!(" from step {} of workflow {}", plain_text(step), plain_text(workflow))
            }
        };
        let mut words = match self.action {
            Action::Opened => format!("opened an email{source}"),
            Action::Clicked => {
                let mut words = "clicked a link".to_owned();
                if let Some(text) = &self.link_contains {
                    words.push_str(&format!(" containing {}", plain_text(text)));
                }
                if !source.is_empty() {
                    words.push_str(&format!(" in an email{source}"));
                }
                words
            }
        };
        if let Some(seconds) = self.within_seconds {
            words.push_str(&window_words(seconds));
        }
        if self.machines {
            words.push_str(" including machines");
        }
        words
    }
}

#[cfg(test)]
mod tests {
    use crate::describe;
    use crate::tests::parsed;

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
}
