//! Where a run begins and where it ends: the entry (`incoming_webhook`, the trigger, a run's
//! first record) and `exit`.

use domain::workflows::Step;

use super::super::tick::{RunStatus, Tick};

/// Starts the entry: it completes at once, and the run goes on to its next step.
pub(super) fn start_entry(tick: &mut Tick, step: &Step, next: Option<&str>, now: i64) {
    let started = tick.start(step, now);
    tick.finish(&started, "completed", None, next, now);
}

/// Starts an `exit`: it completes, and the run exits.
pub(super) fn start_exit(tick: &mut Tick, step: &Step, now: i64) {
    let started = tick.start(step, now);
    tick.finish(&started, "completed", None, None, now);
    tick.end(RunStatus::Exited, None, now);
}
