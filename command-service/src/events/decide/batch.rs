//! `POST /events/{schema}/batch`: a batch's items decided together, each as a single fire is
//! ([`decide_fire`]), and appended in one append by the pipeline. With `onError: abort` the
//! first item that fails stops the batch and nothing is appended (a 422 data result); with
//! `continue` an item's failure is its own and the others are appended together.
//!
//! An append refused by a race of one of its items (its eventId taken meanwhile, admission
//! refused, a subject's deletion begun) is decided again with what the race tells: receipts
//! and subjects read again, and the admission state once admission refused. So the items that
//! lost are answered from the new facts (a duplicate, a conflict, a subject being deleted, an
//! admission refusal in the batch's order) and the rest are appended: the outcome of each item
//! committing on its own, as the contract describes `continue`.

use std::cell::Cell;
use std::collections::HashMap;

use domain::records::Loaded;
use platform::ids::SpaceId;
use platform::log::{Guard, StreamAppend};
use serde_json::Value;

use super::{
    Candidate, EventRefusal, FireContext, Fired, Known, acceptance_parts, admitted_each, decide_fire,
    generated_event_id,
};
use crate::decision::{Decide, Given};
use crate::events::store::{Receipt, ScopeState};

/// `onError` of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnError {
    Continue,
    Abort,
}

/// `POST /events/{schema}/batch`.
pub(crate) struct FireBatch {
    pub space_id: SpaceId,
    pub schema_ref: String,
    pub events: Vec<Value>,
    pub on_error: OnError,
    /// An append was refused admission: the next attempt reads the admission state.
    pub admission_refused: Cell<bool>,
}

/// What a batch decides on.
pub(crate) struct Batch {
    pub context: FireContext,
    /// Each item as parsed, or why it is invalid (with `abort`, none after the first invalid
    /// one). A generated eventId is drawn when the batch is decided.
    pub items: Vec<Result<Candidate, EventRefusal>>,
    /// The receipts held under the items' eventIds.
    pub receipts: HashMap<String, Receipt>,
    /// The records the items name.
    pub subjects: HashMap<String, Loaded>,
    /// The admission state of the batch's scopes, once an append was refused admission.
    pub admission: Option<Vec<ScopeState>>,
}

/// What became of one item.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Item {
    /// Accepted before: the receipt held under its eventId (with `isDuplicate`).
    Existing(Value),
    /// A new occurrence, appended with the batch: its receipt.
    New(Value),
    /// A repeat, inside this batch, of the new occurrence at that index.
    RepeatOf(usize),
    /// Not accepted, and why.
    Refused(EventRefusal),
}

/// A batch's outcome.
pub(crate) enum BatchOutcome {
    /// Every item's outcome; the new occurrences' streams and guards to append (none: nothing
    /// is new).
    Accepted { items: Vec<Item>, streams: Vec<StreamAppend>, guards: Vec<Guard> },
    /// An aborting batch stopped at its last item, which is refused; nothing is appended.
    Aborted { items: Vec<Item> },
}

impl Decide for FireBatch {
    type Loaded = Batch;
    type Outcome = BatchOutcome;
    type Refusal = EventRefusal;

    fn decide(&self, batch: Batch, given: &mut Given<'_>) -> Result<BatchOutcome, EventRefusal> {
        let Batch { context, items: parsed, receipts, subjects, admission } = batch;
        let abort = self.on_error == OnError::Abort;
        let mut items = Vec::with_capacity(parsed.len());
        let mut new = Vec::new();
        // The index of each new occurrence's item and whether it needs preparation.
        let mut new_items: Vec<(usize, bool)> = Vec::new();
        // The first new occurrence of each eventId: its index and input digest.
        let mut firsts: HashMap<String, (usize, String)> = HashMap::new();
        for (index, parsed) in parsed.into_iter().enumerate() {
            let item = match parsed {
                Err(refusal) => Item::Refused(refusal),
                Ok(mut candidate) => {
                    if candidate.input.generated_event_id {
                        candidate.input.event_id = generated_event_id(given.fresh);
                    }
                    let event_id = candidate.input.event_id.clone();
                    let receipt = receipts.get(&event_id);
                    match firsts.get(&event_id) {
                        Some((first, digest)) if receipt.is_none() => match *digest == candidate.digest {
                            true => Item::RepeatOf(*first),
                            false => Item::Refused(EventRefusal::IdConflict(event_id)),
                        },
                        _ => {
                            let known = Known { receipt, subjects: &subjects, admission: None };
                            match decide_fire(&context, &candidate, known, given.now_ms, given.fresh) {
                                Ok(Fired::Duplicate(receipt)) => Item::Existing(receipt),
                                Ok(Fired::New(stream, receipt)) => {
                                    firsts.insert(event_id, (index, candidate.digest.clone()));
                                    new_items.push((index, !candidate.input.pending_keys.is_empty()));
                                    let item = Item::New(receipt.receipt.clone());
                                    new.push((stream, receipt));
                                    item
                                }
                                Err(refusal) => Item::Refused(refusal),
                            }
                        }
                    }
                }
            };
            let refused = matches!(item, Item::Refused(_));
            items.push(item);
            if refused && abort {
                return Ok(BatchOutcome::Aborted { items });
            }
        }
        if let Some(scopes) = admission {
            let needs: Vec<bool> = new_items.iter().map(|(_, needs)| *needs).collect();
            let refusals = admitted_each(&scopes, &needs);
            let first =
                refusals.iter().enumerate().find_map(|(ordinal, refusal)| refusal.map(|refusal| (ordinal, refusal)));
            if abort && let Some((ordinal, refusal)) = first {
                let failed = new_items[ordinal].0;
                items.truncate(failed);
                items.push(Item::Refused(EventRefusal::NotAdmitted(refusal)));
                return Ok(BatchOutcome::Aborted { items });
            }
            let mut kept = Vec::with_capacity(new.len());
            for ((stream, receipt), ((index, _), refusal)) in new.into_iter().zip(new_items.iter().zip(refusals)) {
                match refusal {
                    Some(refusal) => items[*index] = Item::Refused(EventRefusal::NotAdmitted(refusal)),
                    None => kept.push((stream, receipt)),
                }
            }
            new = kept;
            // A repeat of an occurrence not admitted is not admitted either.
            for index in 0..items.len() {
                if let Item::RepeatOf(first) = items[index]
                    && let Item::Refused(refusal) = &items[first]
                {
                    items[index] = Item::Refused(refusal.clone());
                }
            }
        }
        let (streams, guards) = if new.is_empty() { (Vec::new(), Vec::new()) } else { acceptance_parts(&context, new) };
        Ok(BatchOutcome::Accepted { items, streams, guards })
    }
}
