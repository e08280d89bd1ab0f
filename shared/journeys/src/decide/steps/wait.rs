//! The waits: `wait` (a time, a date, a contact's date attribute), `wait_for_event` and
//! `wait_for_engagement` (an open or a click of an email the run sent). Each sleeps on start
//! (or ends at once) and resumes when it is due or what it waits for came.

use std::collections::BTreeMap;

use domain::workflows::{EngagementAction, Step, Wait};
use platform::events::LogEvent;
use platform::proto;
use serde_json::{Value, json};

use super::super::facts::{ContactFacts, Facts, Stop, email_of};
use super::super::tick::{InFlight, RunStatus, Tick};

/// Starts a `wait`: it sleeps until its time, ends at once when that has passed, and is
/// skipped when the contact's date is missing.
pub(super) fn start_wait(
    tick: &mut Tick,
    step: &Step,
    (wait, next): (&Wait, Option<&str>),
    facts: &Facts,
    now: i64,
) -> Result<(), Stop> {
    let until = match wait {
        Wait::For { ms } => Some(now.saturating_add(*ms)),
        Wait::Until { at_ms } => Some(*at_ms),
        Wait::UntilAttribute { attribute, offset_ms } => match facts.contact()? {
            ContactFacts::Live(facts) => facts
                .state
                .values()
                .get(attribute)
                .and_then(Value::as_str)
                .and_then(parse_date)
                .map(|at| at.saturating_add(*offset_ms)),
            _ => None,
        },
    };
    let started = tick.start(step, now);
    match until {
        Some(until) if until > now => sleep(tick, started, until, None, now),
        Some(_) => tick.finish(&started, "completed", None, next, now),
        None => {
            let message = "the contact's date attribute is missing or not a date; the wait is skipped";
            tick.finish(&started, "skipped", Some(("attribute_missing", message.to_owned())), next, now);
        }
    }
    Ok(())
}

/// Resumes a `wait` at its time.
pub(super) fn resume_wait(tick: &mut Tick, in_flight: &InFlight, next: Option<&str>, now: i64) {
    tick.finish(in_flight, "completed", None, next, now);
}

/// Starts a `wait_for_event`: it sleeps until its timeout, woken by an event of the schema.
pub(super) fn start_for_event(tick: &mut Tick, step: &Step, (event_schema_id, timeout_ms): (&str, i64), now: i64) {
    let started = tick.start(step, now);
    sleep(tick, started, now.saturating_add(timeout_ms), Some(event_schema_id.to_owned()), now);
}

/// Resumes a `wait_for_event`: the event that matched, or its timeout.
pub(super) fn resume_for_event(
    tick: &mut Tick,
    in_flight: &InFlight,
    (on_event, on_timeout): (Option<&str>, Option<&str>),
    now: i64,
) {
    match tick.row.matched_event.clone() {
        Some(event_id) => {
            let output = json!({"eventId": event_id});
            let next = on_event;
            tick.finish_with(in_flight, "completed", None, (String::new(), Some(output)), next, now);
        }
        None => tick.finish(in_flight, "timed_out", None, on_timeout, now),
    }
}

/// Starts a `wait_for_engagement`: an open or click already made ends it at once; otherwise
/// it sleeps on the email until its timeout.
pub(super) fn start_for_engagement(
    tick: &mut Tick,
    step: &Step,
    ((sent_by, action), timeout_ms, on_engaged): ((&str, EngagementAction), i64, Option<&str>),
    facts: &Facts,
    now: i64,
) -> Result<(), Stop> {
    let (email_id, engaged) = engaged_with(&tick.outputs, facts, sent_by, action)?;
    let started = tick.start(step, now);
    if engaged {
        let output = json!({"emailId": email_id});
        tick.finish_with(&started, "completed", None, (String::new(), Some(output)), on_engaged, now);
    } else {
        // Without an email (its send was skipped) only the timeout ends the wait.
        let waiting = email_id.map(|email_id| action.waiting_key(&email_id));
        sleep(tick, started, now.saturating_add(timeout_ms), waiting, now);
    }
    Ok(())
}

/// Resumes a `wait_for_engagement`: matched by the follower, or at its timeout.
pub(super) fn resume_for_engagement(
    tick: &mut Tick,
    in_flight: &InFlight,
    (sent_by, action): (&str, EngagementAction),
    (on_engaged, on_timeout): (Option<&str>, Option<&str>),
    facts: &Facts,
    now: i64,
) -> Result<(), Stop> {
    // Matched by the follower; at the timeout, what the log says (an open recorded while the
    // wait began is not missed).
    let (email_id, engaged) = match tick.row.matched_event.clone() {
        Some(email_id) => (Some(email_id), true),
        None => engaged_with(&tick.outputs, facts, sent_by, action)?,
    };
    if engaged {
        let output = json!({"emailId": email_id});
        let next = on_engaged;
        tick.finish_with(in_flight, "completed", None, (String::new(), Some(output)), next, now);
    } else {
        tick.finish(in_flight, "timed_out", None, on_timeout, now);
    }
    Ok(())
}

/// Whether a person did `action` with the email the send step `sent_by` scheduled (`false`
/// when it scheduled none).
fn engaged_with(
    outputs: &BTreeMap<String, Value>,
    facts: &Facts,
    sent_by: &str,
    action: EngagementAction,
) -> Result<(Option<String>, bool), Stop> {
    let Some(email_id) = email_of(outputs, sent_by) else { return Ok((None, false)) };
    let engaged = facts.engaged(std::slice::from_ref(&email_id))?.first().is_some_and(|engaged| engaged.did(action));
    Ok((Some(email_id), engaged))
}

fn sleep(tick: &mut Tick, started: InFlight, until: i64, event_schema_id: Option<String>, now: i64) {
    tick.push(LogEvent::WorkflowRunSleeping(proto::WorkflowRunSleeping {
        run_id: tick.row.run_id.clone().into(),
        space_id: tick.space(),
        index: started.index,
        until_ms: until,
        event_schema_id: event_schema_id.clone().unwrap_or_default(),
        at_ms: now,
    }));
    tick.new_wait = event_schema_id.is_some();
    tick.row.waiting_schema = event_schema_id;
    tick.row.matched_event = None;
    tick.row.status = RunStatus::Sleeping;
    tick.row.in_flight = Some(started);
    tick.due_ms = Some(until);
}

/// A date attribute's value in Unix milliseconds (`YYYY-MM-DD`, or an RFC 3339 time).
pub(in super::super) fn parse_date(text: &str) -> Option<i64> {
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Some(at.timestamp_millis());
    }
    let date = chrono::NaiveDate::parse_from_str(text.get(..10)?, "%Y-%m-%d").ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_millis())
}
