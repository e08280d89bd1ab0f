//! The workflow decisions: reading a trigger's input, and whether a workflow takes a run or
//! changes its pause. Pure.

use domain::workflows::{MAX_INPUT_BYTES, Status, WorkflowDef};
use serde_json::{Map, Value, json};

/// Why a workflow request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No such workflow (or reference id) in the caller's space (404 `workflow_not_found`).
    #[error("no workflow {0:?} in this space")]
    NotFound(String),
    /// A draft takes no runs and cannot be paused (409 `workflow_not_published`).
    #[error("workflow {0} is a draft; publish it in the workspace file first")]
    NotPublished(String),
    /// The input is not a run's input (400 `invalid_workflow_input`).
    #[error("{0}")]
    InvalidInput(String),
}

/// A trigger's body read: the run's input, and the contact's record input when it names one.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    pub input: Value,
    pub contact: Option<Map<String, Value>>,
}

/// Reads a trigger's body: any JSON object of at most 256 KiB; `contact`, when present and not
/// null, is an object naming the contact (`id`, `email` or `userId`) with attributes to write.
pub(crate) fn parse_input(body: Map<String, Value>) -> Result<Input, Refusal> {
    let size = Value::Object(body.clone()).to_string().len();
    if size > MAX_INPUT_BYTES {
        return Err(Refusal::InvalidInput(format!(
            "the input is {size} bytes of JSON; a run's input is at most {MAX_INPUT_BYTES}"
        )));
    }
    let contact = match body.get("contact") {
        None | Some(Value::Null) => None,
        Some(Value::Object(contact)) => {
            if !["id", "email", "userId"].iter().any(|key| contact.get(*key).is_some_and(|value| !value.is_null())) {
                return Err(Refusal::InvalidInput("contact must name the contact by id, email or userId".to_owned()));
            }
            Some(contact.clone())
        }
        Some(_) => {
            return Err(Refusal::InvalidInput(
                "contact must be an object naming the contact by id, email or userId".to_owned(),
            ));
        }
    };
    Ok(Input { input: Value::Object(body), contact })
}

/// Whether `definition` takes a run: only a published workflow does (a paused one takes it and
/// lets it wait).
pub(crate) fn check_trigger(workflow_id: &str, definition: &WorkflowDef) -> Result<(), Refusal> {
    match definition.status {
        Status::Published => Ok(()),
        Status::Draft => Err(Refusal::NotPublished(workflow_id.to_owned())),
    }
}

/// What a pause or an unpause does to a workflow that is `paused` now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseChange {
    /// Append the change.
    Change,
    /// It is so already: a success that changes nothing.
    Same,
}

/// A pause (`pause: true`) or unpause of a workflow: a draft cannot be paused.
pub(crate) fn decide_pause(
    workflow_id: &str,
    definition: &WorkflowDef,
    paused: bool,
    pause: bool,
) -> Result<PauseChange, Refusal> {
    if definition.status == Status::Draft {
        return Err(Refusal::NotPublished(workflow_id.to_owned()));
    }
    Ok(if paused == pause { PauseChange::Same } else { PauseChange::Change })
}

/// A run as the API shows it when it was just requested.
pub(crate) fn requested_run(
    run_id: &str,
    workflow_id: &str,
    contact_id: Option<&str>,
    reference_id: &str,
    requested_at_ms: i64,
) -> Value {
    json!({
        "id": run_id,
        "workflowId": workflow_id,
        "status": "waiting",
        "contactId": contact_id,
        "trigger": {"type": "webhook", "id": reference_id},
        "requestedAt": platform::time::format_millis(requested_at_ms),
        "startedAt": null,
        "finishedAt": null,
        "stepCount": 0,
        "currentStepId": null,
        "error": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    #[test]
    fn given_a_body_when_read_then_contact_is_split_out_and_size_is_bounded() {
        let read = parse_input(body(json!({"plan": "pro", "contact": {"email": "a@b.c"}}))).expect("valid");
        assert_eq!(read.contact, Some(body(json!({"email": "a@b.c"}))));
        assert_eq!(read.input["plan"], "pro");
        assert_eq!(parse_input(body(json!({}))).expect("valid").contact, None);
        for bad in [json!({"contact": "a@b.c"}), json!({"contact": {"plan": "pro"}})] {
            assert!(matches!(parse_input(body(bad.clone())), Err(Refusal::InvalidInput(_))), "{bad}");
        }
        let huge = json!({"blob": "x".repeat(MAX_INPUT_BYTES)});
        assert!(matches!(parse_input(body(huge)), Err(Refusal::InvalidInput(_))));
    }

    fn definition(status: Status) -> WorkflowDef {
        WorkflowDef {
            slug: "w".into(),
            name: "W".into(),
            status,
            contact_schema_id: "sch_1".into(),
            entry: "start".into(),
            reference_id: "ref".into(),
            steps: Vec::new(),
            triggers: Vec::new(),
            signing: None,
        }
    }

    #[test]
    fn given_a_draft_when_triggered_or_paused_then_refused() {
        assert_eq!(check_trigger("wf_1", &definition(Status::Draft)), Err(Refusal::NotPublished("wf_1".into())));
        assert_eq!(check_trigger("wf_1", &definition(Status::Published)), Ok(()));
        let draft = decide_pause("wf_1", &definition(Status::Draft), false, true);
        assert_eq!(draft, Err(Refusal::NotPublished("wf_1".into())));
    }

    #[test]
    fn given_a_pause_state_when_paused_or_unpaused_then_only_a_change_appends() {
        let published = definition(Status::Published);
        assert_eq!(decide_pause("wf_1", &published, false, true), Ok(PauseChange::Change));
        assert_eq!(decide_pause("wf_1", &published, true, true), Ok(PauseChange::Same));
        assert_eq!(decide_pause("wf_1", &published, true, false), Ok(PauseChange::Change));
        assert_eq!(decide_pause("wf_1", &published, false, false), Ok(PauseChange::Same));
    }
}
