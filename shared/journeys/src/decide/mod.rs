//! What a claimed run does next, decided without IO: from the run's row, its definition and
//! the facts loaded for it, the transition to append (the run's events, the other streams'
//! events and guards, the row's next state) and what to do once it is committed (a webhook
//! call, an email's hand-off).
//!
//! A decision executes steps until one must wait (a wait, a webhook call), writes to another
//! stream (an email, a record change, a subscription: one such effect per transition), or
//! the run ends. It reads the contact, a send step's template and whether an address is
//! suppressed only when a step reaches for them: a fact not loaded yet is asked for
//! ([`Decided::Needs`]), and the decision is made again, from the start, once it is there
//! (`run.rs` loads it).
//!
//! Here, a run's loop over its steps; in `steps/`, each step kind's start (executed as the
//! run's next step) and resume (in flight: a wait that ended, a call's outcome) side by side;
//! `facts.rs`, what a decision reads, is given and asks for; `tick.rs`, the transition it
//! builds (the run's row and status, its events) and how a step starts and finishes and a run
//! ends. The step files use those two and never this file.

mod facts;
mod migrate;
mod steps;
mod tick;

use domain::workflows::WorkflowDef;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, Guard};
use platform::proto;

use facts::Stop;
pub use facts::{CallOutcome, Contact, ContactFacts, Engaged, Facts, Given, Need};
pub use tick::Opened;
pub use tick::{Call, Row, RunStatus, Tick, open, subject};

/// Steps one transition executes at most (a loop of steps without effects is bounded by its
/// `goto`, and each transition by this).
const STEPS_PER_TICK: usize = 64;

/// A decision: the transition, or the fact to load first.
pub enum Decided {
    Tick(Box<Tick>),
    Needs(Need),
}

/// Decides the run's next transition, or names the fact it needs first.
pub fn decide(
    (row, opened): (&Row, &Opened),
    definition: &WorkflowDef,
    facts: &Facts,
    given: &Given<'_>,
) -> anyhow::Result<Decided> {
    match transition((row.clone(), opened), definition, facts, given) {
        Ok(tick) => Ok(Decided::Tick(Box::new(tick))),
        Err(Stop::Needs(need)) => Ok(Decided::Needs(need)),
        Err(Stop::Failed(error)) => Err(error),
    }
}

fn transition(
    (row, opened): (Row, &Opened),
    definition: &WorkflowDef,
    facts: &Facts,
    given: &Given<'_>,
) -> Result<Tick, Stop> {
    let (now, allowance_refused) = (given.now, given.allowance_refused);
    let paused = row.control_paused;
    let input = opened.input.clone();
    let mut tick = Tick::new(row, opened.outputs.clone());
    if matches!(tick.row.status, RunStatus::Completed | RunStatus::Exited | RunStatus::Failed) {
        tick.finished = true;
        return Ok(tick);
    }
    // The contact's key is gone: the contact was erased, and its run with it.
    let Some(input) = input else {
        tick.end(RunStatus::Exited, Some(("contact_erased", "the run's contact was erased".to_owned())), now);
        return Ok(tick);
    };
    // A newer revision moves the run first (a call's outcome is recorded on the step that made
    // the call, and the move waits for the next transition; so does a call whose outcome a
    // crash hid).
    let mut definition = definition;
    let calling = given.call_outcome.is_some() || tick.row.in_flight.as_ref().is_some_and(|step| step.attempting);
    if let Some((to_revision, newer)) = given.newer
        && to_revision > tick.row.revision
        && !calling
    {
        match migrate::migrate(&mut tick, (definition, newer, to_revision), facts, now)? {
            migrate::Outcome::Exited => return Ok(tick),
            migrate::Outcome::Moved => definition = newer,
            migrate::Outcome::Stays => {}
        }
        // A run in a wait that goes on sleeps again until its time (a pause applies then).
        if tick.due_ms.is_some() {
            return Ok(tick);
        }
    }
    let started_waiting = tick.row.status == RunStatus::Waiting;
    if paused {
        // Stopped before its next step; a run that has not started only waits longer.
        if !started_waiting && !tick.row.paused {
            tick.push(LogEvent::WorkflowRunPaused(proto::WorkflowRunPaused {
                run_id: tick.row.run_id.clone().into(),
                space_id: tick.space(),
                at_ms: now,
            }));
        }
        tick.row.paused = true;
        tick.due_ms = None;
        tick.guards.push(still_paused(&tick.row.workflow_id));
        return Ok(tick);
    }
    if tick.row.paused {
        tick.row.paused = false;
        if !started_waiting {
            tick.push(LogEvent::WorkflowRunResumed(proto::WorkflowRunResumed {
                run_id: tick.row.run_id.clone().into(),
                space_id: tick.space(),
                at_ms: now,
            }));
        }
    }
    let mut call_outcome = given.call_outcome;
    for _ in 0..STEPS_PER_TICK {
        if tick.finished || tick.call.is_some() || tick.due_ms.is_some() {
            break;
        }
        if tick.row.status == RunStatus::Waiting {
            tick.push(LogEvent::WorkflowRunStarted(proto::WorkflowRunStarted {
                run_id: tick.row.run_id.clone().into(),
                space_id: tick.space(),
                at_ms: now,
            }));
            tick.row.status = RunStatus::Running;
            // The entry is the run's first record: the trigger, as a journey shows it.
            tick.row.step_id = Some(definition.entry.clone());
            continue;
        }
        if let Some(in_flight) = tick.row.in_flight.clone() {
            let Some(step) = definition.step(&in_flight.step_id) else {
                return Err(Stop::Failed(anyhow::anyhow!(
                    "run {} is in step {}, which its workflow has not",
                    tick.row.run_id,
                    in_flight.step_id
                )));
            };
            steps::resume(&mut tick, step, &in_flight, &mut call_outcome, (&input, facts, given))?;
            if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
                tick.end(RunStatus::Completed, None, now);
            }
            continue;
        }
        let Some(step_id) = tick.row.step_id.clone() else {
            tick.end(RunStatus::Completed, None, now);
            continue;
        };
        let Some(step) = definition.step(&step_id) else {
            return Err(Stop::Failed(anyhow::anyhow!(
                "run {} goes to step {step_id}, which its workflow has not",
                tick.row.run_id
            )));
        };
        if tick.row.step_count >= domain::workflows::MAX_STEP_COUNT {
            let started = tick.start(step, now);
            tick.fail(&started, "step_limit", "the run executed too many steps".to_owned(), now);
            continue;
        }
        if step.kind.needs_contact() {
            match facts.contact()? {
                ContactFacts::None => {
                    let started = tick.start(step, now);
                    let message = format!("step {:?} needs a contact and the run has none", step.id);
                    tick.fail(&started, "no_contact", message, now);
                    continue;
                }
                ContactFacts::Gone => {
                    tick.end(
                        RunStatus::Exited,
                        Some(("contact_erased", "the run's contact was deleted".to_owned())),
                        now,
                    );
                    continue;
                }
                ContactFacts::Live(_) => {}
            }
        }
        let effect = steps::execute(&mut tick, step, &input, facts, (given, allowance_refused))?;
        if tick.row.step_id.is_none() && tick.row.in_flight.is_none() && !tick.finished {
            tick.end(RunStatus::Completed, None, now);
        }
        if effect {
            break;
        }
    }
    if !tick.finished && tick.due_ms.is_none() {
        // More steps to go (or a call's outcome, which the row's lease keeps for this process
        // until it runs out or the process stops beating): due again at once.
        tick.due_ms = Some(now);
    }
    Ok(tick)
}

/// The guard that parks a run only while its workflow is still paused (an unpause that
/// commits first wakes nothing this park would then hide).
fn still_paused(workflow_id: &str) -> Guard {
    Guard::exactly_one(
        "SELECT 1 FROM workflow_controls WHERE workflow_id = $1 AND paused FOR SHARE",
        vec![Box::new(workflow_id.to_owned())],
        AppendError::Conflict { code: Code::ConcurrentModification, message: "the workflow was unpaused".to_owned() },
    )
}

#[cfg(test)]
mod tests;
