//! Given the facts, when the send is decided, then: one test per gate, their order, and the
//! policy's outcomes.

use super::policy::{Cap, QuietHours, Window, ZoneRule};
use super::*;

const NOW: i64 = 1_780_000_000_000; // 2026-05-28T20:26:40Z
const HOUR: i64 = 3_600_000;

fn consenting<'a>() -> Contact<'a> {
    Contact {
        address: Some("ada@example.test"),
        suppressed: false,
        consent: Some(true),
        subscription: Some("subscribed"),
        zone: None,
        sent: &[],
    }
}

fn marketing<'a>(contact: Option<Contact<'a>>, policy: Option<&'a SendPolicy>) -> Facts<'a> {
    Facts { kind: Kind::Marketing, topic_id: Some("top_news"), contact, policy, allowance_refused: false, now_ms: NOW }
}

fn transactional(contact: Option<Contact<'_>>) -> Facts<'_> {
    Facts { kind: Kind::Transactional, topic_id: None, ..marketing(contact, None) }
}

fn skipped(gate: Gate) -> Verdict {
    Verdict::Skip { gate, decided_by: None }
}

fn utc_policy() -> SendPolicy {
    SendPolicy {
        time_zone: ZoneRule { attribute: Some("timeZone".into()), default: "UTC".into() },
        quiet_hours: None,
        frequency_caps: Vec::new(),
    }
}

fn sent(at_ms: i64, position: i64) -> Sent {
    Sent { at_ms, topic_id: Some("top_news".into()), position, seq: position }
}

#[test]
fn given_a_consenting_subscribed_contact_when_decided_then_it_is_sent() {
    assert_eq!(decide(&marketing(Some(consenting()), None)), Verdict::Send);
    assert_eq!(decide(&transactional(Some(consenting()))), Verdict::Send);
}

#[test]
fn given_a_contact_gone_or_without_address_when_decided_then_it_is_skipped_whatever_the_kind() {
    for facts in [marketing(None, None), transactional(None)] {
        assert_eq!(decide(&facts), skipped(Gate::Gone));
    }
    for address in [None, Some("")] {
        let contact = Contact { address, ..consenting() };
        assert_eq!(decide(&transactional(Some(contact))), skipped(Gate::NoAddress));
    }
}

#[test]
fn given_a_suppressed_address_when_decided_then_every_kind_is_skipped_before_any_other_gate() {
    let suppressed = Contact { suppressed: true, consent: Some(false), subscription: None, ..consenting() };
    assert_eq!(decide(&transactional(Some(suppressed.clone()))), skipped(Gate::Suppressed));
    assert_eq!(decide(&marketing(Some(suppressed), None)), skipped(Gate::Suppressed), "before consent");
}

#[test]
fn given_consent_not_given_when_decided_then_marketing_is_skipped_and_transactional_sent() {
    for consent in [None, Some(false)] {
        let contact = Contact { consent, subscription: None, ..consenting() };
        assert_eq!(
            decide(&marketing(Some(contact.clone()), None)),
            skipped(Gate::Consent),
            "{consent:?}, before topic"
        );
        assert_eq!(decide(&transactional(Some(contact))), Verdict::Send);
    }
}

#[test]
fn given_a_topic_when_the_contact_is_not_subscribed_then_marketing_is_skipped_by_the_topic() {
    for subscription in [None, Some("pending"), Some("unsubscribed")] {
        let contact = Contact { subscription, ..consenting() };
        assert_eq!(decide(&marketing(Some(contact.clone()), None)), skipped(Gate::Topic), "{subscription:?}");
        let no_topic = Facts { topic_id: None, ..marketing(Some(contact), None) };
        assert_eq!(decide(&no_topic), Verdict::Send, "a template without a topic asks consent only");
    }
}

#[test]
fn given_the_allowance_refused_the_append_when_decided_again_then_it_is_skipped_by_the_allowance() {
    let facts = Facts { allowance_refused: true, ..marketing(Some(consenting()), None) };
    assert_eq!(decide(&facts), skipped(Gate::Allowance));
    let suppressed =
        Facts { allowance_refused: true, ..transactional(Some(Contact { suppressed: true, ..consenting() })) };
    assert_eq!(decide(&suppressed), skipped(Gate::Suppressed), "the recipient's gates come first");
}

#[test]
fn given_quiet_hours_and_the_allowance_refused_the_append_when_decided_again_then_it_is_skipped_not_held() {
    // 20:26 UTC; quiet 20:00-08:00 UTC: the send would be held, and a held email counts
    // against the allowance when it is stored.
    let mut policy = utc_policy();
    policy.quiet_hours = Some(QuietHours { from_minute: 20 * 60, to_minute: 8 * 60, outcome: Outcome::Hold });
    assert!(matches!(decide(&marketing(Some(consenting()), Some(&policy))), Verdict::Hold { .. }));
    let refused = Facts { allowance_refused: true, ..marketing(Some(consenting()), Some(&policy)) };
    assert_eq!(decide(&refused), skipped(Gate::Allowance));
}

#[test]
fn given_quiet_hours_when_a_marketing_send_falls_in_them_then_it_is_held_to_their_end_or_skipped() {
    // 20:26 UTC; quiet 20:00-08:00 UTC.
    let mut policy = utc_policy();
    policy.quiet_hours = Some(QuietHours { from_minute: 20 * 60, to_minute: 8 * 60, outcome: Outcome::Hold });
    let verdict = decide(&marketing(Some(consenting()), Some(&policy)));
    let next_morning = 1_780_041_600_000; // 2026-05-29T08:00:00Z
    assert_eq!(verdict, Verdict::Hold { until_ms: next_morning, gate: Gate::QuietHours });
    assert_eq!(decide(&transactional(Some(consenting()))), Verdict::Send, "transactional mail is exempt");
    let mut skipping = policy.clone();
    skipping.quiet_hours = Some(QuietHours { outcome: Outcome::Skip, ..policy.quiet_hours.clone().expect("set") });
    assert_eq!(decide(&marketing(Some(consenting()), Some(&skipping))), skipped(Gate::QuietHours));
    let unconsented = Contact { consent: Some(false), ..consenting() };
    assert_eq!(decide(&marketing(Some(unconsented), Some(&policy))), skipped(Gate::Consent), "consent first");
}

#[test]
fn given_the_recipients_zone_when_it_is_morning_there_then_quiet_hours_do_not_hold_it() {
    let mut policy = utc_policy();
    policy.quiet_hours = Some(QuietHours { from_minute: 20 * 60, to_minute: 8 * 60, outcome: Outcome::Hold });
    // 20:26 UTC is 06:26 in Sydney (quiet) and 16:26 in New York (not).
    let new_york = Contact { zone: Some("America/New_York"), ..consenting() };
    assert_eq!(decide(&marketing(Some(new_york), Some(&policy))), Verdict::Send);
    let sydney = Contact { zone: Some("Australia/Sydney"), ..consenting() };
    let sydney_eight = 1_780_005_600_000; // 2026-05-28T22:00:00Z = 08:00 AEST
    assert_eq!(
        decide(&marketing(Some(sydney), Some(&policy))),
        Verdict::Hold { until_ms: sydney_eight, gate: Gate::QuietHours }
    );
    let nonsense = Contact { zone: Some("Mars/Olympus"), ..consenting() };
    assert!(matches!(decide(&marketing(Some(nonsense), Some(&policy))), Verdict::Hold { .. }), "the default zone");
}

#[test]
fn given_a_cap_when_it_is_reached_then_the_send_is_skipped_naming_the_send_that_filled_it_or_held() {
    let mut policy = utc_policy();
    policy.frequency_caps = vec![Cap { max: 2, window: Window::Hours(24), topic_id: None, outcome: Outcome::Skip }];
    let two = [sent(NOW - 20 * HOUR, 7), sent(NOW - HOUR, 9)];
    let capped = Contact { sent: &two, ..consenting() };
    assert_eq!(
        decide(&marketing(Some(capped.clone()), Some(&policy))),
        Verdict::Skip { gate: Gate::FrequencyCap, decided_by: Some(9) }
    );
    let one = [sent(NOW - 25 * HOUR, 7), sent(NOW - HOUR, 9)];
    let under = Contact { sent: &one, ..consenting() };
    assert_eq!(decide(&marketing(Some(under), Some(&policy))), Verdict::Send, "one send left the window");
    policy.frequency_caps[0].outcome = Outcome::Hold;
    assert_eq!(
        decide(&marketing(Some(capped.clone()), Some(&policy))),
        Verdict::Hold { until_ms: NOW + 4 * HOUR, gate: Gate::FrequencyCap },
        "until the older send leaves the window"
    );
    assert_eq!(decide(&transactional(Some(capped))), Verdict::Send, "transactional mail is exempt");
}

#[test]
fn given_a_topic_cap_when_other_topics_were_sent_then_they_do_not_count() {
    let mut policy = utc_policy();
    policy.frequency_caps =
        vec![Cap { max: 1, window: Window::Days(7), topic_id: Some("top_news".into()), outcome: Outcome::Skip }];
    let other = [Sent { at_ms: NOW - HOUR, topic_id: Some("top_offers".into()), position: 3, seq: 3 }];
    assert_eq!(decide(&marketing(Some(Contact { sent: &other, ..consenting() }), Some(&policy))), Verdict::Send);
    let news = [sent(NOW - HOUR, 4)];
    assert_eq!(
        decide(&marketing(Some(Contact { sent: &news, ..consenting() }), Some(&policy))),
        Verdict::Skip { gate: Gate::FrequencyCap, decided_by: Some(4) }
    );
}

#[test]
fn given_a_held_cap_that_frees_in_quiet_hours_when_decided_then_it_is_held_to_the_end_of_them() {
    let mut policy = utc_policy();
    policy.quiet_hours = Some(QuietHours { from_minute: 22 * 60, to_minute: 7 * 60, outcome: Outcome::Skip });
    policy.frequency_caps = vec![Cap { max: 1, window: Window::Hours(3), topic_id: None, outcome: Outcome::Hold }];
    // Sent at 19:26; the cap frees at 22:26, in the quiet hours: held to 07:00 the next day.
    let one = [sent(NOW - HOUR, 2)];
    let verdict = decide(&marketing(Some(Contact { sent: &one, ..consenting() }), Some(&policy)));
    assert_eq!(verdict, Verdict::Hold { until_ms: 1_780_038_000_000, gate: Gate::FrequencyCap });
    let skip_cap = SendPolicy {
        frequency_caps: vec![Cap { outcome: Outcome::Skip, ..policy.frequency_caps[0].clone() }],
        ..policy
    };
    assert_eq!(
        decide(&marketing(Some(Contact { sent: &one, ..consenting() }), Some(&skip_cap))),
        Verdict::Skip { gate: Gate::FrequencyCap, decided_by: Some(2) },
        "a skipping cap wins over any hold"
    );
}

#[test]
fn every_gate_has_a_name_that_parses_back_a_code_and_a_reason() {
    for gate in Gate::ALL {
        assert_eq!(Gate::parse(gate.as_str()), Some(gate));
        assert!(!gate.reason().is_empty());
    }
    assert_eq!(Gate::FrequencyCap.code(), Code::FrequencyCapped);
    assert_eq!(Gate::QuietHours.code(), Code::QuietHours);
    assert_eq!(Gate::Topic.code(), Code::RecipientNotSubscribed);
}

#[test]
fn email_consent_is_given_only_when_every_consent_attribute_is_true() {
    let values = serde_json::json!({"news": true, "offers": false});
    let value_of = |key: &str| values.get(key);
    assert_eq!(email_consent(&[], value_of), None, "a schema without consent attributes");
    assert_eq!(email_consent(&["news".into()], value_of), Some(true));
    assert_eq!(email_consent(&["news".into(), "offers".into()], value_of), Some(false));
    assert_eq!(email_consent(&["unset".into()], value_of), Some(false));
}

/// Every path that sends asks this decision, and no other code decides a gate: no consent
/// computed from its attributes, no gate function or verdict of its own.
#[test]
fn every_send_path_asks_the_decision_and_none_decides_a_gate_of_its_own() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for path in [
        "command-service/src/templates/decide.rs",
        "command-service/src/forms/decide.rs",
        "projector/src/workers/broadcasts/decide.rs",
        "shared/journeys/src/decide/steps/send_email.rs",
    ] {
        let source = std::fs::read_to_string(root.join(path)).expect("a send path");
        assert!(source.contains("send::decide("), "{path} does not ask the send decision");
    }
    let forbidden = ["consent_keys.iter().all(", "fn gate(", "struct Recipient {"];
    let mut stack = vec![root.join("command-service/src"), root.join("projector/src"), root.join("shared")];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).expect("a folder") {
            let path = entry.expect("an entry").path();
            let name = path.to_string_lossy().replace('\\', "/");
            if name.ends_with("email/send") || name.ends_with("/target") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if !name.ends_with(".rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("a source file");
            // Tests may spell out what they check.
            let code = source.split("#[cfg(test)]").next().unwrap_or_default();
            for word in forbidden {
                assert!(!code.contains(word), "{name} decides a gate of its own ({word})");
            }
        }
    }
}
