//! What a click or an open records, from the email's stream and what the request showed
//! (pure): whether it is the first of its kind, and whose it was.

use std::collections::BTreeMap;

use kernel::events::LogEvent;
use kernel::proto;

use super::{Actor, Timing};

/// What an email's stream says, as far as a click or an open needs it.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// The stream's version: the append expects it.
    pub version: i64,
    pub space_id: String,
    pub contact_id: String,
    /// When the relay accepted the message; until it is recorded, when the email was
    /// scheduled (a hand-off follows at once, and a scanner may be faster than its record).
    pub sent_at_ms: Option<i64>,
    /// Opens so far, by whose.
    pub opened: Seen,
    /// Clicks so far, by link: whose, and the latest. A summary, not the clicks themselves,
    /// so a history stays the size of the email's links however often they are clicked.
    pub links: BTreeMap<String, Clicked>,
    /// What sent the email: each open and click carries it.
    pub source: proto::EmailSource,
}

/// Whether a person's and a machine's activity were seen.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    pub human: bool,
    pub machine: bool,
}

impl Seen {
    fn of(&self, actor: Actor) -> bool {
        match actor {
            Actor::Human => self.human,
            Actor::Machine(_) => self.machine,
        }
    }

    fn mark(&mut self, machine: bool) {
        if machine { self.machine = true } else { self.human = true }
    }
}

/// A link's clicks so far.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clicked {
    pub seen: Seen,
    /// The latest click's time.
    pub last_at_ms: i64,
}

impl History {
    /// Folds an email's stream (its events with their stream versions, in order); `None`
    /// when it holds no `EmailScheduled`.
    pub fn fold(events: impl IntoIterator<Item = (i64, LogEvent)>) -> Option<Self> {
        Self::fold_onto(None, events)
    }

    /// Folds the events after `history`'s version onto it (or, with none, the stream from
    /// its start): the worker keeps histories between its batches and reads only what was
    /// appended since.
    pub fn fold_onto(mut history: Option<Self>, events: impl IntoIterator<Item = (i64, LogEvent)>) -> Option<Self> {
        for (version, event) in events {
            if let LogEvent::EmailScheduled(scheduled) = &event {
                history = Some(Self {
                    space_id: scheduled.space_id.clone(),
                    contact_id: scheduled.contact_id.clone(),
                    sent_at_ms: Some(scheduled.scheduled_at_ms),
                    source: proto::EmailSource {
                        template_id: scheduled.template_id.clone(),
                        origin: scheduled.origin.clone(),
                        source_id: scheduled.form_id.clone(),
                        parent_id: scheduled.parent_id.clone(),
                        step_id: scheduled.step_id.clone(),
                        variant: scheduled.variant.clone(),
                        experiment_winner: scheduled.experiment_winner,
                    },
                    ..Self::default()
                });
            }
            let Some(found) = history.as_mut() else { continue };
            found.version = version;
            match event {
                LogEvent::EmailSent(sent) => found.sent_at_ms = Some(sent.sent_at_ms),
                other => found.mark(&other),
            }
        }
        history
    }

    /// Counts an open or a click.
    fn mark(&mut self, event: &LogEvent) {
        match event {
            LogEvent::EmailOpened(opened) => self.opened.mark(!opened.machine.is_empty()),
            LogEvent::EmailClicked(clicked) => {
                let link = self.links.entry(clicked.link_id.clone()).or_default();
                link.seen.mark(!clicked.machine.is_empty());
                link.last_at_ms = link.last_at_ms.max(clicked.at_ms);
            }
            _ => {}
        }
    }
}

/// What an open or a click records beside the email: whether it is the first of its kind
/// (a person's, or a machine's) and, for a machine's, the signal that gave it away (empty
/// for a person's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub first: bool,
    pub machine: &'static str,
}

fn verdict(actor: Actor, seen: Seen) -> Verdict {
    let machine = match actor {
        Actor::Human => "",
        Actor::Machine(signal) => signal.as_str(),
    };
    Verdict { first: !seen.of(actor), machine }
}

/// A fetch of the open pixel, by `actor` as the request showed it.
pub fn open(history: &History, actor: Actor) -> Verdict {
    verdict(actor, history.opened)
}

/// A click of link `link_id` at `now_ms`, by `actor` as the request showed it (a person's
/// click may still be a scanner's, by its timing).
pub fn click(history: &History, link_id: &str, actor: Actor, now_ms: i64) -> Verdict {
    let other_link_clicked_at_ms =
        history.links.iter().filter(|(id, _)| id.as_str() != link_id).map(|(_, link)| link.last_at_ms).max();
    let timing = Timing { now_ms, sent_at_ms: history.sent_at_ms, other_link_clicked_at_ms };
    let seen = history.links.get(link_id).map(|link| link.seen).unwrap_or_default();
    let actor = if actor == Actor::Human { super::click_timing(&timing) } else { actor };
    verdict(actor, seen)
}

impl History {
    /// The history once `event` (an open or a click this history decided) is appended after
    /// it, so the next decision of the same email sees it.
    pub fn record(&mut self, event: &LogEvent) {
        self.version += 1;
        self.mark(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engagement::Signal;

    fn person() -> Actor {
        Actor::Human
    }

    fn stream(rest: Vec<LogEvent>) -> History {
        let scheduled = LogEvent::EmailScheduled(proto::EmailScheduled {
            email_id: "em_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            ..Default::default()
        });
        let events = std::iter::once(scheduled).chain(rest).enumerate().map(|(at, event)| (at as i64 + 1, event));
        History::fold(events).expect("a scheduled email")
    }

    fn sent(at_ms: i64) -> LogEvent {
        LogEvent::EmailSent(proto::EmailSent { sent_at_ms: at_ms, ..Default::default() })
    }

    fn clicked(link_id: &str, machine: &str, at_ms: i64) -> LogEvent {
        LogEvent::EmailClicked(proto::EmailClicked {
            link_id: link_id.into(),
            machine: machine.into(),
            at_ms,
            ..Default::default()
        })
    }

    #[test]
    fn a_stream_without_its_scheduling_is_no_email() {
        assert!(History::fold([(1, sent(5))]).is_none());
        let history = stream(vec![sent(1_000), clicked("l1", "", 90_000)]);
        assert_eq!((history.version, history.space_id.as_str(), history.contact_id.as_str()), (3, "spc_1", "con_1"));
        assert_eq!(history.sent_at_ms, Some(1_000));
    }

    #[test]
    fn the_first_open_of_a_person_counts_even_after_a_proxy_prefetched_the_pixel() {
        let proxy = Actor::Machine(Signal::PrivacyProxy);
        let fresh = stream(vec![sent(0)]);
        assert_eq!(open(&fresh, proxy), Verdict { first: true, machine: "privacy_proxy" });
        let prefetched = stream(vec![
            sent(0),
            LogEvent::EmailOpened(proto::EmailOpened { machine: "privacy_proxy".into(), ..Default::default() }),
        ]);
        assert_eq!(open(&prefetched, proxy), Verdict { first: false, machine: "privacy_proxy" });
        assert_eq!(open(&prefetched, person()), Verdict { first: true, machine: "" });
        let read = stream(vec![sent(0), LogEvent::EmailOpened(proto::EmailOpened::default())]);
        assert_eq!(open(&read, person()), Verdict { first: false, machine: "" });
    }

    #[test]
    fn a_click_is_first_per_link_and_a_scanner_is_known_by_its_timing() {
        let history = stream(vec![sent(0), clicked("l1", "", 60_000)]);
        assert_eq!(click(&history, "l1", person(), 120_000), Verdict { first: false, machine: "" });
        assert_eq!(click(&history, "l2", person(), 120_000), Verdict { first: true, machine: "" });
        assert_eq!(
            click(&history, "l2", person(), 61_000),
            Verdict { first: true, machine: "link_burst" },
            "another link a second after the first"
        );
        let fresh = stream(vec![sent(0)]);
        assert_eq!(click(&fresh, "l1", person(), 3_000), Verdict { first: true, machine: "right_after_delivery" });
        let head = Actor::Machine(Signal::Head);
        assert_eq!(click(&fresh, "l1", head, 600_000), Verdict { first: true, machine: "head" });
        assert_eq!(
            click(&fresh, "l1", head, 3_000),
            Verdict { first: true, machine: "head" },
            "the request's signal first"
        );
        let scanned = stream(vec![sent(0), clicked("l1", "right_after_delivery", 1_000)]);
        assert_eq!(
            click(&scanned, "l1", person(), 600_000),
            Verdict { first: true, machine: "" },
            "a scanner's click does not take the person's first"
        );
    }

    #[test]
    fn a_decided_click_is_seen_by_the_next_decision_of_the_same_email() {
        let mut history = stream(vec![sent(0)]);
        let first = click(&history, "l1", person(), 60_000);
        assert_eq!(first, Verdict { first: true, machine: "" });
        history.record(&clicked("l1", first.machine, 60_000));
        assert_eq!(history.version, 3);
        assert_eq!(click(&history, "l1", person(), 90_000), Verdict { first: false, machine: "" });
        assert_eq!(click(&history, "l2", person(), 60_500), Verdict { first: true, machine: "link_burst" });
        history.record(&LogEvent::EmailOpened(proto::EmailOpened::default()));
        assert_eq!(open(&history, person()), Verdict { first: false, machine: "" });
    }

    #[test]
    fn a_history_folded_in_parts_decides_as_the_whole_stream_does() {
        let scheduled = LogEvent::EmailScheduled(proto::EmailScheduled {
            email_id: "em_1".into(),
            space_id: "spc_1".into(),
            contact_id: "con_1".into(),
            ..Default::default()
        });
        let events: Vec<(i64, LogEvent)> = [
            scheduled,
            sent(0),
            clicked("l1", "", 60_000),
            clicked("l2", "head", 70_000),
            clicked("l1", "", 400_000),
            LogEvent::EmailOpened(proto::EmailOpened { machine: "privacy_proxy".into(), ..Default::default() }),
        ]
        .into_iter()
        .enumerate()
        .map(|(at, event)| (at as i64 + 1, event))
        .collect();
        let whole = History::fold(events.clone()).expect("a scheduled email");
        for split in 1..events.len() {
            let (before, after) = events.split_at(split);
            let kept = History::fold(before.to_vec());
            let parts = History::fold_onto(kept, after.to_vec()).expect("a scheduled email");
            assert_eq!(parts.version, whole.version, "split at {split}");
            for (link, at) in [("l1", 400_500), ("l2", 400_500), ("l3", 900_000)] {
                assert_eq!(
                    click(&parts, link, person(), at),
                    click(&whole, link, person(), at),
                    "{link}, split at {split}"
                );
            }
            assert_eq!(open(&parts, person()), open(&whole, person()));
            assert_eq!(
                open(&parts, Actor::Machine(Signal::PrivacyProxy)),
                open(&whole, Actor::Machine(Signal::PrivacyProxy))
            );
        }
        // Clicked twice, one link is one entry: the history grows with links, not clicks.
        assert_eq!(whole.links.len(), 2);
        assert_eq!(whole.links["l1"].last_at_ms, 400_000);
        // A click on l3 at 400,500 comes 500 ms after l1's latest click (its first, at 60,000,
        // is long past): the burst rule sees each other link's latest click.
        assert_eq!(click(&whole, "l3", person(), 400_500), Verdict { first: true, machine: "link_burst" });
    }
}
