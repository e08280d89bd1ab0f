//! A workflow's revisions as `GET /workflows/{id}/revisions` (and the `revisions` of `GET
//! /workflows/{id}`) show them: each as defined, with where its open runs are. Pure: the rows
//! come in as the read model keeps them.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// A revision as the read model keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Revision {
    pub revision: i64,
    /// `published` or `draft`.
    pub status: String,
    /// The `inFlight` rule, as the API shows it.
    pub in_flight: Value,
    /// When it was defined, as the API shows times.
    pub defined_at: String,
}

/// A revision's open runs (waiting, running or sleeping) by the step they are at (`None`:
/// not started).
pub(super) type OpenRuns = BTreeMap<i64, BTreeMap<Option<String>, i64>>;

/// The revisions, newest first: the newest is `current`; an older one is `draining` while runs
/// still follow it, `drained` once none do.
pub(super) fn document(mut revisions: Vec<Revision>, open_runs: &OpenRuns) -> Value {
    revisions.sort_by_key(|revision| std::cmp::Reverse(revision.revision));
    let current = revisions.first().map(|revision| revision.revision);
    let shown: Vec<Value> = revisions
        .into_iter()
        .map(|revision| {
            let by_step = open_runs.get(&revision.revision);
            let not_started = by_step.and_then(|steps| steps.get(&None)).copied().unwrap_or(0);
            let steps: Map<String, Value> = by_step
                .into_iter()
                .flatten()
                .filter_map(|(step_id, runs)| step_id.as_ref().map(|step_id| (step_id.clone(), json!(runs))))
                .collect();
            let open: i64 = by_step.into_iter().flat_map(BTreeMap::values).sum();
            let state = match (Some(revision.revision) == current, open) {
                (true, _) => "current",
                (false, 0) => "drained",
                (false, _) => "draining",
            };
            json!({
                "revision": revision.revision,
                "status": revision.status,
                "inFlight": revision.in_flight,
                "definedAt": revision.defined_at,
                "state": state,
                "openRuns": open,
                "notStarted": not_started,
                "steps": steps,
            })
        })
        .collect();
    Value::Array(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(revision: i64, in_flight: Value) -> Revision {
        Revision {
            revision,
            status: "published".to_owned(),
            in_flight,
            defined_at: format!("2026-11-0{revision}T10:00:00.000Z"),
        }
    }

    #[test]
    fn given_three_revisions_when_shown_then_the_newest_is_current_and_older_ones_drain_by_their_open_runs() {
        let revisions = vec![
            revision(1, json!({"runs": "pin"})),
            revision(3, json!({"runs": "migrate", "steps": {"nap": "long-nap"}, "replan": ["long-nap"]})),
            revision(2, json!({"runs": "pin"})),
        ];
        let open_runs: OpenRuns = [
            (2, [(Some("nap".to_owned()), 4), (None, 1), (Some("send".to_owned()), 2)].into()),
            (3, [(Some("long-nap".to_owned()), 5)].into()),
        ]
        .into();
        let shown = document(revisions, &open_runs);
        assert_eq!(
            shown,
            json!([
                {"revision": 3, "status": "published", "definedAt": "2026-11-03T10:00:00.000Z",
                 "inFlight": {"runs": "migrate", "steps": {"nap": "long-nap"}, "replan": ["long-nap"]},
                 "state": "current", "openRuns": 5, "notStarted": 0, "steps": {"long-nap": 5}},
                {"revision": 2, "status": "published", "definedAt": "2026-11-02T10:00:00.000Z",
                 "inFlight": {"runs": "pin"},
                 "state": "draining", "openRuns": 7, "notStarted": 1, "steps": {"nap": 4, "send": 2}},
                {"revision": 1, "status": "published", "definedAt": "2026-11-01T10:00:00.000Z",
                 "inFlight": {"runs": "pin"},
                 "state": "drained", "openRuns": 0, "notStarted": 0, "steps": {}},
            ])
        );
    }

    #[test]
    fn given_a_single_revision_without_runs_when_shown_then_it_is_current() {
        let shown = document(vec![revision(1, json!({"runs": "exit"}))], &OpenRuns::new());
        assert_eq!((&shown[0]["state"], &shown[0]["openRuns"]), (&json!("current"), &json!(0)));
        assert_eq!(document(Vec::new(), &OpenRuns::new()), json!([]));
    }
}
