//! Business events: fire and batch fire, with receipts and admission.
//!
//! # Business events
//!
//! **Acceptance.** `POST /events/{schema}` appends `EventAccepted` on a stream of its own
//! (`event/{id}`), and in the same transaction three guards: the receipt row in
//! `event_receipts` (primary key space, schema, eventId: the eventId index), a check that no
//! deletion of the subject record has started, and the admission update. A fire first looks its
//! eventId up (with its subject, in one round trip), except a lone fire about no record, which
//! appends first: its receipt's key and its admission guard refuse what the lookup would have
//! found, and a refused one is decided again from the lookup (a refused admission is checked
//! against the receipts before it answers 429). On lookup: a receipt with the same keyed digest of the normalised input is a duplicate
//! (the stored receipt with `isDuplicate: true`, nothing appended, no capacity used); another
//! digest is 409 `event_id_conflict`; a receipt whose subject has a deletion is 409
//! `event_erased`. Two fires racing on one eventId both pass the lookup; the receipt's primary
//! key lets one append through and the other is decided again, finds the winner's receipt and
//! answers it as a duplicate. Event data is sealed under the subject record's data key (events
//! without a subject are sealed in the clear), so erasing a record erases its events; the
//! eraser also clears the digests of their receipts.
//!
//! **Batches.** `continue` submits one append per item at once; the batcher groups them into
//! one transaction with a savepoint each, so each commits or fails on its own. Items repeating
//! an eventId run in a later round, after the first. `abort` validates items in order (stopping
//! at the first invalid one), then appends all new occurrences as one command with one receipts
//! guard and one admission guard for all of them: a refusal rolls everything back, and the
//! failing index is found afterwards by replaying the limits over the items in order
//! (`domain::events::first_refusal`).
//!
//! **Admission.** `event_admission` holds a row per scope (`fleet`, `space:<id>`,
//! `schema:<id>`): a token bucket (tokens, last refill on the database's clock) and the pending
//! and retained-receipt counts. One guard statement locks the three rows in name order, refills
//! each bucket to now, and takes the tokens and counts only if every scope has room; so
//! admission is exact across any number of command-service instances, a rolled-back acceptance
//! gives everything back, and changing keys changes nothing. When the guard refuses, the
//! handler reads the rows again to say which limit (receipts first, then backlog, then rate)
//! and for how long. Preparation ends with guards that take the receipt out of the backlog
//! exactly once. Receipts retire 24 hours (configurable) after acceptance once their
//! preparation is over: a maintenance pass deletes them and gives their count back, and their
//! eventIds may then be used again. The hot `fleet` row is updated inside the append
//! transaction, next to `log_head`, which already serialises appends.
//!
//! **Readiness.** An event whose schema has AI auto-fill attributes missing from the input is
//! accepted `pending` (its receipt says so forever). The preparation worker (`projector`,
//! `workers/preparation.rs`) follows the log with its own checkpoint, under the lease
//! `preparation` (one process at a time; a step commits right after an event that called the
//! provider, so the lease is never held across many slow calls). For a pending event
//! whose receipt is still pending it calls the AI provider once per missing attribute and
//! appends `EventReadinessChanged` at version 2 of the event's stream: `ready` with the prepared
//! values; `failed` when the provider refused, its answers did not fit the type after 3 calls,
//! it could not be reached after 4 attempts, or no credits were left; `outcome_unknown` when a
//! call was sent and its outcome cannot be known (a timeout): it may have been processed and
//! billed, so it is not repeated. Each call that reaches the provider spends one credit
//! (`credits_spent` in the event, summed in `ai_credit_spend`; remaining credits are the
//! authored grant less that sum). At least once and idempotent: the receipt is checked first,
//! and a second append loses on the stream version and the backlog guard. The same worker
//! fills auto-fill attributes of records: on every record write it reads the record's latest
//! state and appends a `RecordUpdated` with the filled values at that version.
//!
//! **The cursor index.** The `events` read model has one row per event and a partial index on
//! `(space_id, schema_id, occurred_at DESC, id DESC) WHERE state = 'ready'`. `GET /events`
//! reads `occurred_at` in `[from, to)` below the cursor's `(occurred_at, id)` in index order,
//! `limit + 1` rows: one range scan, whose cost depends on the page size, not on the number of
//! events. An event enters the index when it becomes ready, at its `occurredAt`, so a late or
//! old event is at its place in every listing made afterwards. The cursor carries the resolved
//! schema, window and limit; a request that changes them is refused.
//!
//! **Identity binding.** `POST /event-identities` appends `EventIdentityChanged` on the alias's
//! own stream (`alias/{space}/{digest}`, the digest a keyed hash of source and anonymous id), at
//! the expected revision. Guards record the operation with its result (`identity_operations`;
//! the same operationId replays it), move the alias row at its revision unless it is erased,
//! count capacity per space, and check the contact's deletion has not started.

pub mod decide;
pub mod http;
pub mod store;
