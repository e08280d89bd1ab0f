//! Event admission limits (the contract's Limits, Event admission): per fleet, space and
//! schema, a sustained rate with a burst, a cap on events pending preparation and a cap on
//! retained receipts. Every value comes from configuration, so benchmarks can raise them.

use kernel::error::Code;
use kernel::limits::{AdmissionLimits, ScopeLimits};
use kernel::log::{AppendError, Guard};

/// The scopes an occurrence in `space_id` / `schema_id` counts against, with their limits,
/// sorted by scope name (the order their rows are locked in).
pub fn scopes(limits: &AdmissionLimits, space_id: &str, schema_id: &str) -> Vec<(String, ScopeLimits)> {
    let [fleet, space, schema] = scope_names(space_id, schema_id);
    let mut scopes = vec![(fleet, limits.fleet), (space, limits.space), (schema, limits.schema)];
    scopes.sort_by(|a, b| a.0.cmp(&b.0));
    scopes
}

/// The admission rows an occurrence counts in: fleet, space, schema.
pub(crate) fn scope_names(space_id: &str, schema_id: &str) -> [String; 3] {
    ["fleet".to_owned(), format!("space:{space_id}"), format!("schema:{schema_id}")]
}

/// The guards that end an event's preparation, appended with its `EventReadinessChanged`:
/// the receipt leaves the backlog (exactly once: a second preparation of the same event
/// fails here), the scopes' pending counts drop, and the spent credits are counted.
pub fn preparation_guards(id: &str, space_id: &str, schema_id: &str, credits_spent: i64) -> Vec<Guard> {
    let names: Vec<String> = scope_names(space_id, schema_id).to_vec();
    let prepared = || AppendError::Conflict { code: Code::EventAlreadyPrepared, message: String::new() };
    vec![
        Guard::exactly_one(
            "UPDATE event_receipts SET pending = false WHERE id = $1 AND pending",
            vec![Box::new(id.to_owned())],
            prepared(),
        ),
        Guard::unique(
            "UPDATE event_admission SET pending = GREATEST(pending - 1, 0) WHERE scope = ANY($1)",
            vec![Box::new(names)],
            prepared(),
        ),
        spend_guard(space_id, credits_spent),
    ]
}

/// Counts `credits` spent by the space, in the transaction of the event that records them.
pub fn spend_guard(space_id: &str, credits: i64) -> Guard {
    Guard::unique(
        "INSERT INTO ai_credit_spend (space_id, spent) VALUES ($1, $2)
         ON CONFLICT (space_id) DO UPDATE SET spent = ai_credit_spend.spent + EXCLUDED.spent",
        vec![Box::new(space_id.to_owned()), Box::new(credits)],
        AppendError::Conflict { code: Code::CreditSpend, message: String::new() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_sorted_for_a_stable_lock_order() {
        let scopes = scopes(&AdmissionLimits::default(), "spc_1", "sch_1");
        let names: Vec<&str> = scopes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["fleet", "schema:sch_1", "space:spc_1"]);
        assert_eq!(scopes[1].1.burst, 15.0);
        assert_eq!(scopes[2].1.receipts, 50_000);
    }
}
