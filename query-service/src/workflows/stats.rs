//! A workflow's counts as `GET /workflows/{id}/stats` shows them: its runs by status (in all,
//! and by the revision they follow), and per step (in the definition's order) how many runs
//! entered it, finished it under each status, skipped it by reason, and for a send step what
//! became of its emails. Pure: the counters come in as the read models keep them.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// The statuses a run is counted under.
const RUN_STATUSES: [&str; 6] = ["waiting", "running", "sleeping", "completed", "exited", "failed"];
/// The statuses a finished step is counted under, with the names the API shows. `migrated`: the
/// run moved to a newer revision while in the step; `exited`: a newer revision's `exit` ended the
/// run while in it.
const STEP_STATUSES: [(&str, &str); 6] = [
    ("completed", "completed"),
    ("failed", "failed"),
    ("outcome_unknown", "outcomeUnknown"),
    ("timed_out", "timedOut"),
    ("migrated", "migrated"),
    ("exited", "exited"),
];
/// The email counters, as `email_counts` names its columns and as the API shows them.
pub(super) const EMAIL_FIELDS: [(&str, &str); 10] = [
    ("scheduled", "scheduled"),
    ("sent", "sent"),
    ("failed", "failed"),
    ("outcome_unknown", "outcomeUnknown"),
    ("bounced", "bounced"),
    ("complained", "complained"),
    ("unsubscribed", "unsubscribed"),
    ("opened", "opened"),
    ("clicked", "clicked"),
    ("held", "held"),
];

/// What the read models hold for one workflow.
#[derive(Debug, Default)]
pub(super) struct Counters {
    /// Runs by status.
    pub runs: BTreeMap<String, i64>,
    /// Revision → the runs that follow it, by status.
    pub by_revision: BTreeMap<i64, BTreeMap<String, i64>>,
    /// (step, measure) → total: `entered`, a finished status, `skipped:<reason>`.
    pub steps: BTreeMap<(String, String), i64>,
    /// Send step → its email counters, by column name.
    pub emails: BTreeMap<String, BTreeMap<String, i64>>,
}

/// A share to four decimals; `None` over nothing.
fn rate(part: i64, whole: i64) -> Option<f64> {
    (whole > 0).then(|| (part as f64 / whole as f64 * 10_000.0).round() / 10_000.0)
}

/// The email counters of a send step (zeros until one is counted), with the rates over the
/// delivered emails (sent less bounced).
pub(super) fn email_counts(counters: Option<&BTreeMap<String, i64>>) -> Value {
    let get = |column: &str| counters.and_then(|counters| counters.get(column)).copied().unwrap_or(0);
    let mut out = Map::new();
    for (column, name) in EMAIL_FIELDS {
        out.insert(name.to_owned(), json!(get(column)));
    }
    let delivered = get("sent") - get("bounced");
    out.insert("openRate".to_owned(), json!(rate(get("opened"), delivered)));
    out.insert("clickRate".to_owned(), json!(rate(get("clicked"), delivered)));
    Value::Object(out)
}

/// Runs by status, every status shown (zero until one is counted).
fn runs_by_status(counts: &BTreeMap<String, i64>) -> Value {
    let runs: Map<String, Value> = RUN_STATUSES
        .iter()
        .map(|status| ((*status).to_owned(), json!(counts.get(*status).copied().unwrap_or(0))))
        .collect();
    Value::Object(runs)
}

/// The stats document of the workflow `document` (as `GET /workflows/{id}` shows it).
pub(super) fn document(workflow: &Value, counters: &Counters) -> Value {
    let runs = runs_by_status(&counters.runs);
    // Keyed by the revision's number, as JSON keys are strings.
    let by_revision: Map<String, Value> = counters
        .by_revision
        .iter()
        .map(|(revision, counts)| (revision.to_string(), json!({"runs": runs_by_status(counts)})))
        .collect();
    let steps: Vec<Value> = workflow["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|step| {
            let id = step["id"].as_str().unwrap_or_default();
            let kind = step["type"].as_str().unwrap_or_default();
            let count = |measure: &str| counters.steps.get(&(id.to_owned(), measure.to_owned())).copied().unwrap_or(0);
            // Every skip has a reason (a gate or an error code), counted beside the total.
            let mut skipped = Map::new();
            for ((step_id, measure), total) in &counters.steps {
                if let Some(reason) = measure.strip_prefix("skipped:").filter(|_| step_id == id) {
                    skipped.insert(reason.to_owned(), json!(total));
                }
            }
            let finished: i64 = STEP_STATUSES.iter().map(|(status, _)| count(status)).sum::<i64>() + count("skipped");
            let mut out = Map::new();
            out.insert("stepId".to_owned(), json!(id));
            out.insert("type".to_owned(), json!(kind));
            out.insert("entered".to_owned(), json!(count("entered")));
            out.insert("inProgress".to_owned(), json!((count("entered") - finished).max(0)));
            for (status, name) in STEP_STATUSES {
                out.insert(name.to_owned(), json!(count(status)));
            }
            out.insert("skipped".to_owned(), json!({"total": count("skipped"), "byReason": skipped}));
            let emails = (kind == "send_email").then(|| email_counts(counters.emails.get(id)));
            out.insert("emails".to_owned(), json!(emails));
            Value::Object(out)
        })
        .collect();
    json!({"workflowId": workflow["id"], "runs": runs, "byRevision": by_revision, "steps": steps})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_counters_when_shown_then_every_step_is_listed_in_order_with_its_skips_and_send_steps_have_email_counts() {
        let workflow = json!({"id": "wf_1", "steps": [
            {"id": "in", "type": "incoming_webhook"},
            {"id": "send", "type": "send_email"},
            {"id": "pause", "type": "wait"},
        ]});
        let step = |id: &str, measure: &str| (id.to_owned(), measure.to_owned());
        let counters = Counters {
            runs: [("completed".to_owned(), 3), ("sleeping".to_owned(), 1)].into(),
            by_revision: [
                (1, [("completed".to_owned(), 3), ("sleeping".to_owned(), 0)].into()),
                (2, [("sleeping".to_owned(), 1)].into()),
            ]
            .into(),
            steps: [
                (step("in", "entered"), 4),
                (step("in", "completed"), 4),
                (step("send", "entered"), 4),
                (step("send", "completed"), 2),
                (step("send", "skipped"), 2),
                (step("send", "skipped:consent"), 1),
                (step("send", "skipped:suppressed"), 1),
                (step("pause", "entered"), 4),
                (step("pause", "completed"), 1),
                (step("pause", "migrated"), 1),
                (step("pause", "exited"), 1),
            ]
            .into(),
            emails: [(
                "send".to_owned(),
                [("scheduled", 2), ("sent", 2), ("bounced", 1), ("opened", 1)]
                    .map(|(name, total)| (name.to_owned(), total))
                    .into(),
            )]
            .into(),
        };
        let stats = document(&workflow, &counters);
        assert_eq!(
            stats["runs"],
            json!({"waiting": 0, "running": 0, "sleeping": 1, "completed": 3, "exited": 0, "failed": 0})
        );
        let ids: Vec<&Value> = stats["steps"].as_array().expect("steps").iter().map(|step| &step["stepId"]).collect();
        assert_eq!(ids, [&json!("in"), &json!("send"), &json!("pause")]);
        let send = &stats["steps"][1];
        assert_eq!(send["skipped"], json!({"total": 2, "byReason": {"consent": 1, "suppressed": 1}}));
        assert_eq!((&send["entered"], &send["completed"], &send["inProgress"]), (&json!(4), &json!(2), &json!(0)));
        assert_eq!(send["emails"]["openRate"], json!(1.0), "one opened of one delivered");
        assert_eq!(send["emails"]["clicked"], json!(0));
        assert_eq!(
            stats["steps"][2]["inProgress"],
            json!(1),
            "one run still waits; one left it for a new revision, one was ended by one"
        );
        assert_eq!((&stats["steps"][2]["migrated"], &stats["steps"][2]["exited"]), (&json!(1), &json!(1)));
        assert_eq!(
            stats["byRevision"],
            json!({
                "1": {"runs": {"waiting": 0, "running": 0, "sleeping": 0, "completed": 3, "exited": 0, "failed": 0}},
                "2": {"runs": {"waiting": 0, "running": 0, "sleeping": 1, "completed": 0, "exited": 0, "failed": 0}},
            })
        );
        assert!(stats["steps"][0]["emails"].is_null(), "only send steps have emails");
    }

    #[test]
    fn given_no_delivered_email_when_rated_then_the_rates_are_null() {
        let counts = email_counts(None);
        assert!(counts["openRate"].is_null() && counts["clickRate"].is_null());
        assert_eq!(counts["sent"], json!(0));
        assert_eq!(rate(1, 3), Some(0.3333));
    }
}
