//! `call_webhook`: a call to the step's URL, committed as going out before it goes, and its
//! outcome recorded after: done, retried on the schedule, or failed (with the run).

use std::time::Duration;

use domain::workflows::Step;
use serde_json::{Value, json};

use super::super::facts::{CallOutcome, ContactFacts, Facts, Given, Need, Stop};
use super::super::tick::{Call, InFlight, Row, RunStatus, Tick};
use domain::webhooks::attempt::AttemptResult;

/// Starts a `call_webhook`: its first attempt is committed, to go out after the transition.
pub(super) fn start(
    tick: &mut Tick,
    step: &Step,
    url: &str,
    input: &Value,
    facts: &Facts,
    given: &Given<'_>,
) -> Result<bool, Stop> {
    let now = given.now;
    let mut started = tick.start(step, now);
    let contact = facts.contact()?;
    tick.call = Some(call_request(given, facts, &tick.row, step, input, contact, url)?);
    started.attempt = 1;
    started.attempting = true;
    tick.row.in_flight = Some(started);
    Ok(true)
}

/// Resumes a call in flight: its outcome (`outcome`, just made) is recorded; one found going
/// out without an outcome ends `outcome_unknown`; between attempts, the next one goes out.
pub(super) fn resume(
    tick: &mut Tick,
    (step, in_flight): (&Step, &InFlight),
    (url, next): (&str, Option<&str>),
    outcome: Option<&CallOutcome>,
    (input, facts, given): (&Value, &Facts, &Given<'_>),
) -> Result<(), Stop> {
    let now = given.now;
    match outcome {
        Some(outcome) => finish_call(given, tick, in_flight, outcome, next),
        // Started and never recorded: it may have been received. Never again.
        None if in_flight.attempting => tick.finish(
            in_flight,
            "outcome_unknown",
            Some(("outcome_unknown", "the call's outcome was lost in a crash".to_owned())),
            next,
            now,
        ),
        // Between attempts: the next one goes out.
        None => {
            let contact = facts.contact()?;
            tick.call = Some(call_request(given, facts, &tick.row, step, input, contact, url)?);
            let mut attempt = in_flight.clone();
            attempt.attempt += 1;
            attempt.attempting = true;
            tick.row.in_flight = Some(attempt);
        }
    }
    Ok(())
}

/// The request of a `call_webhook` step: the run's data, signed with the workflow's secret.
fn call_request(
    given: &Given<'_>,
    facts: &Facts,
    row: &Row,
    step: &Step,
    input: &Value,
    contact: &ContactFacts,
    url: &str,
) -> Result<Call, Stop> {
    let index = row.in_flight.as_ref().map_or(row.step_count, |in_flight| in_flight.index);
    let contact = match contact {
        ContactFacts::Live(live) => live.state.document(),
        _ => Value::Null,
    };
    let body = json!({
        "type": "workflow.call",
        "timestamp": platform::time::format_millis(given.now),
        "data": {
            "workflowId": row.workflow_id,
            "runId": row.run_id,
            "stepId": step.id,
            "index": index,
            "contactId": row.contact_id,
            "input": input,
            "contact": contact,
        },
    });
    Ok(Call {
        url: url.to_owned(),
        body: serde_json::to_vec(&body).map_err(anyhow::Error::from)?,
        call_id: domain::workflows::call_id(&row.run_id, index),
        secret: facts.secret.clone().ok_or(Stop::Needs(Need::Secret))?,
    })
}

/// Records a call's attempt: done, failed, or due again after the retry schedule's delay.
fn finish_call(given: &Given<'_>, tick: &mut Tick, in_flight: &InFlight, outcome: &CallOutcome, next: Option<&str>) {
    let now = given.now;
    let answer = |status: Option<u16>| json!({"status": status, "body": outcome.body});
    let (status, error) = match &outcome.result {
        AttemptResult::Delivered { status } => {
            let output = answer(Some(*status));
            tick.finish_with(in_flight, "completed", None, (String::new(), Some(output)), next, now);
            return;
        }
        AttemptResult::Retryable { status, error, retry_after } => {
            let schedule = given.retry_schedule_ms;
            let attempt = usize::try_from(in_flight.attempt).unwrap_or(usize::MAX).saturating_sub(1);
            if let Some(delay) = schedule.get(attempt) {
                let delay = Duration::from_millis(*delay).mul_f64(given.jitter).max(retry_after.unwrap_or_default());
                let mut waiting = in_flight.clone();
                waiting.attempting = false;
                tick.row.in_flight = Some(waiting);
                tick.due_ms = Some(now.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)));
                return;
            }
            (*status, error.clone())
        }
        AttemptResult::Rejected { status, error } => (*status, error.clone()),
        AttemptResult::Gone => (Some(410), "HTTP 410 Gone".to_owned()),
    };
    // Refused, or retried to the end of the schedule: the step and the run fail.
    let failure = ("webhook_call_failed", error);
    tick.finish_with(in_flight, "failed", Some(failure.clone()), (String::new(), Some(answer(status))), None, now);
    tick.end(RunStatus::Failed, Some(failure), now);
}
