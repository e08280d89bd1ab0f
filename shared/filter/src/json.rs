//! Reading the JSON form of a filter (see the crate documentation, "JSON form"), with the
//! path of each refusal.

use serde_json::{Map, Value};

use crate::checks::{checked_op, checked_performed};
use crate::{
    Action, Condition, Engaged, FieldPath, Filter, FilterError, MAX_AT_LEAST, MAX_CONDITIONS, MAX_DEPTH,
    MAX_WINDOW_SECONDS, Op, Performed, Scalar, Source, all_of, any_of, engaged,
};

pub(crate) fn read_expression(
    value: &Value,
    at: &str,
    depth: usize,
    conditions: &mut usize,
) -> Result<Filter, FilterError> {
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
            read_engaged(action, inner, &format!("{at}.{key}")).map(Filter::Engaged)
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

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Reads the JSON form `{"opened": {...}}` or `{"clicked": {...}}` (the inner object).
fn read_engaged(action: Action, value: &Value, at: &str) -> Result<Engaged, FilterError> {
    let Value::Object(object) = value else {
        return Err(FilterError::new(format!(
            "`{at}`: expected an object such as {{\"from\": {{\"broadcast\": \"spring-sale\"}}, \"withinSeconds\": \
             604800}}, found {}",
            json_kind(value)
        )));
    };
    let allowed: &[&str] = match action {
        Action::Opened => &["from", "withinSeconds", "includeMachines"],
        Action::Clicked => &["from", "linkContains", "withinSeconds", "includeMachines"],
    };
    if let Some(unknown) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
        return Err(FilterError::new(format!("`{at}`: unknown key `{unknown}`; expected {}", allowed.join(", "))));
    }
    let source = match object.get("from") {
        None | Some(Value::Null) => Source::Any,
        Some(from) => read_source(from, &format!("{at}.from"))?,
    };
    let link_contains = match object.get("linkContains") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(_) => return Err(FilterError::new(format!("`{at}.linkContains`: expected text"))),
    };
    let within_seconds = match object.get("withinSeconds") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_u64().ok_or_else(|| {
            FilterError::new(format!("`{at}.withinSeconds`: expected a whole number from 1 to {MAX_WINDOW_SECONDS}"))
        })?),
    };
    let machines = match object.get("includeMachines") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(flag)) => *flag,
        Some(_) => return Err(FilterError::new(format!("`{at}.includeMachines`: expected true or false"))),
    };
    engaged::checked(Engaged { action, source, link_contains, within_seconds, machines })
        .map_err(|message| FilterError::new(format!("`{at}`: {message}")))
}

fn read_source(value: &Value, at: &str) -> Result<Source, FilterError> {
    let expected = || {
        FilterError::new(format!(
            "`{at}`: expected one of {{\"broadcast\": <id>}}, {{\"template\": <id>}}, {{\"workflow\": <id>}} or \
             {{\"workflow\": <id>, \"step\": <id>}}"
        ))
    };
    let Value::Object(object) = value else { return Err(expected()) };
    let text = |key: &str| match object.get(key) {
        Some(Value::String(text)) => Ok(Some(text.clone())),
        None => Ok(None),
        Some(_) => Err(FilterError::new(format!("`{at}.{key}`: expected text"))),
    };
    let keys: Vec<&str> = object.keys().map(String::as_str).collect();
    match keys.as_slice() {
        ["broadcast"] => Ok(Source::Broadcast(text("broadcast")?.unwrap_or_default())),
        ["template"] => Ok(Source::Template(text("template")?.unwrap_or_default())),
        ["workflow"] => Ok(Source::Workflow { workflow: text("workflow")?.unwrap_or_default(), step: None }),
        ["step", "workflow"] | ["workflow", "step"] => {
            Ok(Source::Workflow { workflow: text("workflow")?.unwrap_or_default(), step: text("step")? })
        }
        _ => Err(expected()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::tests::{condition, parsed, performed};
    use crate::{
        Filter, MAX_CONDITIONS, MAX_DEPTH, MAX_FIELD_PATH_CHARS, MAX_LIST_VALUES, MAX_VALUE_CHARS, Op, from_json,
    };

    fn json_error(value: Value) -> String {
        match from_json(&value) {
            Ok(filter) => panic!("{value} should be rejected, got {filter:?}"),
            Err(error) => error.message().to_owned(),
        }
    }

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

    #[test]
    fn given_the_json_form_of_performed_when_invalid_then_it_is_refused_with_the_path() {
        assert!(json_error(json!({"performed": {"event": "p", "atLeast": 0}})).contains("filter.performed"));
        assert!(json_error(json!({"performed": {"event": "p", "withinSeconds": -1}})).contains("withinSeconds"));
        assert!(json_error(json!({"performed": {"event": ""}})).contains("name of an event"));
        assert!(json_error(json!({"performed": {"event": "p", "extra": 1}})).contains("unknown key"));
        assert_eq!(from_json(&json!({"performed": {"event": "p"}})).expect("defaults"), performed("p", 1, None));
    }
}
