//! `Idempotency-Key` on the contract's 17 operations: one mechanism for all of them.
//!
//! After authentication and parsing (which record nothing), the operation is claimed:
//! a row keyed by (calling key, method, path, idempotency key) with the canonical body hash
//! and a fresh claim token is inserted and committed. The operation then runs; its outcome
//! (status and body) is recorded by a guard in the same transaction as its append, which
//! matches the claim token, so an acknowledged write and its recorded response cannot
//! diverge. Errors raised after the claim are recorded too and replayed.
//!
//! Each claim names the instance that made it (its `platform::liveness` heartbeat). While it
//! runs, a retry waits for it up to [`CONFLICT_WAIT`], then is answered 409
//! `idempotency_conflict` with `Retry-After`. A claim left
//! `processing` by an instance that stopped beating for `liveness::DEAD_AFTER`, or, whoever
//! owns it, older than `CLAIM_TIMEOUT`, or left `unresolved`, is settled by the next request
//! with the key from what its operation left ([`take_over`]): nothing, and the request runs
//! the operation; a send still being handed off, and it waits for the recorded answer; else
//! 409 `idempotency_outcome_unknown`. The takeover changes nothing the stalled claimant could
//! still commit: its completion guard (or, for a send, [`Claim::held`]) no longer matches a
//! `processing` row with its token, so its append fails. The projector's maintenance worker
//! (`projector::workers::maintenance::purge_and_reconcile`) still releases unresolved claims
//! whose operation appended nothing that no request came back for.
//!
//! # Idempotency keys
//!
//! One mechanism (`command-service/src/idempotency.rs`, driven by the pipeline) serves every
//! operation the contract lists. After authentication and parsing, which record nothing, the
//! operation is **claimed**: a row in `idempotency_records` keyed by the hash of (calling key,
//! method, path, `Idempotency-Key`), holding the canonical hash of the body (object keys sorted at
//! every level), a fresh claim token, the operation id and the claiming instance (its heartbeat id,
//! below), inserted and committed with `ON CONFLICT DO NOTHING`. A request that finds an existing
//! row answers from it: another body is 422 `idempotency_key_reused`; a completed one is replayed
//! (status and body, `Idempotent-Replay: true`, the original `Operation-Id`); a claim still
//! processing is looked at again every 100 ms for up to 1.5 s (an operation that ends, or a claim
//! its holder settles, answers this request at once), then 409 `idempotency_conflict` with
//! `Retry-After: 1`. A claim whose instance is
//! presumed dead (it is over 5 s old and its instance has not beaten for 5 s while others did), one
//! older than 60 s whoever holds it, and an unresolved one are settled from what the operation left
//! (`idempotency::take_over`): an append under a claim records its answer in its own transaction,
//! or (a template send) hands the claim to the email's outbox row, whose hand-off records it; so in
//! one transaction the request locks the claim's row with a fresh token and looks for that outbox
//! row. None: nothing was written, and the request runs the operation under the operation's id.
//! Pending or attempting: 409 `idempotency_conflict` until the outbox worker records the answer.
//! Otherwise 409 `idempotency_outcome_unknown`. A send's append holds the claim's row
//! (`Claim::held`), so it and a takeover are ordered and the second sees the first.
//!
//! **Heartbeats** (`shared/platform/src/liveness.rs`, table `process_beats`): each command-service
//! and projector process writes its row at start and refreshes it every second on a connection of
//! its own, so a busy pool never delays a beat; the rows it claims name it
//! (`liveness::process_id`). A missing row, or one 5 s old both by the wall and by the database's
//! available time (a clock the beats advance, which stands still while the database is away: a
//! failover does not make every live process look dead), means the process is gone; a process
//! started in a killed one's slot (`liveness::slot`) deletes its row as it first beats. So a retry
//! after a kill -9 is settled within seconds, and the outbox worker takes a dead process's email
//! rows at once (a pending one is handed off, an attempting one settled as unknown). A process that
//! stalls past the bound while alive is safe to presume dead: its claims' completion guards (and a
//! send's `Claim::held`) no longer match, so its appends are refused, and its hand-off's outcome
//! append fails on the lease token. The maintenance worker deletes rows that stopped beating a day
//! ago. A live instance whose operation failed because its database went away cannot settle the
//! claim at that moment either (release it, or mark it unresolved); it retries that statement in the
//! background every 100 ms, doubling to 250 ms, until the claim timeout, so the retry after the
//! outage (waiting on the claim as above) executes, or learns the outcome is unresolved, within a
//! quarter of a second of the database's return. If admission cannot
//! reach the database within 2 s, or its connection fails while the claim statement is out, the
//! answer is 429 `idempotency_admission_busy` with `Retry-After`, and the claim it may still have
//! left behind is withdrawn by its token, tried on the same pauses until the row is found and deleted
//! (the claim may land after a first try found nothing, or the database may be away), so the retry
//! executes. A live process holding an email row it is not handing off does the same
//! (`mail::outbox`): a claim whose answer was lost is given back by its token (the row `pending`
//! again, due at once), an outcome it knows (the relay took the message) is recorded once the
//! database is back, retried for 25 s, and the outbox worker settles an abandoned row under a lease
//! of 5 s, not a hand-off's; so no live process keeps a send's retry waiting for a lease. A
//! suppression batch appends all its items in one transaction, so its recorded outcome covers the
//! whole batch.
//!
//! The outcome is recorded **in the same transaction as the operation's append**, by a guard
//! that updates the row only if it is still `processing` with this claim's token; so an
//! acknowledged write and its recorded response cannot diverge, and a claim taken over by
//! reconciliation can no longer complete (its append is refused). Errors raised after the claim
//! (validation, conflicts) are recorded the same way and replayed, except a transient 503
//! `service_unavailable` (nothing written), which releases the claim so a retry executes; an
//! error outcome that cannot be recorded also releases the claim (an error outcome never follows
//! a committed append, so nothing was written). Requesting a record's deletion replaces, in its
//! transaction, every recorded response about the record by `{data: {id, erased: true}}`, so a
//! replay never shows an erased record. When the connection fails
//! during COMMIT the answer is 503 `idempotency_outcome_unknown` without `type`, and the claim is
//! marked `unresolved` once that transaction's fate is known (the row lock), unless that
//! transaction handed it to an email's outbox row (a template send): the hand-off records the
//! answer, and a retry meanwhile is told to come again, for 5 s after the database is back at
//! most (`HANDOFF_GRACE`), then the claim is marked `unresolved` all the same.
//!
//! Reconciliation: every minute the projector's maintenance worker deletes completed records older than 24
//! hours (the key then executes again) and releases unresolved claims under which no event was
//! appended (found by the key and idempotency key in the log's metadata); because completion is
//! atomic with the append, such a claim provably wrote nothing, so the key may run again. A
//! caller meanwhile inspects the resource, as the contract says, before acting. Each claim is
//! looked at on the passes of the day after it was made, reading the log from its time on (a BRIN
//! index of `recorded_at`); one whose operation did append stays unresolved, as the contract
//! keeps it, and is not read again.

use platform::error::Code;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use api::auth::Caller;
use platform::error::ApiError;
use platform::log::{AppendError, Guard, SetValue};
use serde_json::Value;
use uuid::Uuid;

use crate::State;

/// The longest an idempotency key may be.
pub(crate) const MAX_KEY_LENGTH: usize = 256;
/// A `processing` claim older than this is presumed abandoned even if its instance still
/// beats (an operation stuck that long will not be answered).
pub(crate) const CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// How long, once its database is back, a send whose append's answer was lost leaves its
/// email's hand-off to record the answer before it marks the outcome unresolved
/// ([`Claim::mark_unresolved`]): a retry waits that long for the answer at most, not the claim
/// timeout, when the hand-off cannot record it (its own give-back stuck on a database that
/// went away again).
const HANDOFF_GRACE: Duration = Duration::from_secs(5);
/// The existing claim of a key, and whether it is presumed abandoned: older than
/// `CLAIM_TIMEOUT` ($2), or older than `DEAD_AFTER` ($3) with an instance that stopped beating.
static EXISTING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT body_hash, operation_id, state, status, response, claim_token,
                claimed_at < now() - make_interval(secs => $2)
                OR (claimed_at < now() - make_interval(secs => $3) AND {}),
                owner
         FROM idempotency_records WHERE scope_key = $1",
        platform::liveness::owner_is_dead("$3")
    )
});
/// How long admission may wait for the database before answering 429.
const ADMISSION_WAIT: Duration = Duration::from_secs(2);

/// A claimed operation, to be completed by its append (or by `record`).
#[derive(Debug, Clone)]
pub struct Claim {
    scope_key: String,
    claim_token: Uuid,
    pub operation_id: String,
    /// The caller's `Idempotency-Key`, recorded in the log's metadata.
    pub key: String,
}

pub enum Admission {
    /// No `Idempotency-Key`: run the operation unprotected.
    Unprotected { operation_id: String },
    /// Claimed: run it and complete the claim.
    Claimed(Claim),
    /// A completed operation: answer with its recorded response.
    Replay(HttpResponse),
}

fn conflict(code: Code, message: &str) -> ApiError {
    ApiError::of(code, message)
}

/// Claims the operation, or answers from (or about) an earlier one with the same key.
pub async fn admit(state: &State, req: &HttpRequest, caller: &Caller, body: &Value) -> Result<Admission, ApiError> {
    let Some(header) = req.headers().get("idempotency-key") else {
        return Ok(Admission::Unprotected { operation_id: platform::ids::new_id("op") });
    };
    let key = header
        .to_str()
        .map_err(|_| ApiError::of(Code::InvalidIdempotencyKey, "Idempotency-Key must be visible ASCII"))?;
    if key.is_empty() || key.chars().count() > MAX_KEY_LENGTH {
        return Err(ApiError::of(
            Code::InvalidIdempotencyKey,
            format!("Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters; got {}", key.chars().count()),
        ));
    }
    let method = req.method().as_str();
    let path = req.path();
    let scope_key = platform::ids::sha256_hex(&format!("{}\u{1f}{method}\u{1f}{path}\u{1f}{key}", caller.key_id()));
    let body_hash = crate::canonical::body_hash(body);
    let claim = Claim {
        scope_key,
        claim_token: Uuid::now_v7(),
        operation_id: platform::ids::new_id("op"),
        key: key.to_owned(),
    };
    // A claim held by an operation still running, or being settled, is waited for a while
    // before the retry is told to come again: most end within it (an operation that finishes,
    // a claim its live holder settles once its database is back), and then this request is
    // answered from the outcome, or runs the operation, at once.
    let since = std::time::Instant::now();
    loop {
        match claim_once(state, caller, (method, path, key), &body_hash, &claim).await {
            Err(error) if error.code() == Some(Code::IdempotencyConflict) && since.elapsed() < CONFLICT_WAIT => {
                tokio::time::sleep(CONFLICT_POLL).await;
            }
            answer => return answer,
        }
    }
}

/// How long a request waits for a claim held by another operation of its key before it
/// answers 409 `idempotency_conflict`, looking every [`CONFLICT_POLL`].
const CONFLICT_WAIT: Duration = Duration::from_millis(1500);
const CONFLICT_POLL: Duration = Duration::from_millis(100);

/// One try of [`admit`]: claims the operation, or answers from (or about) the claim its key
/// has.
async fn claim_once(
    state: &State,
    caller: &Caller,
    (method, path, key): (&str, &str, &str),
    body_hash: &str,
    claim: &Claim,
) -> Result<Admission, ApiError> {
    let busy = || {
        ApiError::of(
            Code::IdempotencyAdmissionBusy,
            "the operation could not be admitted right now; retry with the same key and body",
        )
        .with_header("Retry-After", "1".to_owned())
    };
    // Set while the claim's statement is out and its answer not in: if the connection fails
    // meanwhile, the claim may have been made all the same.
    let unconfirmed = std::sync::atomic::AtomicBool::new(false);
    let attempt = async {
        let client = state.pool.get().await?;
        let insert = client
            .prepare_cached(
                "INSERT INTO idempotency_records (scope_key, key_id, method, path, idempotency_key, body_hash,
                     operation_id, claim_token, state, owner)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processing', $9) ON CONFLICT (scope_key) DO NOTHING",
            )
            .await?;
        unconfirmed.store(true, std::sync::atomic::Ordering::Relaxed);
        let inserted = client
            .execute(
                &insert,
                &[
                    &claim.scope_key,
                    &caller.key_id(),
                    &method,
                    &path,
                    &key,
                    &body_hash,
                    &claim.operation_id,
                    &claim.claim_token,
                    &state.beat.id(),
                ],
            )
            .await?;
        unconfirmed.store(false, std::sync::atomic::Ordering::Relaxed);
        if inserted == 1 {
            return Ok(Admission::Claimed(claim.clone()));
        }
        let existing = client.prepare_cached(&EXISTING).await?;
        let (timeout, dead_after) = (CLAIM_TIMEOUT.as_secs_f64(), platform::liveness::DEAD_AFTER.as_secs_f64());
        let Some(row) = client.query_opt(&existing, &[&claim.scope_key, &timeout, &dead_after]).await? else {
            // Released between the insert and the read: the caller may simply retry.
            return Err(conflict(Code::IdempotencyConflict, "the operation with this key is changing state; retry"));
        };
        let (stored_hash, operation_id, record_state): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        if stored_hash != body_hash {
            return Err(ApiError::of(
                Code::IdempotencyKeyReused,
                "this Idempotency-Key was used with a different body; use a new key for a new operation",
            )
            .with_header("Operation-Id", operation_id));
        }
        match record_state.as_str() {
            "completed" => {
                let status: i32 = row.get(3);
                let response: Value = row.get(4);
                let status = StatusCode::from_u16(u16::try_from(status).unwrap_or(500)).unwrap_or(StatusCode::OK);
                Ok(Admission::Replay(
                    HttpResponse::build(status)
                        .insert_header(("Idempotent-Replay", "true"))
                        .insert_header(("Operation-Id", operation_id))
                        .json(response),
                ))
            }
            "processing" if !row.get::<_, bool>(6) => Err(conflict(
                Code::IdempotencyConflict,
                "an operation with this key is still processing; retry later with the same key and body",
            )
            .with_header("Retry-After", RETRY_AFTER_SECONDS.to_owned())
            .with_header("Operation-Id", operation_id)),
            // Its holder is dead (or stuck past the timeout), or its outcome was left
            // unresolved: settled from what it left.
            _ => {
                drop(client);
                let held = Held { token: row.get(5), owner: row.get(7), operation_id };
                take_over(state, claim, held, record_state == "processing").await
            }
        }
    };
    match tokio::time::timeout(ADMISSION_WAIT, attempt).await {
        Ok(Ok(admission)) => Ok(admission),
        Ok(Err(error)) if error.status() == StatusCode::SERVICE_UNAVAILABLE => {
            // The connection failed; if it did while the claim statement was out, the claim
            // may have been made (its answer lost): withdraw it as below.
            if unconfirmed.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::spawn(withdraw(state.pool.clone(), claim.clone()));
            }
            Err(busy())
        }
        Ok(Err(error)) => Err(error),
        Err(_) => {
            // The claim statement may still complete in the database after we gave up on it;
            // nobody will run that operation, so withdraw the claim (by its token) once it is
            // there, and the caller's retry executes instead of meeting it.
            tokio::spawn(withdraw(state.pool.clone(), claim.clone()));
            Err(busy())
        }
    }
}

/// Withdraws the claim of an admission that gave up waiting for it, or whose connection failed
/// while its claim statement was out: tried until its row is found and deleted, or
/// [`CLAIM_TIMEOUT`] passes. One attempt is not enough: the claim statement may land after a
/// first delete found nothing (it waited behind another transaction's claim of the key), and
/// the database may be away when the delete is due; either way the claim would stand, held by
/// this live process, and every retry would meet `idempotency_conflict` until the timeout.
async fn withdraw(pool: deadpool_postgres::Pool, claim: Claim) {
    platform::db::until_one_row(
        &pool,
        "DELETE FROM idempotency_records WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
        &[&claim.scope_key, &claim.claim_token],
        CLAIM_TIMEOUT,
    )
    .await;
}

/// What a retry is told to wait before it comes again while a claim is settled.
const RETRY_AFTER_SECONDS: &str = "1";

/// The claim a request found, held by another (dead, stuck or unresolved) operation.
struct Held {
    token: Uuid,
    owner: Option<Uuid>,
    operation_id: String,
}

/// The outbox row that holds a claim (a keyed template send's email), as a takeover sees it.
#[derive(Debug, Clone, Copy)]
struct HandedTo<'a> {
    state: &'a str,
    /// The process holding the row still beats.
    owner_alive: bool,
    /// The row is held by the process that made the claim (its own inline hand-off).
    owner_is_claimant: bool,
}

/// What a request does with a claim it may take over.
#[derive(Debug, PartialEq, Eq)]
enum Settling {
    /// The operation wrote nothing: run it under the claim.
    Run,
    /// A send whose hand-off will record its answer: 409 `idempotency_conflict`, come again.
    Wait,
    /// A send whose answer cannot be rebuilt (the relay may have it): 409
    /// `idempotency_outcome_unknown`.
    Unknown,
}

/// The settling of a claim held by an operation that is dead, stuck or left unresolved,
/// from the outbox row that holds it, if any. A pending email is handed off by the outbox
/// worker (a dead process's at once), which records the answer. An attempting one records it
/// only while a live process is in its exchange: not when its holder is dead (the worker
/// settles it as unknown), and not when it is the claimant's own hand-off of a claim left
/// unresolved (that hand-off already answered that its outcome is unknown).
fn settling(handed: Option<HandedTo<'_>>, unresolved: bool) -> Settling {
    match handed {
        None => Settling::Run,
        Some(HandedTo { state: "pending", .. }) => Settling::Wait,
        Some(HandedTo { state: "attempting", owner_alive: true, owner_is_claimant })
            if !(unresolved && owner_is_claimant) =>
        {
            Settling::Wait
        }
        Some(_) => Settling::Unknown,
    }
}

/// Settles the claim of an operation whose holder is dead (or stuck past [`CLAIM_TIMEOUT`]),
/// or whose outcome was left unresolved, from what the operation left ([`settling`]). Every
/// append made under a claim either records the answer in its own transaction (the claim is
/// then `completed`, never here) or, for a template send, hands the claim to the email's
/// outbox row in its transaction (the row's hand-off records the answer). No such row: the
/// operation wrote nothing, and this request takes the claim over (a fresh token: a holder
/// that is alive after all can no longer complete or append under it) and runs it, with the
/// operation's id.
///
/// The takeover locks the claim's row before it looks for the outbox row, and a send's
/// append holds that row too ([`Claim::held`]): a holder's append and a takeover are ordered,
/// and whichever comes second sees the other.
async fn take_over(state: &State, claim: &Claim, held: Held, processing: bool) -> Result<Admission, ApiError> {
    let Held { token: held_token, owner: held_owner, operation_id } = held;
    let mut client = state.pool.get().await?;
    let transaction = client.transaction().await?;
    let taken = transaction
        .execute(
            "UPDATE idempotency_records SET claim_token = $3, owner = $4, claimed_at = now(), state = 'processing'
             WHERE scope_key = $1 AND claim_token = $2 AND state IN ('processing', 'unresolved')",
            &[&claim.scope_key, &held_token, &claim.claim_token, &state.beat.id()],
        )
        .await?;
    let settling_now = || {
        conflict(Code::IdempotencyConflict, "the operation with this key is being settled; retry with the same key")
            .with_header("Retry-After", RETRY_AFTER_SECONDS.to_owned())
            .with_header("Operation-Id", operation_id.clone())
    };
    if taken != 1 {
        // Completed or taken over meanwhile: the retry sees which.
        return Err(settling_now());
    }
    let statement = transaction.prepare_cached(&HANDED_TO).await?;
    let dead_after = platform::liveness::DEAD_AFTER.as_secs_f64();
    let row = transaction.query_opt(&statement, &[&claim.scope_key, &held_token, &dead_after, &held_owner]).await?;
    let handed =
        row.as_ref().map(|row| HandedTo { state: row.get(0), owner_alive: row.get(1), owner_is_claimant: row.get(2) });
    match settling(handed, !processing) {
        Settling::Run => {
            transaction.commit().await?;
            tracing::info!(operation_id = %operation_id, "took over the idempotency claim of an operation that wrote nothing");
            Ok(Admission::Claimed(Claim { operation_id, ..claim.clone() }))
        }
        Settling::Wait => {
            transaction.rollback().await?;
            Err(settling_now())
        }
        Settling::Unknown => {
            transaction.rollback().await?;
            if processing {
                client
                    .execute(
                        "UPDATE idempotency_records SET state = 'unresolved'
                         WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                        &[&claim.scope_key, &held_token],
                    )
                    .await?;
            }
            Err(conflict(
                Code::IdempotencyOutcomeUnknown,
                "the outcome of the operation with this key is unresolved; inspect the affected resource before \
                 acting",
            )
            .with_header("Operation-Id", operation_id))
        }
    }
}

/// The outbox row holding a claim ($1 scope, $2 token): its state, whether its holder beats
/// ($3: `DEAD_AFTER`), and whether its holder is the claimant ($4).
static HANDED_TO: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT state, owner IS NOT NULL AND NOT {}, owner IS NOT DISTINCT FROM $4
         FROM email_outbox WHERE claim_scope_key = $1 AND claim_token = $2",
        platform::liveness::owner_is_dead("$3")
    )
});

impl Claim {
    /// The guard of an append whose answer is recorded after it (a send's, by its hand-off):
    /// the claim is still this operation's. It holds the claim's row until the append
    /// commits, so a takeover ([`take_over`]) waits for it and then sees the send; and an
    /// append after a takeover fails instead of sending twice.
    pub fn held(&self) -> Guard {
        Guard::exactly_one(
            "UPDATE idempotency_records SET owner = owner
             WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
            vec![Box::new(self.scope_key.clone()), Box::new(self.claim_token)],
            AppendError::Conflict {
                code: Code::IdempotencyOutcomeUnknown,
                message: "the claim on this idempotency key was taken over; inspect the affected resource".to_owned(),
            },
        )
    }

    /// The claim's row and token, for a completion recorded later (a send's outcome).
    pub fn parts(&self) -> (String, Uuid) {
        (self.scope_key.clone(), self.claim_token)
    }

    /// The guard that records the outcome in the operation's append transaction.
    pub fn completion(&self, status: StatusCode, body: &Value) -> Guard {
        Guard::exactly_one(
            "UPDATE idempotency_records SET state = 'completed', status = $3, response = $4, completed_at = now()
             WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
            vec![
                Box::new(self.scope_key.clone()),
                Box::new(self.claim_token),
                Box::new(i32::from(status.as_u16())),
                Box::new(body.clone()),
            ],
            AppendError::Conflict {
                code: Code::IdempotencyOutcomeUnknown,
                message: "the claim on this idempotency key was taken over; inspect the affected resource".to_owned(),
            },
        )
        .with_set(
            "UPDATE idempotency_records r
             SET state = 'completed', status = v.status, response = v.response, completed_at = now()
             FROM unnest($1::text[], $2::uuid[], $3::int4[], $4::jsonb[]) AS v(scope_key, claim_token, status, response)
             WHERE r.scope_key = v.scope_key AND r.claim_token = v.claim_token AND r.state = 'processing'",
            vec![
                SetValue::Text(Some(self.scope_key.clone())),
                SetValue::Uuid(self.claim_token),
                SetValue::Int(i32::from(status.as_u16())),
                SetValue::Json(body.clone()),
            ],
        )
    }

    /// Records an outcome that appended nothing (an error after the claim, or a no-op).
    pub async fn record(&self, state: &State, status: StatusCode, body: &Value) -> Result<(), ApiError> {
        let client = state.pool.get().await?;
        client
            .execute(
                "UPDATE idempotency_records SET state = 'completed', status = $3, response = $4, completed_at = now()
                 WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                &[&self.scope_key, &self.claim_token, &i32::from(status.as_u16()), body],
            )
            .await?;
        Ok(())
    }

    /// Releases the claim of an operation that wrote nothing because the service was
    /// unavailable, so a retry with the same key executes instead of replaying the failure.
    pub async fn release(&self, state: &State) {
        self.settle(state, Settlement::Release).await;
    }

    /// After the connection failed during COMMIT: wait for that transaction's fate (the
    /// claim's row lock, which the append held) and, if it did not complete the claim, mark the
    /// outcome unresolved. A send's append that committed hands the claim to its email's outbox
    /// row, whose hand-off records the answer (`mail::outbox` gives this process's row back,
    /// and the outbox worker sends it): the claim is left `processing` for that, and a retry
    /// meanwhile waits for the answer, for [`HANDOFF_GRACE`] after the database is back; a
    /// hand-off that has not recorded it by then leaves the outcome unresolved. The outbox row
    /// is looked for in a statement after the lock is taken, so that it sees an append that
    /// committed while this waited.
    pub(crate) async fn mark_unresolved(&self, state: &State) {
        self.settle(state, Settlement::Unresolved { handed_since: None }).await;
    }

    /// Settles this claim while it is still `processing` under this token ([`Settlement`]).
    /// When the database cannot take it now (the very failure that ends the operation is often
    /// the database's), or a send's hand-off is still given its grace, it is tried again in the
    /// background ([`platform::db::settling_pauses`]) until the claim timeout; otherwise this
    /// live instance would leave a retry meeting `idempotency_conflict` for the whole timeout.
    async fn settle(&self, state: &State, mut settlement: Settlement) {
        if self.try_settle(&state.pool, &mut settlement).await {
            return;
        }
        let (pool, claim) = (state.pool.clone(), self.clone());
        tokio::spawn(async move {
            let deadline = std::time::Instant::now() + CLAIM_TIMEOUT;
            for pause in platform::db::settling_pauses() {
                if std::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
                if claim.try_settle(&pool, &mut settlement).await {
                    return;
                }
            }
            tracing::warn!(operation_id = %claim.operation_id, "could not settle an idempotency claim; it times out");
        });
    }

    /// One try of [`Claim::settle`]: whether the claim is settled (released, completed, taken
    /// over, or now unresolved).
    async fn try_settle(&self, pool: &deadpool_postgres::Pool, settlement: &mut Settlement) -> bool {
        let Ok(mut client) = pool.get().await else { return false };
        let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&self.scope_key, &self.claim_token];
        let handed_since = match settlement {
            Settlement::Release => {
                return client
                    .execute(
                        "DELETE FROM idempotency_records
                         WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                        &key,
                    )
                    .await
                    .is_ok();
            }
            Settlement::Unresolved { handed_since } => handed_since,
        };
        let Ok(transaction) = client.transaction().await else { return false };
        let Ok(claim) = transaction
            .query_opt(
                "SELECT state = 'processing' FROM idempotency_records
                 WHERE scope_key = $1 AND claim_token = $2 FOR UPDATE",
                &key,
            )
            .await
        else {
            return false;
        };
        if !claim.is_some_and(|row| row.get::<_, bool>(0)) {
            return true;
        }
        let Ok(handed) = transaction
            .query_one("SELECT EXISTS (SELECT FROM email_outbox WHERE claim_scope_key = $1 AND claim_token = $2)", &key)
            .await
        else {
            return false;
        };
        if handed.get::<_, bool>(0)
            && handed_since.get_or_insert_with(std::time::Instant::now).elapsed() < HANDOFF_GRACE
        {
            return false;
        }
        let marked = transaction
            .execute(
                "UPDATE idempotency_records SET state = 'unresolved'
                 WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                &key,
            )
            .await;
        marked.is_ok() && transaction.commit().await.is_ok()
    }
}

/// How a live instance settles a claim its operation could not ([`Claim::settle`]).
enum Settlement {
    /// Delete it: the operation wrote nothing.
    Release,
    /// Mark it unresolved once its append's fate is known, unless the append handed it to an
    /// email's outbox row, whose hand-off is given [`HANDOFF_GRACE`] from `handed_since` (when
    /// a try first saw that row) to record the answer.
    Unresolved { handed_since: Option<std::time::Instant> },
}

/// Finishes a claimed operation's answer: records errors raised after the claim so they are
/// replayed, except a transient 503 `service_unavailable` (nothing written), which releases
/// the claim; turns an unconfirmed outcome into 503 `idempotency_outcome_unknown`; adds
/// `Operation-Id`.
pub async fn finish(
    state: &State,
    claim: Option<&Claim>,
    operation_id: &str,
    outcome: Result<HttpResponse, ApiError>,
    unconfirmed: bool,
) -> Result<HttpResponse, ApiError> {
    match (outcome, claim) {
        (Ok(response), _) => Ok(response),
        (Err(error), Some(claim)) if unconfirmed => {
            claim.mark_unresolved(state).await;
            let _ = error;
            Err(ApiError::of_second(
                Code::IdempotencyOutcomeUnknown,
                "the outcome could not be confirmed; keep the Operation-Id, the key and the body, and reconcile \
                 before a new operation",
            )
            .without_type()
            .with_header("Operation-Id", operation_id.to_owned()))
        }
        // Nothing was written and the failure is transient: let a retry execute.
        (Err(error), Some(claim)) if error.code() == Some(Code::ServiceUnavailable) => {
            claim.release(state).await;
            Err(error.with_header("Operation-Id", operation_id.to_owned()))
        }
        (Err(error), Some(claim)) => {
            if let Err(record_error) = claim.record(state, error.status(), &error.body()).await {
                // An error outcome never follows a committed append (the append records its
                // own outcome), so nothing was written: release the claim and let a retry with
                // the same key execute rather than wedge on a claim nobody will complete.
                tracing::error!(error = %record_error, "could not record an idempotent error outcome; releasing the claim");
                claim.release(state).await;
            }
            Err(error.with_header("Operation-Id", operation_id.to_owned()))
        }
        (Err(error), None) => Err(error.with_header("Operation-Id", operation_id.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: &str, owner_alive: bool, owner_is_claimant: bool) -> Option<HandedTo<'_>> {
        Some(HandedTo { state, owner_alive, owner_is_claimant })
    }

    #[test]
    fn a_claim_is_run_again_only_when_nothing_was_written_and_waited_for_only_while_an_answer_comes() {
        // No send holds the claim: the operation wrote nothing.
        assert_eq!(settling(None, false), Settling::Run);
        assert_eq!(settling(None, true), Settling::Run);
        // A pending send is handed off by the worker, which records the answer.
        assert_eq!(settling(row("pending", false, true), false), Settling::Wait);
        assert_eq!(settling(row("pending", true, true), true), Settling::Wait);
        // An exchange in progress in a live process ends with an answer...
        assert_eq!(settling(row("attempting", true, true), false), Settling::Wait);
        assert_eq!(settling(row("attempting", true, false), true), Settling::Wait, "the worker's retry");
        // ... not one whose process died, nor the claimant's own that already answered unknown.
        assert_eq!(settling(row("attempting", false, true), false), Settling::Unknown);
        assert_eq!(settling(row("attempting", true, true), true), Settling::Unknown);
        // Ended without an answer.
        assert_eq!(settling(row("unknown", true, true), false), Settling::Unknown);
        assert_eq!(settling(row("sent", true, false), true), Settling::Unknown);
    }
}
