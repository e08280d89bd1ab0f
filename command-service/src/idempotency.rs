//! `Idempotency-Key` on the contract's 17 operations: one mechanism for all of them.
//!
//! After authentication and parsing (which record nothing), the operation is claimed:
//! a row keyed by (calling key, method, path, idempotency key) with the canonical body hash
//! and a fresh claim token is inserted and committed. The operation then runs; its outcome
//! (status and body) is recorded by a guard in the same transaction as its append, which
//! matches the claim token, so an acknowledged write and its recorded response cannot
//! diverge. Errors raised after the claim are recorded too and replayed.
//!
//! Each claim names the instance that made it (its `platform::liveness` heartbeat). A claim
//! left `processing` by an instance that died is reconciled once that instance has stopped
//! beating for `liveness::DEAD_AFTER` (seconds), or, whoever owns it, once it is older than
//! `CLAIM_TIMEOUT`: the next request with the key marks it `unresolved` (409
//! `idempotency_outcome_unknown`), and the projector's maintenance worker
//! (`projector::workers::maintenance::purge_and_reconcile`) releases unresolved claims whose
//! operation appended nothing, so the key can run again. The takeover changes nothing the stalled claimant could still commit: its
//! completion guard no longer matches a `processing` row with its token, so its append fails.

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
/// The existing claim of a key, and whether it is presumed abandoned: older than
/// `CLAIM_TIMEOUT` ($2), or older than `DEAD_AFTER` ($3) with an instance that stopped beating.
static EXISTING: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT body_hash, operation_id, state, status, response, claim_token,
                claimed_at < now() - make_interval(secs => $2)
                OR (claimed_at < now() - make_interval(secs => $3) AND {})
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
    ApiError::conflict(code, message)
}

/// Claims the operation, or answers from (or about) an earlier one with the same key.
pub async fn admit(state: &State, req: &HttpRequest, caller: &Caller, body: &Value) -> Result<Admission, ApiError> {
    let Some(header) = req.headers().get("idempotency-key") else {
        return Ok(Admission::Unprotected { operation_id: platform::ids::new_id("op") });
    };
    let key = header
        .to_str()
        .map_err(|_| ApiError::bad_request(Code::InvalidIdempotencyKey, "Idempotency-Key must be visible ASCII"))?;
    if key.is_empty() || key.chars().count() > MAX_KEY_LENGTH {
        return Err(ApiError::bad_request(
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
    let busy = || {
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Code::IdempotencyAdmissionBusy),
            "the operation could not be admitted right now; retry with the same key and body",
        )
        .with_header("Retry-After", "1".to_owned())
    };
    let attempt = async {
        let client = state.pool.get().await?;
        let insert = client
            .prepare_cached(
                "INSERT INTO idempotency_records (scope_key, key_id, method, path, idempotency_key, body_hash,
                     operation_id, claim_token, state, owner)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'processing', $9) ON CONFLICT (scope_key) DO NOTHING",
            )
            .await?;
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
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(Code::IdempotencyKeyReused),
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
            .with_header("Operation-Id", operation_id)),
            _ => {
                if record_state == "processing" {
                    let token: Uuid = row.get(5);
                    client
                        .execute(
                            "UPDATE idempotency_records SET state = 'unresolved'
                             WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                            &[&claim.scope_key, &token],
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
    };
    match tokio::time::timeout(ADMISSION_WAIT, attempt).await {
        Ok(Ok(admission)) => Ok(admission),
        Ok(Err(error)) if error.status() == StatusCode::SERVICE_UNAVAILABLE => Err(busy()),
        Ok(Err(error)) => Err(error),
        Err(_) => {
            // The claim statement may still complete in the database after we gave up on it;
            // nobody will run that operation, so withdraw the claim (by its token) once the
            // database gets to it, and the caller's retry executes instead of meeting it.
            let pool = state.pool.clone();
            let (scope_key, token) = (claim.scope_key.clone(), claim.claim_token);
            tokio::spawn(async move {
                let Ok(client) = pool.get().await else { return };
                let _ = client
                    .execute(
                        "DELETE FROM idempotency_records WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
                        &[&scope_key, &token],
                    )
                    .await;
            });
            Err(busy())
        }
    }
}

impl Claim {
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
        self.settle(
            state,
            "DELETE FROM idempotency_records WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
        )
        .await;
    }

    /// After the connection failed during COMMIT: wait for that transaction's fate (the row
    /// lock) and, if it did not complete the claim, mark the outcome unresolved.
    pub(crate) async fn mark_unresolved(&self, state: &State) {
        self.settle(
            state,
            "UPDATE idempotency_records SET state = 'unresolved'
             WHERE scope_key = $1 AND claim_token = $2 AND state = 'processing'",
        )
        .await;
    }

    /// Runs `sql`, a statement that settles this claim only while it is still `processing`
    /// under this token. When the database cannot take it now (the very failure that ends the
    /// operation is often the database's), it is retried in the background every second until
    /// the claim timeout; otherwise this live instance would leave a retry meeting
    /// `idempotency_conflict` for the whole timeout.
    async fn settle(&self, state: &State, sql: &'static str) {
        if self.try_settle(&state.pool, sql).await {
            return;
        }
        let (pool, claim) = (state.pool.clone(), self.clone());
        tokio::spawn(async move {
            let deadline = std::time::Instant::now() + CLAIM_TIMEOUT;
            while std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if claim.try_settle(&pool, sql).await {
                    return;
                }
            }
            tracing::warn!(operation_id = %claim.operation_id, "could not settle an idempotency claim; it times out");
        });
    }

    async fn try_settle(&self, pool: &deadpool_postgres::Pool, sql: &str) -> bool {
        let Ok(client) = pool.get().await else { return false };
        client.execute(sql, &[&self.scope_key, &self.claim_token]).await.is_ok()
    }
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
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(Code::IdempotencyOutcomeUnknown),
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
