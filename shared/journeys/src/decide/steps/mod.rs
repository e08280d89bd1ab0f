//! Each step kind's start (executed as the run's next step) and resume (a step in flight: a
//! wait that ended, a call's outcome), side by side in the kind's file; here, which kind's
//! start or resume a step takes.

mod branch;
mod call;
mod contact;
mod entry_exit;
mod send_email;
mod wait;

pub(super) use wait::parse_date;

use domain::workflows::{Step, StepKind};
use serde_json::Value;

use super::facts::{CallOutcome, Facts, Given, Stop};
use super::tick::{InFlight, Tick};

/// Resumes `step`, in flight as `in_flight`: a wait that ended, or a call's outcome
/// (`call_outcome`, taken by the call) or its next attempt.
pub(super) fn resume(
    tick: &mut Tick,
    step: &Step,
    in_flight: &InFlight,
    call_outcome: &mut Option<&CallOutcome>,
    (input, facts, given): (&Value, &Facts, &Given<'_>),
) -> Result<(), Stop> {
    let now = given.now;
    match (&step.kind, tick.row.status) {
        (StepKind::Wait { next, .. }, _) => wait::resume_wait(tick, in_flight, next.as_deref(), now),
        (StepKind::WaitForEvent { on_event, on_timeout, .. }, _) => {
            wait::resume_for_event(tick, in_flight, (on_event.as_deref(), on_timeout.as_deref()), now);
        }
        (StepKind::WaitForEngagement { step: sent_by, action, on_engaged, on_timeout, .. }, _) => {
            let nexts = (on_engaged.as_deref(), on_timeout.as_deref());
            wait::resume_for_engagement(tick, in_flight, (sent_by, *action), nexts, facts, now)?;
        }
        (StepKind::CallWebhook { url, next }, _) => {
            call::resume(tick, (step, in_flight), (url, next.as_deref()), call_outcome.take(), (input, facts, given))?;
        }
        _ => {
            return Err(Stop::Failed(anyhow::anyhow!(
                "run {} has step {} in flight, which does not wait",
                tick.row.run_id,
                step.id
            )));
        }
    }
    Ok(())
}

/// Executes `step` (not in flight); `true` when it wrote to another stream (one per
/// transition).
pub(super) fn execute(
    tick: &mut Tick,
    step: &Step,
    input: &Value,
    facts: &Facts,
    (given, allowance_refused): (&Given<'_>, bool),
) -> Result<bool, Stop> {
    let now = given.now;
    match &step.kind {
        StepKind::IncomingWebhook { next, .. } => entry_exit::start_entry(tick, step, next.as_deref(), now),
        StepKind::Wait { wait, next } => wait::start_wait(tick, step, (wait, next.as_deref()), facts, now)?,
        StepKind::WaitForEvent { event_schema_id, timeout_ms, .. } => {
            wait::start_for_event(tick, step, (event_schema_id, *timeout_ms), now);
        }
        StepKind::WaitForEngagement { step: sent_by, action, timeout_ms, on_engaged, .. } => {
            let waits = ((sent_by.as_str(), *action), *timeout_ms, on_engaged.as_deref());
            wait::start_for_engagement(tick, step, waits, facts, now)?;
        }
        StepKind::Branch { arms, default } => {
            branch::start_branch(tick, step, (arms, default.as_deref()), input, facts, now)?;
        }
        StepKind::Goto { target, max_passes, next } => {
            branch::start_goto(tick, step, (target, *max_passes, next.as_deref()), now);
        }
        StepKind::Exit => entry_exit::start_exit(tick, step, now),
        StepKind::SendEmail { template_id, next } => {
            return send_email::start(
                tick,
                step,
                (template_id, next.as_deref()),
                input,
                (facts, given, allowance_refused),
            );
        }
        StepKind::UpdateContact { set, next } => {
            return contact::start_update(tick, step, (set, next.as_deref()), input, facts, now);
        }
        StepKind::Subscribe { topic_id, next } | StepKind::Unsubscribe { topic_id, next } => {
            return contact::start_subscription(tick, step, (topic_id, next.as_deref()), facts, now);
        }
        StepKind::CallWebhook { url, .. } => return call::start(tick, step, url, input, facts, given),
    }
    Ok(false)
}
