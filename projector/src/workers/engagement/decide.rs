//! The `engagement` worker's decision (pure): each hit taken in, in order, against its email's
//! history, as the email's `EmailOpened` or `EmailClicked`, the first of its kind or not, a
//! person's or a machine's (`domain::engagement::history`). Ids, keys and the clock are not
//! its business: a click's target comes opened, the contacts that still have a data key come
//! named, and a click's link leaves sealed in the clear, for the shell to encrypt under the
//! contact's key.

use std::collections::{BTreeMap, HashSet};

use domain::engagement::Actor;
use domain::engagement::history::{self, History};
use platform::error::Code;
use platform::events::LogEvent;
use platform::ids::{ContactId, EmailId, SpaceId};
use platform::log::{AppendError, Guard, NewEvent, SetValue};
use platform::proto;

/// A row of `engagement_inbox`, as the decision reads it.
pub(super) struct Hit {
    pub id: i64,
    pub email_id: EmailId,
    pub taken: Taken,
    /// The signal the request gave at the take-in (`""`: none, a person's so far).
    pub signal: String,
    pub at_ms: i64,
}

/// What a hit was.
pub(super) enum Taken {
    Open,
    /// A click on link `link_id`, the `position`th tracked link of its email (0: unknown);
    /// `url` is its target, `None` when the sealed target could not be opened (a master key
    /// replaced meanwhile).
    Click {
        link_id: String,
        url: Option<String>,
        position: u32,
    },
}

/// One email's append: its events at the stream's version read, each with the deletion of its
/// row as a guard, and what each adds to the engagement counter (kind, signal).
pub(super) struct EmailAppend {
    pub email_id: EmailId,
    pub space_id: SpaceId,
    pub contact_id: ContactId,
    pub version: i64,
    /// A click's link is sealed in the clear: the shell encrypts it under the contact's key.
    pub events: Vec<NewEvent>,
    pub guards: Vec<Guard>,
    pub counted: Vec<(&'static str, &'static str)>,
}

/// What a step decided.
#[derive(Default)]
pub(super) struct Decided {
    pub appends: Vec<EmailAppend>,
    /// Rows deleted without an event: of an unknown email, of an erased contact, or a click
    /// whose target cannot be opened.
    pub dropped: Vec<i64>,
    /// The clicks among `dropped` whose target could not be opened (row, email), to report.
    pub unreadable: Vec<(i64, String)>,
    /// Each decided email's history with its new events, to keep once its append commits.
    pub histories: Vec<(String, History)>,
}

/// Decides `hits` in order against their emails' `histories` (an email without one is not
/// known: its rows are dropped); `keyed` names the contacts that still have a data key (the
/// rows of any other are dropped: the contact was erased).
pub(super) fn decide(hits: Vec<Hit>, mut histories: BTreeMap<String, History>, keyed: &HashSet<String>) -> Decided {
    let mut by_email: BTreeMap<String, Vec<Hit>> = BTreeMap::new();
    for hit in hits {
        by_email.entry(hit.email_id.clone().into()).or_default().push(hit);
    }
    let mut decided = Decided::default();
    for (email_id, hits) in by_email {
        let Some(mut history) = histories.remove(&email_id) else {
            decided.dropped.extend(hits.iter().map(|hit| hit.id));
            continue;
        };
        if !keyed.contains(&history.contact_id) {
            decided.dropped.extend(hits.iter().map(|hit| hit.id));
            continue;
        }
        let version = history.version;
        let mut events = Vec::with_capacity(hits.len());
        let mut guards = Vec::with_capacity(hits.len());
        let mut counted = Vec::with_capacity(hits.len());
        for hit in hits {
            let actor = Actor::from_signal(&hit.signal);
            let source = Some(history.source.clone());
            let (event, kind, machine) = match hit.taken {
                Taken::Click { url: None, .. } => {
                    decided.dropped.push(hit.id);
                    decided.unreadable.push((hit.id, email_id.clone()));
                    continue;
                }
                Taken::Click { link_id, url: Some(url), position } => {
                    let verdict = history::click(&history, &link_id, actor, hit.at_ms);
                    let link = platform::events::seal(&history.contact_id, &proto::ClickedLink { url });
                    let event = LogEvent::EmailClicked(proto::EmailClicked {
                        email_id: email_id.clone(),
                        space_id: history.space_id.clone(),
                        contact_id: history.contact_id.clone(),
                        link: Some(link),
                        link_id,
                        first: verdict.first,
                        machine: verdict.machine.to_owned(),
                        at_ms: hit.at_ms,
                        source,
                        link_position: position,
                    });
                    (event, "click", verdict.machine)
                }
                Taken::Open => {
                    let verdict = history::open(&history, actor);
                    let event = LogEvent::EmailOpened(proto::EmailOpened {
                        email_id: email_id.clone(),
                        space_id: history.space_id.clone(),
                        contact_id: history.contact_id.clone(),
                        first: verdict.first,
                        machine: verdict.machine.to_owned(),
                        at_ms: hit.at_ms,
                        source,
                    });
                    (event, "open", verdict.machine)
                }
            };
            history.record(&event);
            events.push(NewEvent {
                event,
                subject_id: Some(history.contact_id.clone()),
                occurred_at: platform::time::from_millis(hit.at_ms),
            });
            guards.push(taken(hit.id));
            counted.push((kind, if machine.is_empty() { "none" } else { machine }));
        }
        if !events.is_empty() {
            decided.appends.push(EmailAppend {
                email_id: email_id.clone().into(),
                space_id: history.space_id.clone().into(),
                contact_id: history.contact_id.clone().into(),
                version,
                events,
                guards,
                counted,
            });
        }
        decided.histories.push((email_id, history));
    }
    decided
}

/// The row's deletion, in the append of its event: a row becomes an event once.
fn taken(id: i64) -> Guard {
    Guard::exactly_one(
        "DELETE FROM engagement_inbox WHERE id = $1",
        vec![Box::new(id)],
        AppendError::Conflict { code: Code::OperationTaken, message: "the hit was already recorded".to_owned() },
    )
    .with_set("DELETE FROM engagement_inbox WHERE id = ANY($1::bigint[])", vec![SetValue::BigInt(id)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Past the scanner window after the send at 0.
    const LATER: i64 = 1_000_000;

    fn history(contact_id: &str) -> History {
        History {
            version: 3,
            space_id: "sp_1".to_owned(),
            contact_id: contact_id.to_owned(),
            sent_at_ms: Some(0),
            ..History::default()
        }
    }

    fn open(id: i64, email_id: &str, signal: &str, at_ms: i64) -> Hit {
        Hit { id, email_id: email_id.to_owned().into(), taken: Taken::Open, signal: signal.to_owned(), at_ms }
    }

    fn click(id: i64, email_id: &str, link_id: &str, url: Option<&str>, at_ms: i64) -> Hit {
        let taken = Taken::Click { link_id: link_id.to_owned(), url: url.map(str::to_owned), position: 1 };
        Hit { id, email_id: email_id.to_owned().into(), taken, signal: String::new(), at_ms }
    }

    fn keyed(contacts: &[&str]) -> HashSet<String> {
        contacts.iter().map(|contact| (*contact).to_owned()).collect()
    }

    /// (type, first, machine) of each event.
    fn verdicts(append: &EmailAppend) -> Vec<(&'static str, bool, String)> {
        append
            .events
            .iter()
            .map(|new| match &new.event {
                LogEvent::EmailOpened(opened) => ("opened", opened.first, opened.machine.clone()),
                LogEvent::EmailClicked(clicked) => ("clicked", clicked.first, clicked.machine.clone()),
                other => panic!("an unexpected event: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn given_opens_and_clicks_of_a_person_when_decided_then_only_the_first_of_each_kind_is_first() {
        let histories = BTreeMap::from([("em_1".to_owned(), history("ct_1"))]);
        let hits = vec![
            open(1, "em_1", "", LATER),
            click(2, "em_1", "l1", Some("https://example.com/a"), LATER + 1_000),
            click(3, "em_1", "l1", Some("https://example.com/a"), LATER + 60_000),
            open(4, "em_1", "", LATER + 61_000),
        ];
        let decided = decide(hits, histories, &keyed(&["ct_1"]));
        assert!(decided.dropped.is_empty());
        let [append] = &decided.appends[..] else { panic!("one append: {}", decided.appends.len()) };
        assert_eq!((append.email_id.as_str(), append.contact_id.as_str(), append.version), ("em_1", "ct_1", 3));
        assert_eq!(
            verdicts(append),
            [
                ("opened", true, String::new()),
                ("clicked", true, String::new()),
                ("clicked", false, String::new()),
                ("opened", false, String::new())
            ]
        );
        assert_eq!(append.counted, [("open", "none"), ("click", "none"), ("click", "none"), ("open", "none")]);
        assert_eq!(append.guards.len(), 4, "each row deleted in the append of its event");
        assert!(append.guards.iter().all(|guard| guard.expect_rows == Some(1)));
        let [(email_id, kept)] = &decided.histories[..] else { panic!("one history") };
        assert_eq!((email_id.as_str(), kept.version), ("em_1", 7), "the history moves on by the appended events");
        assert!(kept.opened.human && kept.links["l1"].seen.human);
    }

    #[test]
    fn given_a_bots_open_or_a_click_right_after_another_links_when_decided_then_they_are_a_machines() {
        let histories = BTreeMap::from([("em_1".to_owned(), history("ct_1"))]);
        let hits = vec![
            open(1, "em_1", "known_bot", LATER),
            click(2, "em_1", "l1", Some("https://example.com/a"), LATER),
            click(3, "em_1", "l2", Some("https://example.com/b"), LATER + 500),
            open(4, "em_1", "", LATER + 1_000),
        ];
        let decided = decide(hits, histories, &keyed(&["ct_1"]));
        let append = &decided.appends[0];
        assert_eq!(
            verdicts(append),
            [
                ("opened", true, "known_bot".to_owned()),
                ("clicked", true, String::new()),
                ("clicked", true, "link_burst".to_owned()),
                ("opened", true, String::new())
            ],
            "a machine's open does not make a person's later open any less the first"
        );
        assert_eq!(append.counted[0], ("open", "known_bot"));
        assert_eq!(append.counted[2], ("click", "link_burst"));
    }

    #[test]
    fn given_rows_of_an_unknown_email_or_an_erased_contact_when_decided_then_they_are_dropped_without_an_event() {
        let histories = BTreeMap::from([("em_erased".to_owned(), history("ct_gone"))]);
        let hits =
            vec![open(1, "em_unknown", "", LATER), open(2, "em_erased", "", LATER), open(3, "em_unknown", "", LATER)];
        let decided = decide(hits, histories, &keyed(&["ct_1"]));
        assert!(decided.appends.is_empty() && decided.histories.is_empty());
        let mut dropped = decided.dropped.clone();
        dropped.sort_unstable();
        assert_eq!(dropped, [1, 2, 3]);
        assert!(decided.unreadable.is_empty());
    }

    #[test]
    fn given_a_click_whose_target_cannot_be_opened_when_decided_then_it_alone_is_dropped_and_reported() {
        let histories = BTreeMap::from([("em_1".to_owned(), history("ct_1"))]);
        let hits = vec![click(1, "em_1", "l1", None, LATER), open(2, "em_1", "", LATER)];
        let decided = decide(hits, histories, &keyed(&["ct_1"]));
        assert_eq!(decided.dropped, [1]);
        assert_eq!(decided.unreadable, [(1, "em_1".to_owned())]);
        assert_eq!(verdicts(&decided.appends[0]), [("opened", true, String::new())]);
        assert_eq!(decided.histories[0].1.version, 4);
    }

    #[test]
    fn given_a_click_when_decided_then_its_target_is_sealed_in_the_clear_for_the_contact_with_its_emails_source() {
        let mut known = history("ct_1");
        known.source.template_id = "tpl_1".to_owned();
        let histories = BTreeMap::from([("em_1".to_owned(), known)]);
        let decided =
            decide(vec![click(7, "em_1", "l1", Some("https://example.com/a"), LATER)], histories, &keyed(&["ct_1"]));
        let append = &decided.appends[0];
        assert_eq!(append.events[0].subject_id.as_deref(), Some("ct_1"));
        let LogEvent::EmailClicked(clicked) = &append.events[0].event else { panic!("a click") };
        assert_eq!(clicked.source.as_ref().map(|source| source.template_id.as_str()), Some("tpl_1"));
        let link = clicked.link.as_ref().expect("a link");
        assert_eq!(link.subject_id, "ct_1");
        let Some(proto::sealed::Body::Clear(bytes)) = &link.body else { panic!("sealed in the clear") };
        let opened = proto::ClickedLink::decode(bytes.as_slice()).expect("a link's target");
        assert_eq!(opened.url, "https://example.com/a");
    }
}
