//! The tests through the public entry points that cross phases (words to filter to words,
//! JSON and back, evaluation at a time, rewriting), and the helpers the phases' tests share.

use serde_json::{Number, json};

use crate::{
    Condition, Facts, FieldPath, Filter, Op, Performed, Scalar, describe, from_json, matches, matches_facts,
    next_change_ms, parse_plain, performed_parts, rewrite,
};

pub(crate) fn condition(field: &str, op: Op) -> Filter {
    Filter::Condition(Condition { field: FieldPath::parse(field).expect("a valid field path"), op })
}

pub(crate) fn text(value: &str) -> Scalar {
    Scalar::String(value.to_owned())
}

pub(crate) fn number(value: i64) -> Scalar {
    Scalar::Number(value.into())
}

pub(crate) fn parsed(text: &str) -> Filter {
    parse_plain(text).unwrap_or_else(|error| panic!("{text:?} should parse: {error}"))
}

pub(crate) fn performed(event: &str, at_least: u32, within_seconds: Option<u64>) -> Filter {
    Filter::Performed(Performed { event: event.to_owned(), at_least, within_seconds })
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
