//! The tests of reading plain words.

use serde_json::Number;

use crate::tests::{condition, number, parsed, performed, text};
use crate::{Filter, MAX_CONDITIONS, MAX_DEPTH, Op, Scalar, parse_plain};

fn parse_error(text: &str) -> String {
    match parse_plain(text) {
        Ok(filter) => panic!("{text:?} should not parse, got {filter:?}"),
        Err(error) => error.message().to_owned(),
    }
}

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
    assert_eq!(parsed("x is -2.5"), condition("x", Op::Eq(Scalar::Number(Number::from_f64(-2.5).expect("finite")))));
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
        ("a..b is 1", "the field path `a..b` has an empty segment; separate names with single dots (at character 1)"),
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
            Filter::Any(vec![condition("plan", Op::Eq(text("pro"))), condition("plan", Op::Eq(text("enterprise")))]),
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
    assert_eq!(parsed("country is one of fr, de, and plan is pro"), parsed("country is one of fr, de, plan is pro"));
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
            Filter::Any(vec![condition("Plan", Op::Eq(text("pro"))), condition("Plan", Op::Eq(text("Enterprise")))]),
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

// Contact facts: events performed, subscriptions, consent.

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
        ("did not perform purchase in the last 1 day", Filter::Not(Box::new(performed("purchase", 1, Some(86_400))))),
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
    assert_eq!(parsed("subscribed to newsletter"), condition("subscriptions.newsletter", Op::Eq(text("subscribed"))));
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
