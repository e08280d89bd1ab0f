//! What a replay found, and how the operator command prints it.

use std::collections::BTreeMap;

use domain::workflows::WorkflowDef;
use serde::Serialize;

use super::Elapsed;

/// What a replay found.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub from: String,
    pub to: String,
    /// Log events of the space read in the window (of the kinds a journey reacts to).
    pub events_read: u64,
    /// Runs started: contacts that would have entered (a contact may enter more than once
    /// under `always`).
    pub entered: u64,
    /// Trigger matches the re-entry rule held back.
    pub held_back: u64,
    pub completed: u64,
    pub exited: u64,
    pub failed: u64,
    /// Runs still open at the window's end, by the step they are in (the one in flight, or the
    /// one they execute next); `notStarted` for none yet.
    pub at_step: BTreeMap<String, u64>,
    /// Each step's executions: started, and finished by status.
    pub steps: BTreeMap<String, StepCounts>,
    /// Emails scheduled, and held by the send policy's quiet hours or caps (stored for later).
    pub sends: u64,
    pub held: u64,
    /// Sends skipped, by the gate that refused them.
    pub skips: BTreeMap<String, u64>,
    /// Webhook calls the runs would have made.
    pub calls: u64,
    /// The most runs open at once.
    pub peak_open: u64,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepCounts {
    pub started: u64,
    pub completed: u64,
    pub skipped: u64,
    pub failed: u64,
}

/// A report as the operator command prints it.
pub fn describe(definition: &WorkflowDef, workflow_id: &str, report: &Report, elapsed: Elapsed) -> String {
    let slug = &definition.slug;
    use std::fmt::Write;
    let mut out = String::new();
    let list = |counts: &BTreeMap<String, u64>| -> String {
        if counts.is_empty() {
            return "none".to_owned();
        }
        counts.iter().map(|(name, count)| format!("{name} {count}")).collect::<Vec<_>>().join(", ")
    };
    let open: u64 = report.at_step.values().sum();
    let _ = writeln!(out, "replay of workflow {slug:?} ({workflow_id}) from {} to {}:", report.from, report.to);
    let _ = writeln!(
        out,
        "  read {} events of the space ({} positions of the log) in {:.1} s; nothing was written",
        report.events_read,
        elapsed.events,
        elapsed.ms as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "  entered {} (held back by the re-entry rule {}); completed {}, exited {}, failed {}, open now {}",
        report.entered, report.held_back, report.completed, report.exited, report.failed, open
    );
    let _ = writeln!(out, "  open runs by step now: {}", list(&report.at_step));
    let _ = writeln!(
        out,
        "  emails sent {}, held for later {}; skipped by gate: {}; webhook calls {}",
        report.sends,
        report.held,
        list(&report.skips),
        report.calls
    );
    // Steps in the definition's order.
    let order = |step_id: &str| definition.steps.iter().position(|step| step.id == step_id).unwrap_or(usize::MAX);
    let mut steps: Vec<(&String, &StepCounts)> = report.steps.iter().collect();
    steps.sort_by_key(|(step_id, _)| order(step_id));
    for (step_id, counts) in steps {
        let _ = writeln!(
            out,
            "  step {step_id}: started {}, completed {}, skipped {}, failed {}",
            counts.started, counts.completed, counts.skipped, counts.failed
        );
    }
    out
}
