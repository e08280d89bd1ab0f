//! What a new revision of a workflow does with the runs in flight on earlier revisions (its
//! `inFlight` rule), and the migration decision: where a run's step goes in the new revision,
//! and whether a migration leaves a step that holds runs without a place. Pure: no IO.
//!
//! - `pin` (the default): runs finish on the revision they started on; new runs take the new
//!   one.
//! - `exit`: runs in flight end, `exited`, with the revision as the reason.
//! - `migrate`: each run moves to the new revision at the step its step maps to. A step maps to
//!   the step `steps` names, else to the step of the same id and type in the new revision. A
//!   run in a wait or a webhook call (a step in flight) maps only to a step of the same type,
//!   and keeps its due time (or its call) unless the target is listed in `replan`, whose waits
//!   are planned again from when the run entered the wait. A run about to execute a step maps
//!   to a step of any type, which it executes next.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{DefinitionError, Status, Step, StepKind, Wait, WorkflowDef};

/// What a revision does with the runs in flight on earlier revisions when it is published.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "runs", rename_all = "snake_case", rename_all_fields = "camelCase")]
pub enum InFlightRule {
    #[default]
    Pin,
    Exit,
    Migrate {
        /// Old step id → new step id.
        #[serde(default)]
        steps: BTreeMap<String, String>,
        /// New wait steps whose due time a migrated run plans again.
        #[serde(default)]
        replan: BTreeSet<String>,
    },
}

impl InFlightRule {
    pub fn is_pin(&self) -> bool {
        matches!(self, InFlightRule::Pin)
    }

    /// Whether publishing the revision moves the runs in flight (marks them for the engine).
    pub fn moves_runs(&self) -> bool {
        !self.is_pin()
    }

    pub fn name(&self) -> &'static str {
        match self {
            InFlightRule::Pin => "pin",
            InFlightRule::Exit => "exit",
            InFlightRule::Migrate { .. } => "migrate",
        }
    }
}

/// The error code and message of a run a revision's `exit` ended.
pub fn exited_by(revision: i64) -> (&'static str, String) {
    ("workflow_revised", format!("revision {revision} of the workflow ended the runs in flight"))
}

/// Whether a step kind holds a run in flight across transitions (it sleeps or calls).
pub fn holds_runs(kind: &StepKind) -> bool {
    matches!(
        kind,
        StepKind::Wait { .. }
            | StepKind::WaitForEvent { .. }
            | StepKind::WaitForEngagement { .. }
            | StepKind::CallWebhook { .. }
    )
}

fn is_wait(kind: &StepKind) -> bool {
    matches!(kind, StepKind::Wait { .. } | StepKind::WaitForEvent { .. } | StepKind::WaitForEngagement { .. })
}

/// Why a run's step has no place in the new revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmapped {
    /// Neither the mapping nor a step of the same id and type gives one.
    NoTarget,
    /// The mapping names a step the new revision has not.
    Missing(String),
    /// The step is in flight and the target is of another type.
    OtherType { target: String, target_type: &'static str },
}

/// Where a run at `step_id` of the old revision goes in `new` under `steps` (`in_flight`: the
/// run is in that step, sleeping or calling, of type `step_type`; otherwise it is to execute it).
pub fn target<'a>(
    steps: &BTreeMap<String, String>,
    new: &'a WorkflowDef,
    (step_id, step_type): (&str, &str),
    in_flight: bool,
) -> Result<&'a Step, Unmapped> {
    let found = match steps.get(step_id) {
        Some(named) => new.step(named).ok_or_else(|| Unmapped::Missing(named.clone()))?,
        None => match new.step(step_id) {
            Some(same) if same.kind.type_name() == step_type => same,
            _ => return Err(Unmapped::NoTarget),
        },
    };
    if in_flight && found.kind.type_name() != step_type {
        return Err(Unmapped::OtherType { target: found.id.clone(), target_type: found.kind.type_name() });
    }
    Ok(found)
}

/// The steps that hold open runs of earlier revisions: revision, step id, the step's type in
/// that revision (empty: runs that have not started), and how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Active {
    pub revision: i64,
    pub step_id: String,
    pub step_type: String,
    pub runs: i64,
}

/// Checks a new revision's `inFlight` rule against the runs in flight: a draft moves no runs;
/// `migrate`'s mapping names steps of the new revision, replans waits only, and gives every
/// step that holds open runs a place (a step that holds runs in flight, a place of its type).
pub fn check_in_flight(new: &WorkflowDef, active: &[Active]) -> Result<(), DefinitionError> {
    let (steps, replan) = match &new.in_flight {
        InFlightRule::Pin => return Ok(()),
        _ if new.status == Status::Draft => {
            return Err(DefinitionError(format!(
                "inFlight {:?} moves runs to this revision, which is a draft: publish it to move runs",
                new.in_flight.name()
            )));
        }
        InFlightRule::Exit => return Ok(()),
        InFlightRule::Migrate { steps, replan } => (steps, replan),
    };
    for (from, to) in steps {
        if new.step(to).is_none() {
            return Err(DefinitionError(format!(
                "inFlight.migrate.steps maps {from:?} to {to:?}, which is not a step"
            )));
        }
    }
    for id in replan {
        match new.step(id) {
            Some(step) if is_wait(&step.kind) => {}
            Some(step) => {
                return Err(DefinitionError(format!(
                    "inFlight.migrate.replan names {id:?}, a {} step: only waits are planned again",
                    step.kind.type_name()
                )));
            }
            None => return Err(DefinitionError(format!("inFlight.migrate.replan names {id:?}, which is not a step"))),
        }
    }
    for active in active.iter().filter(|active| !active.step_id.is_empty()) {
        let in_flight = holds_runs_by_name(&active.step_type);
        match target(steps, new, (&active.step_id, &active.step_type), in_flight) {
            Ok(_) => {}
            Err(Unmapped::NoTarget) => {
                return Err(DefinitionError(format!(
                    "step {:?} of revision {} holds {} open run(s) and has no place in this revision: map it in \
                     inFlight.migrate.steps (or pin or exit the runs)",
                    active.step_id, active.revision, active.runs
                )));
            }
            Err(Unmapped::Missing(named)) => {
                return Err(DefinitionError(format!(
                    "inFlight.migrate.steps maps {:?} to {named:?}, which is not a step",
                    active.step_id
                )));
            }
            Err(Unmapped::OtherType { target, target_type }) => {
                return Err(DefinitionError(format!(
                    "step {:?} ({}) of revision {} holds {} run(s) in flight and maps to {target:?}, a {target_type} \
                     step: a run in a wait or a call moves to a step of the same type",
                    active.step_id, active.step_type, active.revision, active.runs
                )));
            }
        }
    }
    Ok(())
}

fn holds_runs_by_name(step_type: &str) -> bool {
    ["wait", "wait_for_event", "wait_for_engagement", "call_webhook"].contains(&step_type)
}

/// When a wait `step` entered at `entered_ms` ends when it is planned again: a duration from
/// when the run entered it, a fixed time, or a timeout from then. `None` for a wait on a
/// contact's date attribute (planned from the contact: see [`attribute_wait`]) and for any other
/// step.
pub fn replanned_until(step: &Step, entered_ms: i64) -> Option<i64> {
    match &step.kind {
        StepKind::Wait { wait: Wait::For { ms }, .. } => Some(entered_ms.saturating_add(*ms)),
        StepKind::Wait { wait: Wait::Until { at_ms }, .. } => Some(*at_ms),
        StepKind::WaitForEvent { timeout_ms, .. } | StepKind::WaitForEngagement { timeout_ms, .. } => {
            Some(entered_ms.saturating_add(*timeout_ms))
        }
        _ => None,
    }
}

/// The attribute and offset of a wait on a contact's date attribute.
pub fn attribute_wait(step: &Step) -> Option<(&str, i64)> {
    match &step.kind {
        StepKind::Wait { wait: Wait::UntilAttribute { attribute, offset_ms }, .. } => {
            Some((attribute.as_str(), *offset_ms))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::{EngagementAction, Status, Step, StepKind, WorkflowDef};

    fn step(id: &str, kind: StepKind) -> Step {
        Step { id: id.into(), kind }
    }

    fn wait(ms: i64, next: Option<&str>) -> StepKind {
        StepKind::Wait { wait: Wait::For { ms }, next: next.map(Into::into) }
    }

    fn workflow(steps: Vec<Step>, in_flight: InFlightRule) -> WorkflowDef {
        WorkflowDef {
            slug: "w".into(),
            name: "W".into(),
            status: Status::Published,
            contact_schema_id: "sch_1".into(),
            entry: "start".into(),
            reference_id: "ref".into(),
            steps: [vec![step("start", StepKind::IncomingWebhook { reference_id: "ref".into(), next: None })], steps]
                .concat(),
            triggers: vec![],
            signing: None,
            in_flight,
        }
    }

    fn migrate(steps: &[(&str, &str)], replan: &[&str]) -> InFlightRule {
        InFlightRule::Migrate {
            steps: steps.iter().map(|(a, b)| ((*a).into(), (*b).into())).collect(),
            replan: replan.iter().map(|id| (*id).into()).collect(),
        }
    }

    fn active(step_id: &str, step_type: &str, runs: i64) -> Active {
        Active { revision: 1, step_id: step_id.into(), step_type: step_type.into(), runs }
    }

    /// A new revision with a wait `nap`, a send `hello`, an event wait `heard`, an engagement
    /// wait `seen`, a call `tell` and a branch `pick`.
    fn new_revision(in_flight: InFlightRule) -> WorkflowDef {
        workflow(
            vec![
                step("nap", wait(60_000, Some("hello"))),
                step("hello", StepKind::SendEmail { template_id: "tpl".into(), next: Some("heard".into()) }),
                step(
                    "heard",
                    StepKind::WaitForEvent {
                        event_schema_id: "sch_e".into(),
                        timeout_ms: 1_000,
                        on_event: None,
                        on_timeout: Some("seen".into()),
                    },
                ),
                step(
                    "seen",
                    StepKind::WaitForEngagement {
                        step: "hello".into(),
                        action: EngagementAction::Opened,
                        timeout_ms: 5_000,
                        on_engaged: None,
                        on_timeout: Some("tell".into()),
                    },
                ),
                step("tell", StepKind::CallWebhook { url: "https://x.test".into(), next: Some("pick".into()) }),
                step("pick", StepKind::Branch { arms: vec![], default: None }),
            ],
            in_flight,
        )
    }

    #[test]
    fn a_step_maps_to_the_named_step_else_to_the_same_id_and_type() {
        let new = new_revision(InFlightRule::Pin);
        let steps: BTreeMap<String, String> = [("old_nap".to_owned(), "nap".to_owned())].into();
        assert_eq!(target(&steps, &new, ("old_nap", "wait"), true).map(|s| s.id.as_str()), Ok("nap"));
        assert_eq!(target(&steps, &new, ("nap", "wait"), true).map(|s| s.id.as_str()), Ok("nap"));
        // The same id of another type is no place.
        assert_eq!(target(&steps, &new, ("nap", "wait_for_event"), true), Err(Unmapped::NoTarget));
        assert_eq!(target(&steps, &new, ("gone", "send_email"), false), Err(Unmapped::NoTarget));
    }

    #[test]
    fn a_run_in_flight_moves_only_to_a_step_of_its_type_and_a_run_about_to_execute_to_any() {
        let new = new_revision(InFlightRule::Pin);
        let steps: BTreeMap<String, String> =
            [("old_nap".to_owned(), "hello".to_owned()), ("old_call".to_owned(), "tell".to_owned())].into();
        assert_eq!(
            target(&steps, &new, ("old_nap", "wait"), true),
            Err(Unmapped::OtherType { target: "hello".into(), target_type: "send_email" })
        );
        assert_eq!(target(&steps, &new, ("old_nap", "wait"), false).map(|s| s.id.as_str()), Ok("hello"));
        assert_eq!(target(&steps, &new, ("old_call", "call_webhook"), true).map(|s| s.id.as_str()), Ok("tell"));
        let missing: BTreeMap<String, String> = [("x".to_owned(), "nowhere".to_owned())].into();
        assert_eq!(target(&missing, &new, ("x", "wait"), true), Err(Unmapped::Missing("nowhere".into())));
    }

    #[test]
    fn migrate_is_refused_when_a_step_with_open_runs_has_no_place_naming_it() {
        let new = new_revision(migrate(&[], &[]));
        let error = check_in_flight(&new, &[active("nap", "wait", 3), active("old_wait", "wait", 12)])
            .expect_err("old_wait has no place");
        assert!(error.0.contains("\"old_wait\" of revision 1 holds 12 open run(s)"), "{}", error.0);
        // Runs that have not started go to the new entry; a step whose runs are all gone needs nothing.
        assert_eq!(check_in_flight(&new, &[active("", "", 40), active("nap", "wait", 1)]), Ok(()));
        let mapped = new_revision(migrate(&[("old_wait", "nap")], &[]));
        assert_eq!(check_in_flight(&mapped, &[active("old_wait", "wait", 12)]), Ok(()));
    }

    #[test]
    fn every_kind_of_step_in_flight_maps_only_to_its_own_kind() {
        for (kind, same) in
            [("wait", "nap"), ("wait_for_event", "heard"), ("wait_for_engagement", "seen"), ("call_webhook", "tell")]
        {
            let fits = new_revision(migrate(&[("old", same)], &[]));
            assert_eq!(check_in_flight(&fits, &[active("old", kind, 1)]), Ok(()), "{kind}");
            let other = if same == "nap" { "heard" } else { "nap" };
            let misfit = new_revision(migrate(&[("old", other)], &[]));
            let error = check_in_flight(&misfit, &[active("old", kind, 1)]).expect_err(kind);
            assert!(error.0.contains("moves to a step of the same type"), "{}", error.0);
        }
        // Runs about to execute a step (a send, a branch, an update) may go anywhere.
        for kind in ["send_email", "branch", "update_contact", "subscribe", "unsubscribe", "goto", "exit"] {
            let anywhere = new_revision(migrate(&[("old", "nap")], &[]));
            assert_eq!(check_in_flight(&anywhere, &[active("old", kind, 1)]), Ok(()), "{kind}");
        }
    }

    #[test]
    fn the_mapping_names_steps_of_the_new_revision_and_replans_only_waits() {
        let error =
            check_in_flight(&new_revision(migrate(&[("a", "nowhere")], &[])), &[]).expect_err("nowhere is no step");
        assert!(error.0.contains("\"nowhere\", which is not a step"), "{}", error.0);
        let error = check_in_flight(&new_revision(migrate(&[], &["hello"])), &[]).expect_err("hello is no wait");
        assert!(error.0.contains("a send_email step: only waits are planned again"), "{}", error.0);
        assert_eq!(check_in_flight(&new_revision(migrate(&[], &["nap", "heard", "seen"])), &[]), Ok(()));
    }

    #[test]
    fn a_draft_moves_no_runs_and_pin_and_exit_need_no_mapping() {
        let mut draft = new_revision(InFlightRule::Exit);
        draft.status = Status::Draft;
        assert!(check_in_flight(&draft, &[]).is_err());
        draft.in_flight = InFlightRule::Pin;
        assert_eq!(check_in_flight(&draft, &[active("x", "wait", 1)]), Ok(()));
        assert_eq!(check_in_flight(&new_revision(InFlightRule::Exit), &[active("x", "wait", 1)]), Ok(()));
    }

    #[test]
    fn a_replanned_wait_counts_from_when_the_run_entered_it() {
        let new = new_revision(InFlightRule::Pin);
        let at = |id: &str| replanned_until(new.step(id).expect("a step"), 10_000);
        assert_eq!(at("nap"), Some(70_000));
        assert_eq!(at("heard"), Some(11_000));
        assert_eq!(at("seen"), Some(15_000));
        assert_eq!(at("hello"), None);
        let fixed = step("until", StepKind::Wait { wait: Wait::Until { at_ms: 5 }, next: None });
        assert_eq!(replanned_until(&fixed, 10_000), Some(5));
    }

    #[test]
    fn the_rule_reads_and_writes_as_the_catalog_keeps_it_and_pin_is_left_out() {
        let rule = migrate(&[("a", "b")], &["b"]);
        let json = serde_json::to_value(&rule).expect("json");
        assert_eq!(json, serde_json::json!({"runs": "migrate", "steps": {"a": "b"}, "replan": ["b"]}));
        assert_eq!(serde_json::from_value::<InFlightRule>(json).expect("back"), rule);
        let pinned = serde_json::to_value(new_revision(InFlightRule::Pin)).expect("json");
        assert!(pinned.get("inFlight").is_none(), "a pinned definition reads as one made before the rule existed");
    }
}
