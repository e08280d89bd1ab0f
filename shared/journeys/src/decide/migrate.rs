//! A run's move to a newer revision of its workflow, decided as the first change of the run's
//! transition after the publish marked it (`workflow_runs.migrate_to`): the newer revision's
//! `inFlight` rule says whether the run ends (`exit`) or moves (`migrate`), and where to
//! (`domain::workflows::target`). A run in a wait keeps its due time unless the mapping plans
//! the new wait again; a run about to execute a step executes the mapped one next. A run whose
//! step has no place in the new revision (it reached it after the apply checked the mapping)
//! stays on its revision.

use domain::workflows::{InFlightRule, Step, StepKind, WorkflowDef, attribute_wait, replanned_until, target};
use platform::events::LogEvent;
use platform::proto;
use serde_json::Value;

use super::facts::{ContactFacts, Facts, Stop, email_of};
use super::tick::{InFlight, RunStatus, Tick};

/// What the move came to.
pub(super) enum Outcome {
    /// The run ended (`exit`).
    Exited,
    /// The run is on the new revision now.
    Moved,
    /// The run stays on its revision (the rule pins it, or its step has no place).
    Stays,
}

/// Moves the run in `tick` from `old` to `new` (revision `to_revision`), as `new`'s rule says.
pub(super) fn migrate(
    tick: &mut Tick,
    (old, new, to_revision): (&WorkflowDef, &WorkflowDef, i64),
    facts: &Facts,
    now: i64,
) -> Result<Outcome, Stop> {
    tick.migrated_to = Some(to_revision);
    let nothing = (std::collections::BTreeMap::new(), std::collections::BTreeSet::new());
    let (steps, replan) = match &new.in_flight {
        InFlightRule::Pin => {
            sleep_on(tick, now);
            return Ok(Outcome::Stays);
        }
        // A run that has not started has done nothing yet: it starts on the new revision.
        InFlightRule::Exit if tick.row.status == RunStatus::Waiting && tick.row.step_count == 0 => {
            (&nothing.0, &nothing.1)
        }
        InFlightRule::Exit => {
            let (code, message) = domain::workflows::exited_by(to_revision);
            if let Some(in_flight) = tick.row.in_flight.clone() {
                tick.finish(&in_flight, "exited", Some((code, message.clone())), None, now);
            }
            tick.end(RunStatus::Exited, Some((code, message)), now);
            return Ok(Outcome::Exited);
        }
        InFlightRule::Migrate { steps, replan } => (steps, replan),
    };
    let from_revision = tick.row.revision;
    let mut migrated = proto::WorkflowRunMigrated {
        run_id: tick.row.run_id.clone().into(),
        space_id: tick.space(),
        from_revision,
        to_revision,
        at_ms: now,
        ..Default::default()
    };
    if let Some(in_flight) = tick.row.in_flight.clone() {
        let Ok(to) = target(steps, new, (&in_flight.step_id, &in_flight.step_type), true) else {
            return Ok(stays(tick, &in_flight.step_id, now));
        };
        let replanned = replan.contains(&to.id);
        let until = if replanned { replanned_at(to, in_flight.started_at_ms, facts)? } else { in_flight.until_ms };
        migrated.from_step_id = in_flight.step_id.clone();
        migrated.to_step_id = to.id.clone();
        migrated.replanned = replanned;
        migrated.until_ms = until.unwrap_or(now);
        tick.push(LogEvent::WorkflowRunMigrated(migrated));
        tick.row.revision = to_revision;
        move_in_flight(tick, &in_flight, to, until.unwrap_or(now), now);
        return Ok(Outcome::Moved);
    }
    if let Some(step_id) = tick.row.step_id.clone()
        && tick.row.status != RunStatus::Waiting
    {
        let step_type = old.step(&step_id).map_or("", |step| step.kind.type_name());
        let Ok(to) = target(steps, new, (&step_id, step_type), false) else {
            return Ok(stays(tick, &step_id, now));
        };
        migrated.from_step_id = step_id;
        migrated.to_step_id = to.id.clone();
        tick.row.step_id = Some(to.id.clone());
    }
    // A run that has not started starts at the new entry.
    tick.push(LogEvent::WorkflowRunMigrated(migrated));
    tick.row.revision = to_revision;
    Ok(Outcome::Moved)
}

fn stays(tick: &mut Tick, step_id: &str, now: i64) -> Outcome {
    tracing::warn!(
        run = %tick.row.run_id,
        step = step_id,
        "a run's step has no place in the newer revision; the run stays on its own"
    );
    sleep_on(tick, now);
    Outcome::Stays
}

/// A run the mark woke in a wait that has not ended sleeps again until its time.
fn sleep_on(tick: &mut Tick, now: i64) {
    if let Some(until) = tick.row.in_flight.as_ref().and_then(|step| step.until_ms)
        && until > now
        && tick.row.matched_event.is_none()
    {
        tick.due_ms = Some(until);
    }
}

/// When a replanned wait ends: from when the run entered it, or from the contact's date.
fn replanned_at(to: &Step, entered_ms: i64, facts: &Facts) -> Result<Option<i64>, Stop> {
    if let Some((attribute, offset_ms)) = attribute_wait(to) {
        return Ok(match facts.contact()? {
            ContactFacts::Live(contact) => contact
                .state
                .values()
                .get(attribute)
                .and_then(Value::as_str)
                .and_then(super::steps::parse_date)
                .map(|at| at.saturating_add(offset_ms)),
            _ => None,
        });
    }
    Ok(replanned_until(to, entered_ms))
}

/// The step in flight ends `migrated` and its target starts in flight, due at `until` (a wait
/// whose time has come, or one woken by what it waited for, resumes in this transition).
fn move_in_flight(tick: &mut Tick, in_flight: &InFlight, to: &Step, until: i64, now: i64) {
    let matched = tick.row.matched_event.clone();
    tick.finish(in_flight, "migrated", None, Some(&to.id), now);
    tick.row.matched_event = matched;
    let mut started = tick.start(to, now);
    started.started_at_ms = in_flight.started_at_ms;
    started.attempt = in_flight.attempt;
    started.until_ms = Some(until);
    // What the new wait waits for.
    tick.row.waiting_schema = match &to.kind {
        StepKind::WaitForEvent { event_schema_id, .. } => Some(event_schema_id.clone()),
        StepKind::WaitForEngagement { step, action, .. } => {
            email_of(&tick.outputs, step).map(|email_id| action.waiting_key(&email_id))
        }
        _ => None,
    };
    tick.row.in_flight = Some(started.clone());
    let woken = tick.row.matched_event.is_some();
    if until > now && !woken {
        if matches!(to.kind, StepKind::CallWebhook { .. }) {
            tick.row.status = RunStatus::Running;
        } else {
            tick.push(LogEvent::WorkflowRunSleeping(proto::WorkflowRunSleeping {
                run_id: tick.row.run_id.clone().into(),
                space_id: tick.space(),
                index: started.index,
                until_ms: until,
                event_schema_id: match &to.kind {
                    StepKind::WaitForEvent { event_schema_id, .. } => event_schema_id.clone(),
                    _ => String::new(),
                },
                at_ms: now,
            }));
            tick.row.status = RunStatus::Sleeping;
        }
        tick.due_ms = Some(until);
    } else {
        tick.row.status = RunStatus::Sleeping;
    }
}
