//! The email outbox: every accepted send has a row (`email_outbox`, inserted by a guard in
//! the send's append). A hand-off holds the row's claim before the relay is contacted (a
//! template send's append inserts the row claimed for its inline hand-off; other rows are
//! claimed by a committed update), hands the message over, and records the outcome: the log event, the row's new state and,
//! when the send was made under an `Idempotency-Key`, the answer a replay gives, all in one
//! append guarded by the lease token. The inline hand-off of `POST /templates/{id}/send` and
//! the projector's outbox worker share this.
//!
//! A statement that finds rows by `email_id` tests their state as `(state || '') = '…'`, an
//! expression no partial index's predicate can be proved from. Written `state = 'pending'`, it
//! let PostgreSQL answer it from the index of every pending (or held) row: a plan made while
//! statistics said that index was nearly empty read all of it on each call once a broadcast or
//! a release had filled it (3 ms a claim or an outcome at 30,000 pending, instead of a probe of
//! the primary key). The searches by state (what is due, what was abandoned) use those indexes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Pool;
use uuid::Uuid;

mod decide;

use decide::outcome_append;
pub use decide::{Bounce, NewSuppression, Settle, answer, erased, hard_bounce, outcome_event, settle, unknown};

use crate::mailer::{Mailer, Outcome};
use crate::message::{self, Outgoing};
use domain::email::resources::{DomainDef, SenderDef};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, Appended, EventLog, Guard, SetValue, StreamAppend};
use platform::proto;

/// The row that the send's append inserts, `pending` until a hand-off claims it, naming this
/// process (its appender) so that the outbox worker takes it at once if the process dies.
pub fn insert_guard(email_id: &str, space_id: &str) -> Guard {
    let owner = platform::liveness::process_id();
    let row = vec![
        SetValue::Text(Some(email_id.to_owned())),
        SetValue::Text(Some(space_id.to_owned())),
        SetValue::Text(owner.map(|owner| owner.to_string())),
    ];
    Guard::exactly_one(
        "INSERT INTO email_outbox (email_id, space_id, owner) VALUES ($1, $2, $3)
         ON CONFLICT (email_id) DO NOTHING",
        vec![Box::new(email_id.to_owned()), Box::new(space_id.to_owned()), Box::new(owner)],
        AppendError::Conflict { code: Code::IdempotencyConflict, message: "the email id is already taken".to_owned() },
    )
    .with_set(
        "INSERT INTO email_outbox (email_id, space_id, owner)
         SELECT w.email_id, w.space_id, w.owner::uuid
         FROM unnest($1::text[], $2::text[], $3::text[]) AS w(email_id, space_id, owner)
         ON CONFLICT (email_id) DO NOTHING",
        row,
    )
}

/// The row that the send's append inserts already claimed for this process's inline
/// hand-off: `attempting` under a new lease token for `lease`, owned by this process, so the
/// hand-off writes nothing before the relay is contacted (the claim is folded into the
/// scheduling append). The lease the hand-off holds, with the guard.
///
/// What that costs in a crash: a process that dies after the append and before its relay
/// exchange leaves the row `attempting`, and the outbox worker settles it as
/// `EmailOutcomeUnknown` once the owner stops beating, as it does for a hand-off that died
/// midway; it is never sent twice. A live process that does not hand the email off (its
/// request was dropped, the append's answer was lost) gives the row back to `pending`
/// ([`Unhanded`]).
pub fn claimed_guard(email_id: &str, space_id: &str, claim: Option<(String, Uuid)>, lease: Duration) -> (Guard, Lease) {
    let token = Uuid::now_v7();
    let (scope_key, claim_token) = claim.clone().unzip();
    let owner = platform::liveness::process_id();
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let row = vec![
        SetValue::Text(Some(email_id.to_owned())),
        SetValue::Text(Some(space_id.to_owned())),
        SetValue::Text(scope_key.clone()),
        SetValue::Text(claim_token.map(|token| token.to_string())),
        SetValue::Text(owner.map(|owner| owner.to_string())),
        SetValue::Text(Some(token.to_string())),
        SetValue::BigInt(lease_ms),
    ];
    let guard = Guard::exactly_one(
        "INSERT INTO email_outbox (email_id, space_id, claim_scope_key, claim_token, owner,
             state, lease_token, leased_until, attempts)
         VALUES ($1, $2, $3, $4, $5, 'attempting', $6, now() + make_interval(secs => $7::bigint / 1000.0), 1)
         ON CONFLICT (email_id) DO NOTHING",
        vec![
            Box::new(email_id.to_owned()),
            Box::new(space_id.to_owned()),
            Box::new(scope_key),
            Box::new(claim_token),
            Box::new(owner),
            Box::new(token),
            Box::new(lease_ms),
        ],
        AppendError::Conflict { code: Code::IdempotencyConflict, message: "the email id is already taken".to_owned() },
    )
    .with_set(
        "INSERT INTO email_outbox (email_id, space_id, claim_scope_key, claim_token, owner,
             state, lease_token, leased_until, attempts)
         SELECT w.email_id, w.space_id, w.scope_key, w.token::uuid, w.owner::uuid,
             'attempting', w.lease::uuid, now() + make_interval(secs => w.lease_ms / 1000.0), 1
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[])
             AS w(email_id, space_id, scope_key, token, owner, lease, lease_ms)
         ON CONFLICT (email_id) DO NOTHING",
        row,
    );
    (guard, Lease { email_id: email_id.to_owned(), token, claim, attempts: 0 })
}

/// A lease taken by a send's append ([`claimed_guard`]) that no hand-off has started under
/// yet. Dropped while armed (the request was dropped, the append's answer was lost, the
/// hand-off never began), it gives the row back: `pending` and due at once, if the append
/// committed, so the outbox worker hands the email off (nothing went to the relay under this
/// lease). [`Unhanded::start`] disarms it as the hand-off begins; the hook
/// [`Unhanded::on_refusal`] gives, called once the append is known not to have been written
/// (the database refused it), disarms it too: there is no row to give back, and looking for
/// one would poll for [`SETTLE_PERSISTENCE`] in vain.
pub struct Unhanded {
    pool: Pool,
    lease: Option<Lease>,
    refused: Arc<AtomicBool>,
}

impl Unhanded {
    pub fn new(pool: Pool, lease: Lease) -> Self {
        Self { pool, lease: Some(lease), refused: Arc::default() }
    }

    /// The lease, for a hand-off about to contact the relay: from here on the row is the
    /// hand-off's to settle.
    pub fn start(mut self) -> Option<Lease> {
        self.lease.take()
    }

    /// What to call when the append that would have written the row was refused for certain.
    pub fn on_refusal(&self) -> impl FnOnce() + Send + 'static {
        let refused = self.refused.clone();
        move || refused.store(true, Ordering::Release)
    }
}

impl Drop for Unhanded {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else { return };
        if self.refused.load(Ordering::Acquire) {
            return;
        }
        // The append may still be committing: `unclaim` keeps looking for the row.
        metrics::counter!("email_handoffs_given_back_total").increment(1);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(unclaim(self.pool.clone(), lease.email_id, lease.token));
        }
    }
}

/// The row of a held email (`send::Scheduled::hold`): `held` until `until_ms`, when the held
/// sends worker decides it again. It holds no idempotency claim: a held send's answer is
/// final when it is given.
pub fn held_guard(email_id: &str, space_id: &str, until_ms: i64) -> Guard {
    let row = vec![
        SetValue::Text(Some(email_id.to_owned())),
        SetValue::Text(Some(space_id.to_owned())),
        SetValue::BigInt(until_ms),
    ];
    Guard::exactly_one(
        "INSERT INTO email_outbox (email_id, space_id, state, next_attempt_at)
         VALUES ($1, $2, 'held', to_timestamp($3::bigint / 1000.0))
         ON CONFLICT (email_id) DO NOTHING",
        vec![Box::new(email_id.to_owned()), Box::new(space_id.to_owned()), Box::new(until_ms)],
        AppendError::Conflict { code: Code::IdempotencyConflict, message: "the email id is already taken".to_owned() },
    )
    .with_set(
        "INSERT INTO email_outbox (email_id, space_id, state, next_attempt_at)
         SELECT w.email_id, w.space_id, 'held', to_timestamp(w.until_ms / 1000.0)
         FROM unnest($1::text[], $2::text[], $3::bigint[]) AS w(email_id, space_id, until_ms)
         ON CONFLICT (email_id) DO NOTHING",
        row,
    )
}

/// A claimed hand-off.
#[derive(Debug, Clone)]
pub struct Lease {
    pub email_id: String,
    pub token: Uuid,
    /// The send's idempotency claim, to complete with the outcome.
    pub claim: Option<(String, Uuid)>,
    /// Hand-offs made before this one (refused for now, or the relay unreachable).
    pub attempts: i32,
}

/// How long a live process keeps trying to settle a hand-off it holds while the database is
/// away (record its outcome, queue it again, or withdraw a claim whose answer was lost),
/// before it leaves the row to its lease's end. Shorter than any lease
/// (`Settings::email_lease` is at least 30 s), so a settling that gives up is still settled
/// by the outbox worker.
const SETTLE_PERSISTENCE: Duration = Duration::from_secs(25);

/// Retries `attempt` while it fails for a reason that may pass (`transient`), for
/// [`SETTLE_PERSISTENCE`] at most, pausing [`platform::db::settling_pauses`] between tries.
async fn persist<T, E, Fut>(
    what: &str,
    email_id: &str,
    transient: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, E>
where
    E: std::fmt::Display,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = std::time::Instant::now() + SETTLE_PERSISTENCE;
    let mut pauses = platform::db::settling_pauses();
    loop {
        match attempt().await {
            Err(error) if transient(&error) => {
                let pause = pauses.next().unwrap_or(Duration::from_millis(250));
                if std::time::Instant::now() + pause >= deadline {
                    return Err(error);
                }
                tracing::warn!(error = %error, email = %email_id, "could not {what}; trying again");
                tokio::time::sleep(pause).await;
            }
            other => return other,
        }
    }
}

/// Withdraws a claim of `email_id` under `token` whose answer was lost, if it was made: the
/// email goes back to `pending`, due at once (nothing was handed over under it). Tries for
/// [`SETTLE_PERSISTENCE`]: the claim may commit after its answer was lost, and the
/// database may be away when the withdrawal is due.
async fn unclaim(pool: Pool, email_id: String, token: Uuid) {
    let withdrawn = platform::db::until_one_row(
        &pool,
        "UPDATE email_outbox SET state = 'pending', lease_token = NULL, leased_until = NULL, next_attempt_at = now()
         WHERE email_id = $1 AND lease_token = $2 AND (state || '') = 'attempting'",
        &[&email_id, &token],
        SETTLE_PERSISTENCE,
    )
    .await;
    if withdrawn {
        tracing::info!(email = %email_id, "withdrew a hand-off's claim whose answer was lost");
    }
}

/// Gives back a claimed hand-off that did not start (its message could not be prepared):
/// `pending` again, due at once, so no live process holds an email it is not handing off.
pub async fn release(pool: &Pool, lease: &Lease) {
    unclaim(pool.clone(), lease.email_id.clone(), lease.token).await;
}

/// Claims every one of `email_ids` that is `pending`, each under a token of its own, in one
/// statement: the leases of those claimed (one another hand-off has, or that is done, is not).
/// When the statement's answer is lost (the database went away), the claims may have been
/// made all the same: they are withdrawn in the background ([`unclaim`]), so no email is left
/// `attempting` under a live process that is not handing it off.
pub async fn claim_many(pool: &Pool, email_ids: &[String], lease: Duration) -> anyhow::Result<Vec<Lease>> {
    if email_ids.is_empty() {
        return Ok(Vec::new());
    }
    let jobs: Vec<(String, Duration, Uuid)> = email_ids.iter().map(|id| (id.clone(), lease, Uuid::now_v7())).collect();
    match claim_set(pool, &jobs).await {
        Ok(leases) => Ok(leases.into_iter().flatten().collect()),
        Err(error) => {
            for (email_id, _, token) in jobs {
                tokio::spawn(unclaim(pool.clone(), email_id, token));
            }
            Err(error)
        }
    }
}

/// Hand-off claims made together (`platform::batch`): the claims that concurrent hand-offs of a
/// process ask for while one statement runs are made by the next, in one transaction. Each
/// email is still claimed only when its own hand-off is about to start, so what a claim means
/// does not change ([`claim_many`]); only the commits are shared.
#[derive(Clone)]
pub struct Claims {
    batcher: platform::batch::Batcher<(String, Duration, Uuid), Option<Lease>>,
    pool: Pool,
}

/// Claims made in one statement at most.
const CLAIMS_PER_STATEMENT: usize = 256;

impl Claims {
    pub fn start(pool: Pool) -> Self {
        let batch_pool = pool.clone();
        let batcher = platform::batch::Batcher::start(CLAIMS_PER_STATEMENT, move |jobs| {
            let pool = batch_pool.clone();
            async move { claim_set(&pool, &jobs).await }
        });
        Self { batcher, pool }
    }

    /// One email's claim, as [`claim_many`] makes it, made with the claims other hand-offs
    /// ask for meanwhile (and, like it, withdrawn when its answer is lost).
    pub async fn claim(&self, email_id: &str, lease: Duration) -> anyhow::Result<Option<Lease>> {
        let started = std::time::Instant::now();
        let token = Uuid::now_v7();
        let claimed = self.batcher.call((email_id.to_owned(), lease, token)).await;
        if claimed.is_err() {
            tokio::spawn(unclaim(self.pool.clone(), email_id.to_owned(), token));
        }
        metrics::histogram!("email_handoff_phase_seconds", "phase" => "claim").record(started.elapsed().as_secs_f64());
        Ok(claimed?)
    }
}

/// Claims every job's email that is `pending`, each with the job's token; each job's lease,
/// in the jobs' order (`None`: not pending, or another job of the statement claimed it).
async fn claim_set(pool: &Pool, jobs: &[(String, Duration, Uuid)]) -> anyhow::Result<Vec<Option<Lease>>> {
    let client = pool.get().await?;
    let statement = client
        .prepare_cached(
            "UPDATE email_outbox o SET state = 'attempting', lease_token = w.token,
                 leased_until = now() + make_interval(secs => w.secs), attempts = o.attempts + 1, owner = $4
             FROM unnest($1::text[], $2::uuid[], $3::float8[]) AS w(email_id, token, secs)
             WHERE o.email_id = w.email_id AND (o.state || '') = 'pending'
             RETURNING o.email_id, o.lease_token, o.claim_scope_key, o.claim_token, o.attempts - 1",
        )
        .await?;
    let tokens: Vec<Uuid> = jobs.iter().map(|(_, _, token)| *token).collect();
    let ids: Vec<&str> = jobs.iter().map(|(email_id, _, _)| email_id.as_str()).collect();
    let seconds: Vec<f64> = jobs.iter().map(|(_, lease, _)| lease.as_secs_f64()).collect();
    let owner = platform::liveness::process_id();
    let rows = client.query(&statement, &[&ids, &tokens, &seconds, &owner]).await?;
    let mut leases: Vec<Option<Lease>> = jobs.iter().map(|_| None).collect();
    for row in rows {
        let token: Uuid = row.get(1);
        // Two claims of one email in one statement: the row took one token; its job wins.
        let Some(index) = tokens.iter().position(|candidate| *candidate == token) else { continue };
        leases[index] = Some(Lease {
            email_id: row.get(0),
            token,
            claim: row.get::<_, Option<String>>(2).zip(row.get::<_, Option<Uuid>>(3)),
            attempts: row.get(4),
        });
    }
    Ok(leases)
}

/// Who an email concerns, for its outcome events.
#[derive(Debug, Clone)]
pub struct Parties {
    pub email_id: String,
    pub space_id: String,
    pub contact_id: String,
    pub message_id: String,
}

/// Records a final outcome under the lease: the event on the email's stream, the row's state
/// and the idempotent answer. Fails with a conflict when the lease was lost.
pub async fn record(
    event_log: &EventLog,
    parties: &Parties,
    lease: &Lease,
    event: LogEvent,
) -> Result<Appended, AppendError> {
    record_with(event_log, parties, lease, event, None).await
}

/// [`record`], and for a hard bounce `EmailBounced{hard}` and a provider `bounce`
/// suppression of the address in the email's space (not removable through the API), unless
/// the address has one already.
async fn record_with(
    event_log: &EventLog,
    parties: &Parties,
    lease: &Lease,
    event: LogEvent,
    bounce: Option<&Bounce>,
) -> Result<Appended, AppendError> {
    // The outcome is known: while the database is away, keep trying to record it rather than
    // leave the email `attempting` under this live process until its lease ends (an append
    // that did commit makes the next one fail: the lease's row is no longer `attempting`).
    let transient = |error: &AppendError| matches!(error, AppendError::Unavailable(_) | AppendError::OutcomeUnknown(_));
    persist("record a hand-off's outcome", &lease.email_id, transient, || {
        record_once(event_log, parties, lease, event.clone(), bounce)
    })
    .await
}

async fn record_once(
    event_log: &EventLog,
    parties: &Parties,
    lease: &Lease,
    event: LogEvent,
    bounce: Option<&Bounce>,
) -> Result<Appended, AppendError> {
    match append_outcome(event_log, parties, lease, event.clone(), bounce, true).await {
        // The address was suppressed already: the bounce without a second suppression.
        Err(AppendError::Conflict { code: Code::SuppressionAlreadyExists, .. }) => {
            append_outcome(event_log, parties, lease, event, bounce, false).await
        }
        other => other,
    }
}

async fn append_outcome(
    event_log: &EventLog,
    parties: &Parties,
    lease: &Lease,
    event: LogEvent,
    bounce: Option<&Bounce>,
    suppress: bool,
) -> Result<Appended, AppendError> {
    let now = chrono::Utc::now();
    let suppression = match (bounce, suppress) {
        (Some(bounce), true) => Some(drawn_suppression(&bounce.address)?),
        _ => None,
    };
    let (streams, guards) = outcome_append(parties, lease, event, bounce, suppression, now);
    event_log.append(AppendRequest::in_space(&parties.space_id, streams, guards)).await
}

/// A provider suppression (`reason` `bounce` or `complaint`) of `address` in the space under
/// a new id, and the claim of its key (see [`decide::provider_suppression`]).
pub fn provider_suppression(
    space_id: &str,
    address: &str,
    reason: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(StreamAppend, Guard), AppendError> {
    let suppression = drawn_suppression(address)?;
    Ok(decide::provider_suppression(space_id, reason, suppression, now))
}

/// A new provider suppression's id, normalized identifier and subject.
fn drawn_suppression(address: &str) -> Result<decide::NewSuppression, AppendError> {
    let identifier = address.to_lowercase();
    let subject_id = platform::crypto::email_subject(&identifier).map_err(platform::log::Classify::append_error)?;
    Ok(decide::NewSuppression { suppression_id: platform::ids::new_id("sup"), identifier, subject_id })
}

/// Puts a hand-off the relay refused for now (or could not be reached for) back in the queue
/// after `delay`, under its lease (tried again while the database is away).
/// Gives back a claimed email that could not be rebuilt from the log (a defect, or a
/// definition that no longer reads): `pending` again after the delay `retry_schedule` gives
/// its attempt (the schedule's last delay once it is spent, a minute without one), with
/// `reason` in `last_error`. It is tried again then, and neither fails the step that claimed
/// it nor comes back at once to be claimed in every step.
pub async fn defer(pool: &Pool, lease: &Lease, retry_schedule: &[u64], reason: &str) -> anyhow::Result<()> {
    let delay_ms = usize::try_from(lease.attempts)
        .ok()
        .and_then(|attempts| retry_schedule.get(attempts))
        .or(retry_schedule.last())
        .copied()
        .unwrap_or(60_000);
    retry_later(pool, lease, Duration::from_millis(delay_ms), reason).await
}

pub(crate) async fn retry_later(pool: &Pool, lease: &Lease, delay: Duration, error: &str) -> anyhow::Result<()> {
    persist("queue a hand-off again", &lease.email_id, |_| true, || retry_later_once(pool, lease, delay, error)).await
}

async fn retry_later_once(pool: &Pool, lease: &Lease, delay: Duration, error: &str) -> anyhow::Result<()> {
    let client = pool.get().await?;
    client
        .execute(
            "UPDATE email_outbox SET state = 'pending', leased_until = NULL, lease_token = NULL, last_error = $3,
                 next_attempt_at = now() + make_interval(secs => $4)
             WHERE email_id = $1 AND lease_token = $2 AND (state || '') = 'attempting'",
            &[&lease.email_id, &lease.token, &error, &delay.as_secs_f64()],
        )
        .await?;
    Ok(())
}

/// An email ready for a hand-off: who it concerns, its message and the signing domain.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub parties: Parties,
    pub outgoing: Outgoing,
    pub domain_id: String,
    pub domain: DomainDef,
}

/// What a hand-off came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Handed {
    /// The outcome event recorded, and where.
    Recorded(Box<LogEvent>, Appended),
    /// Refused for now, or the relay unreachable: queued again for the outbox worker.
    Retry,
    /// Another hand-off took the email over, or recording failed: the outcome is unknown here.
    Lost,
}

/// Builds, signs and hands over a claimed email, then records the outcome under the lease.
/// `retry_schedule`: the outbox worker's delays; `None` (the inline hand-off) makes a refusal
/// for now or an unreachable relay final.
pub async fn hand_off(
    pool: &Pool,
    event_log: &EventLog,
    mailer: &Mailer,
    lease: &Lease,
    prepared: &Prepared,
    retry_schedule: Option<&[u64]>,
) -> Handed {
    let started = std::time::Instant::now();
    let built = platform::crypto::keyring()
        .and_then(|keyring| crate::dkim::open(keyring, &prepared.domain_id, &prepared.domain.dkim))
        .and_then(|pem| {
            message::build(
                &prepared.outgoing,
                &message::Signing { selector: &prepared.domain.dkim.selector, pem: &pem },
            )
        });
    metrics::histogram!("email_handoff_phase_seconds", "phase" => "build").record(started.elapsed().as_secs_f64());
    let relayed = std::time::Instant::now();
    let outcome = match built {
        Ok(message) => mailer.send(&prepared.parties.email_id, &message).await,
        Err(error) => Outcome::Rejected {
            permanent: true,
            code: None,
            reply: format!("the message could not be built: {error:#}"),
        },
    };
    let settled = settle(
        &prepared.parties,
        outcome,
        &prepared.outgoing.to,
        (lease.attempts, retry_schedule),
        platform::time::now_millis(),
    );
    let (event, bounce) = match settled {
        Settle::Record { event, bounce } => (*event, bounce),
        Settle::Retry { delay, error } => {
            return match retry_later(pool, lease, delay, &error).await {
                Ok(()) => Handed::Retry,
                Err(error) => {
                    tracing::warn!(error = %format!("{error:#}"), email = %lease.email_id, "could not queue a hand-off again");
                    Handed::Lost
                }
            };
        }
    };
    metrics::histogram!("email_handoff_phase_seconds", "phase" => "relay").record(relayed.elapsed().as_secs_f64());
    let recording = std::time::Instant::now();
    let recorded = record_with(event_log, &prepared.parties, lease, event.clone(), bounce.as_ref()).await;
    metrics::histogram!("email_handoff_phase_seconds", "phase" => "record").record(recording.elapsed().as_secs_f64());
    match recorded {
        Ok(appended) => Handed::Recorded(Box::new(event), appended),
        Err(error) => {
            tracing::error!(error = %error, email = %lease.email_id, "could not record a hand-off's outcome");
            Handed::Lost
        }
    }
}

/// Builds, signs and hands a test send's message to the relay inline (no outbox row: a test
/// send is answered with its outcome and never retried). Its status (`sent`, `failed` or
/// `outcome_unknown`) and, unless sent, the error's code and message, the relay's reply
/// without the address.
pub async fn hand_off_test(
    mailer: &Mailer,
    email_id: &str,
    (domain_id, domain): (&str, &DomainDef),
    outgoing: &Outgoing,
) -> (&'static str, Option<(String, String)>) {
    let built = platform::crypto::keyring()
        .and_then(|keyring| crate::dkim::open(keyring, domain_id, &domain.dkim))
        .and_then(|pem| message::build(outgoing, &message::Signing { selector: &domain.dkim.selector, pem: &pem }));
    let outcome = match built {
        Ok(message) => mailer.send(email_id, &message).await,
        Err(error) => {
            let reply = format!("the message could not be built: {error:#}");
            Outcome::Rejected { permanent: true, code: None, reply }
        }
    };
    match decide::redact(outcome, &outgoing.to) {
        Outcome::Accepted { .. } => ("sent", None),
        Outcome::Rejected { reply, .. } => ("failed", Some(("relay_rejected".to_owned(), reply))),
        Outcome::Unreachable { message } => ("failed", Some(("relay_unavailable".to_owned(), message))),
        Outcome::Unknown { message } => ("outcome_unknown", Some(("outcome_unknown".to_owned(), message))),
    }
}

async fn authored<T: serde::de::DeserializeOwned>(
    client: &impl deadpool_postgres::GenericClient,
    kind: &str,
    id: &str,
) -> anyhow::Result<T> {
    let statement = client
        .prepare_cached(
            "SELECT event_type, payload FROM events WHERE stream_id = $1 ORDER BY stream_version DESC LIMIT 1",
        )
        .await?;
    let row = client
        .query_opt(&statement, &[&format!("authoring/{kind}/{id}")])
        .await?
        .ok_or_else(|| anyhow::anyhow!("{kind} {id} is not defined"))?;
    match LogEvent::decode(row.get(0), row.get(1))? {
        LogEvent::ResourceDefined(resource) => Ok(serde_json::from_str(&resource.definition_json)?),
        other => anyhow::bail!("{kind} {id}: unexpected {}", other.event_type()),
    }
}

/// The `EmailScheduled` of email `email_id`; `None` when the log holds no such email.
pub async fn scheduled_event(
    client: &impl deadpool_postgres::GenericClient,
    email_id: &str,
) -> anyhow::Result<Option<proto::EmailScheduled>> {
    let statement = client
        .prepare_cached("SELECT payload FROM events WHERE stream_id = $1 AND event_type = 'EmailScheduled.v1'")
        .await?;
    let Some(row) = client.query_opt(&statement, &[&domain::email::stream_id(email_id)]).await? else {
        return Ok(None);
    };
    match LogEvent::decode("EmailScheduled.v1", row.get(0))? {
        LogEvent::EmailScheduled(event) => Ok(Some(event)),
        _ => anyhow::bail!("email {email_id}: not an EmailScheduled event"),
    }
}

/// Who an email concerns, from the log (to record its outcome without sending it): as its
/// `EmailScheduled` and its sender's domain name it.
pub async fn parties_from_log(
    client: &impl deadpool_postgres::GenericClient,
    email_id: &str,
) -> anyhow::Result<Parties> {
    let event = scheduled_event(client, email_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("email {email_id} has no EmailScheduled event"))?;
    let (_, domain) = sender_of(client, &event.sender_id).await?;
    Ok(parties_of(&event, &domain))
}

/// Sender `sender_id` and its domain, as the log defines them now.
async fn sender_of(
    client: &impl deadpool_postgres::GenericClient,
    sender_id: &str,
) -> anyhow::Result<(SenderDef, DomainDef)> {
    let sender: SenderDef = authored(client, domain::email::resources::SENDER, sender_id).await?;
    let domain: DomainDef = authored(client, domain::email::resources::DOMAIN, &sender.domain_id).await?;
    Ok((sender, domain))
}

/// Who the email `event` schedules concerns, its message sent from `domain`.
fn parties_of(event: &proto::EmailScheduled, domain: &DomainDef) -> Parties {
    Parties {
        email_id: event.email_id.clone(),
        space_id: event.space_id.clone(),
        contact_id: event.contact_id.clone(),
        message_id: message::message_id(&event.email_id, &domain.name),
    }
}

/// Emails rebuilt from the log for their hand-offs, with one read of all their
/// `EmailScheduled` and `EmailReleased` events, one of their contacts' data keys, and one of
/// each sender and domain they name: `Err` with its parties for one whose content is erased
/// (its contact was deleted before it left). A released email's message is dated at its
/// release, any other at its scheduling. An email that cannot be rebuilt (no scheduling in
/// the log, a sender that cannot be read, content that cannot be opened) is left out and
/// logged, so that it does not hold back the others.
pub async fn prepare_many_from_log(
    client: &mut deadpool_postgres::Client,
    email_ids: &[String],
    public_base_url: &str,
) -> anyhow::Result<Vec<Result<Prepared, Parties>>> {
    // The reads find their rows by key. Given arrays of keys PostgreSQL planned them again on
    // every call: in one transaction they run their generic plans, held to index lookups.
    let transaction = client.transaction().await?;
    let streams: Vec<String> = email_ids.iter().map(|id| domain::email::stream_id(id)).collect();
    let statement = transaction
        .prepare_cached(
            "SELECT event_type, payload FROM events
             WHERE stream_id = ANY($1) AND event_type IN ('EmailScheduled.v1', 'EmailReleased.v1')
             ORDER BY position",
        )
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&streams];
    let (_, rows) =
        tokio::try_join!(transaction.batch_execute(platform::db::KEYED_PLANS), transaction.query(&statement, &params))?;
    let prepared = rebuild(&transaction, rows, email_ids.len(), public_base_url).await?;
    transaction.commit().await?;
    Ok(prepared)
}

/// The emails of `rows` (their `EmailScheduled` and `EmailReleased` events, in the log's
/// order) rebuilt, as [`prepare_many_from_log`] answers; `asked`: how many emails were asked
/// for.
async fn rebuild(
    client: &impl deadpool_postgres::GenericClient,
    rows: Vec<tokio_postgres::Row>,
    asked: usize,
    public_base_url: &str,
) -> anyhow::Result<Vec<Result<Prepared, Parties>>> {
    let mut events = Vec::with_capacity(asked);
    let mut released: HashMap<String, i64> = HashMap::new();
    for row in rows {
        match LogEvent::decode(row.get(0), row.get(1))? {
            LogEvent::EmailScheduled(event) => events.push(event),
            LogEvent::EmailReleased(event) => {
                released.insert(event.email_id, event.at_ms);
            }
            _ => {}
        }
    }
    if events.len() < asked {
        tracing::warn!(asked, found = events.len(), "emails without a scheduling are not handed off");
    }
    let contacts: Vec<String> = events.iter().map(|event| event.contact_id.clone()).collect();
    let keys = platform::crypto::load_keys(client, &contacts).await?;
    let mut senders: HashMap<String, Option<(SenderDef, DomainDef)>> = HashMap::new();
    let mut prepared = Vec::with_capacity(events.len());
    for event in events {
        if !senders.contains_key(&event.sender_id) {
            let found = sender_of(client, &event.sender_id)
                .await
                .inspect_err(|error| {
                    tracing::warn!(sender = %event.sender_id, error = %format!("{error:#}"),
                    "emails of a sender that cannot be read are not handed off")
                })
                .ok();
            senders.insert(event.sender_id.clone(), found);
        }
        // One that cannot be rebuilt is left out, and the others go.
        let Some(Some((sender, domain))) = senders.get(&event.sender_id) else { continue };
        let parties = parties_of(&event, domain);
        let content: Option<proto::EmailContent> = match platform::events::open(event.content.as_ref(), &keys) {
            Ok(content) => content,
            Err(error) => {
                tracing::warn!(email = %event.email_id, error = %format!("{error:#}"),
                    "an email whose content cannot be opened is not handed off");
                continue;
            }
        };
        // Its contact's key destroyed: erased.
        let Some(content) = content else {
            prepared.push(Err(parties));
            continue;
        };
        let dated = released.get(&event.email_id).copied().unwrap_or(event.scheduled_at_ms);
        let outgoing = Outgoing::new(
            &event.email_id,
            sender,
            domain,
            &content,
            (dated, event.kind == "marketing"),
            public_base_url,
        )
        .in_language(Some(&event.locale));
        prepared.push(Ok(Prepared { parties, outgoing, domain_id: sender.domain_id.clone(), domain: domain.clone() }));
    }
    Ok(prepared)
}
