//! The steps that choose the way on: `branch` (the first arm whose condition holds, else its
//! default) and `goto` (back to its target, up to its passes, then on).

use std::collections::{BTreeMap, BTreeSet};

use domain::workflows::{Step, condition_document};
use serde_json::Value;

use super::super::facts::{ContactFacts, Facts, Stop, email_of};
use super::super::tick::Tick;

/// Starts a `branch`: it goes on by the first arm whose condition holds, else by its default.
pub(super) fn start_branch(
    tick: &mut Tick,
    step: &Step,
    (arms, default): (&[domain::workflows::Arm], Option<&str>),
    input: &Value,
    facts: &Facts,
    now: i64,
) -> Result<(), Stop> {
    let outputs = with_engagement(&tick.outputs, arms, facts)?;
    let document = branch_document(input, facts.contact()?, &outputs);
    let taken = arms.iter().position(|arm| filter::matches(&arm.condition, &document));
    let next = taken.map_or(default, |arm| arms[arm].next.as_deref());
    let started = tick.start(step, now);
    tick.finish(&started, "completed", None, next, now);
    Ok(())
}

/// Starts a `goto`: back to its target while it has passes left, else on to its next step.
pub(super) fn start_goto(
    tick: &mut Tick,
    step: &Step,
    (target, max_passes, next): (&str, u32, Option<&str>),
    now: i64,
) {
    let passes = tick.row.passes.get(&step.id).copied().unwrap_or(0);
    let started = tick.start(step, now);
    if passes < max_passes {
        tick.row.passes.insert(step.id.clone(), passes + 1);
        tick.finish(&started, "completed", None, Some(target), now);
    } else {
        tick.finish(&started, "completed", None, next, now);
    }
}

/// The run's step outputs as a branch reads them: when an arm asks whether a send step's
/// email was `opened` or `clicked` (`steps.<id>.opened`), each send step's output with what a
/// person did with its email.
fn with_engagement(
    outputs: &BTreeMap<String, Value>,
    arms: &[domain::workflows::Arm],
    facts: &Facts,
) -> Result<BTreeMap<String, Value>, Stop> {
    let asks = arms.iter().any(|arm| {
        condition_fields(&arm.condition).iter().any(|field| {
            let mut segments = field.split('.');
            segments.next() == Some("steps")
                && segments.next().is_some()
                && matches!(segments.next(), Some("opened" | "clicked"))
        })
    });
    if !asks {
        return Ok(outputs.clone());
    }
    let sent: Vec<(String, String)> = outputs
        .keys()
        .filter_map(|step_id| email_of(outputs, step_id).map(|email_id| (step_id.clone(), email_id)))
        .collect();
    let email_ids: Vec<String> = sent.iter().map(|(_, email_id)| email_id.clone()).collect();
    let engaged = facts.engaged(&email_ids)?;
    let mut outputs = outputs.clone();
    for ((step_id, _), engaged) in sent.iter().zip(engaged) {
        if let Some(Value::Object(output)) = outputs.get_mut(step_id) {
            output.insert("opened".to_owned(), Value::Bool(engaged.opened));
            output.insert("clicked".to_owned(), Value::Bool(engaged.clicked));
        }
    }
    Ok(outputs)
}

/// The field paths a condition reads.
fn condition_fields(filter: &filter::Filter) -> Vec<&str> {
    match filter {
        filter::Filter::All(parts) | filter::Filter::Any(parts) => parts.iter().flat_map(condition_fields).collect(),
        filter::Filter::Not(inner) => condition_fields(inner),
        filter::Filter::Condition(condition) => vec![condition.field.as_str()],
        filter::Filter::Performed(_) | filter::Filter::Engaged(_) => Vec::new(),
    }
}

/// What a branch condition reads.
fn branch_document(input: &Value, facts: &ContactFacts, outputs: &BTreeMap<String, Value>) -> Value {
    let empty = (BTreeMap::new(), BTreeSet::new());
    match facts {
        ContactFacts::Live(facts) => {
            let document = facts.state.document();
            condition_document(input, Some(&document), facts.consent, &facts.subscriptions, &facts.segments, outputs)
        }
        _ => condition_document(input, None, None, &empty.0, &empty.1, outputs),
    }
}
