//! The preparation worker: fills the AI auto-fill attributes an event was accepted without,
//! then appends its readiness change.
//!
//! It runs on the worker runtime and follows the log with its own checkpoint (the lease
//! `preparation` in `worker_checkpoints`: one process at a time), at least once: an event
//! whose receipt is no longer pending was prepared already and is skipped, and the readiness
//! change is appended at version 2 of the event's stream with a guard that takes the receipt
//! out of the backlog exactly once, so a second run (after a crash between the append and the
//! checkpoint, or another process) changes nothing. A step commits its checkpoint right after
//! an event that needed the provider, so the lease is never held across many slow calls. An
//! event it cannot decode is recorded as a dead letter and passed over.
//!
//! Per missing attribute it calls the AI provider, each call that reaches the provider
//! spending one credit of the space:
//! - an answer that fits the attribute's type fills it;
//! - an answer that does not fit is asked again, at most [`UNFIT_ATTEMPTS`] calls in all,
//!   then the event is `failed`;
//! - a refusal makes the event `failed`;
//! - a call whose outcome cannot be known (a timeout after sending, a lost connection) makes
//!   it `outcome_unknown`: it may have been processed and billed, so it is not repeated;
//! - a call known not to have reached the provider is retried with backoff, at most
//!   [`TRANSIENT_ATTEMPTS`] times, then the event is `failed` (provider unavailable);
//! - no credits left makes it `failed` (insufficient credits).
//!
//! All attributes filled: `ready`, with the prepared values. `failed` and `outcome_unknown`
//! are final: the event never appears in the list; fire it again under a new eventId.

use std::time::Duration;

use ai_provider::{AiError, AiProvider, FillTask};
use anyhow::Context;
use backon::BackoffBuilder;
use deadpool_postgres::{GenericClient, Pool};
use futures_util::future::BoxFuture;
use platform::events::LogEvent;
use platform::log::{
    AppendError, AppendRequest, EventLog, ExpectedVersion, LOG_CHANNEL, NewEvent, StoredEvent, StreamAppend,
};
use platform::proto;
use serde_json::{Map, Value};

use crate::runtime::{Looked, Outcome, Worker};

/// The lease and checkpoint of this worker.
pub(crate) const WORKER: &str = "preparation";
/// Calls per attribute whose answers do not fit before the event is `failed`.
pub(crate) const UNFIT_ATTEMPTS: usize = 3;
/// Calls per attribute that did not reach the provider before the event is `failed`.
pub(crate) const TRANSIENT_ATTEMPTS: usize = 4;
/// Events read per step.
const BATCH: i64 = 500;
/// The events [`Preparation::handle`] acts on; others are passed over unread.
const PREPARED: &[&str] = &["EventAccepted.v1", "RecordCreated.v1", "RecordUpdated.v1"];
const POLL: Duration = Duration::from_millis(250);

/// The preparation worker.
pub struct Preparation {
    pool: Pool,
    log: EventLog,
    provider: AiProvider,
    lease: crate::runtime::LeaseName,
    /// The catalog's auto-fill attributes as the looks before the lease read them, with the
    /// catalog version and revision they were read at.
    looked_catalog: tokio::sync::Mutex<Option<((i32, i64), Catalog)>>,
}

impl Preparation {
    pub fn new(pool: Pool, log: EventLog, provider: AiProvider) -> Self {
        Self {
            pool,
            log,
            provider,
            lease: crate::runtime::LeaseName::new(WORKER),
            looked_catalog: tokio::sync::Mutex::new(None),
        }
    }

    /// Reads the next events after the checkpoint under the lease and prepares the pending
    /// ones; stops after one that called the provider, and commits the checkpoint.
    async fn prepare_next(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let looked = match self.look(&client).await? {
            Looked::Done(outcome) => return Ok(outcome),
            Looked::Lease(look) => look,
        };
        let Some(lease) = crate::runtime::Lease::acquire(&mut client, &self.lease).await? else {
            return Ok(Outcome::Idle);
        };
        let followed = crate::runtime::followed(&lease, looked, BATCH, PREPARED).await?;
        let Some(last) = followed.last else { return Ok(Outcome::Idle) };
        // Past every event read, unless a provider call stops the batch early.
        let mut reached = last;
        let mut catalog = Catalog::default();
        // More may be waiting after a full read or a stop after a provider call; otherwise the
        // next notification (or the poll) wakes the worker.
        let mut more = i64::try_from(followed.read).unwrap_or(i64::MAX) >= BATCH;
        // Whether the step did anything: called the provider, appended, or recorded a dead letter.
        let mut acted = false;
        for stored in &followed.events {
            match self.handle(stored, &mut catalog).await {
                Ok(called) => {
                    if called {
                        reached = stored.position;
                        more = true;
                        acted = true;
                        break;
                    }
                }
                Err(error) if platform::db::is_transient(&error) => return Err(error),
                Err(error) => {
                    // A poison event: recorded for an operator, then passed over.
                    crate::read_models::quarantine::record_worker_dead_letter(
                        lease.transaction(),
                        WORKER,
                        stored,
                        &error,
                    )
                    .await?;
                    acted = true;
                }
            }
        }
        if acted {
            lease.commit(reached).await?
        } else {
            lease.pass_over(reached).await?
        }
        Ok(if more { Outcome::Progressed } else { Outcome::Idle })
    }

    /// Looks at the next span without the lease ([`crate::runtime::look`]) and passes over
    /// one that holds nothing to prepare: no event accepted `pending`, and every record's
    /// schema without an auto-fill attribute (most schemas; the answer is kept while the
    /// catalog stays at its revision). A span with anything else takes the lease.
    async fn look(&self, client: &deadpool_postgres::Client) -> anyhow::Result<Looked> {
        let (look, catalog) =
            tokio::try_join!(crate::runtime::look(client, &self.lease, BATCH, PREPARED), catalog_revision(client))?;
        let Some(look) = look else { return Ok(Looked::Lease(None)) };
        if !look.followed.events.is_empty() {
            let Some(catalog) = catalog else { return Ok(Looked::Lease(Some(look))) };
            for stored in &look.followed.events {
                if self.may_prepare(client, stored, catalog).await? {
                    return Ok(Looked::Lease(Some(look)));
                }
            }
        }
        look.pass_over(client, &self.lease, BATCH).await
    }

    /// Whether [`Preparation::handle`] may act on `stored` (an event it cannot read counts:
    /// the lease's step dead-letters it).
    async fn may_prepare(
        &self,
        client: &deadpool_postgres::Client,
        stored: &StoredEvent,
        revision: (i32, i64),
    ) -> anyhow::Result<bool> {
        let Ok(event) = stored.decode() else { return Ok(true) };
        let schema_id = match event {
            LogEvent::EventAccepted(accepted) => return Ok(accepted.readiness == "pending"),
            LogEvent::RecordCreated(created) => created.schema_id,
            LogEvent::RecordUpdated(updated) => updated.schema_id,
            _ => return Ok(false),
        };
        // Kept while the catalog stays at the revision it was read at.
        let mut looked = self.looked_catalog.lock().await;
        let catalog = match &mut *looked {
            Some((at, catalog)) if *at == revision => catalog,
            stale => {
                let schema = platform::readmodel::schema_name(domain::catalog::CATALOG, revision.0);
                &mut stale.insert((revision, Catalog { schema: Some(schema), ..Catalog::default() })).1
            }
        };
        Ok(!catalog.auto_filled(client, &schema_id).await?.is_empty())
    }

    /// Prepares one event (or fills one record) if it needs it; `true` when the provider was
    /// called.
    async fn handle(&self, stored: &StoredEvent, catalog: &mut Catalog) -> anyhow::Result<bool> {
        match stored.event_type.as_str() {
            "EventAccepted.v1" => match stored.decode()? {
                LogEvent::EventAccepted(accepted) if accepted.readiness == "pending" => {
                    prepare(&self.pool, &self.log, &self.provider, stored, accepted, catalog).await
                }
                _ => Ok(false),
            },
            "RecordCreated.v1" | "RecordUpdated.v1" => {
                fill_record(&self.pool, &self.log, &self.provider, stored, catalog).await
            }
            _ => Ok(false),
        }
    }
}

/// The live catalog's version and revision (the position of its last change), or `None` when
/// it has no live version.
async fn catalog_revision(client: &deadpool_postgres::Client) -> anyhow::Result<Option<(i32, i64)>> {
    let statement =
        client.prepare_cached("SELECT version, revision FROM projections WHERE name = $1 AND status = 'live'").await?;
    let row = client.query_opt(&statement, &[&domain::catalog::CATALOG]).await?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

impl Worker for Preparation {
    fn name(&self) -> String {
        WORKER.to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[LOG_CHANNEL]
    }

    fn poll_interval(&self) -> Duration {
        POLL
    }

    fn idle_ceiling(&self) -> Duration {
        crate::runtime::FOLLOWER_IDLE_CEILING
    }

    fn spacing(&self) -> Duration {
        crate::runtime::FOLLOWER_SPACING
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.prepare_next())
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(crate::runtime::lag_behind(
            &self.pool,
            "SELECT position FROM worker_checkpoints WHERE name = $1",
            WORKER,
        ))
    }
}

/// The outcome of preparing one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    pub state: &'static str,
    pub reason: String,
    pub values: Map<String, Value>,
    pub credits_spent: i64,
}

async fn prepare(
    pool: &Pool,
    log: &EventLog,
    provider: &AiProvider,
    stored: &StoredEvent,
    accepted: proto::EventAccepted,
    catalog: &mut Catalog,
) -> anyhow::Result<bool> {
    let client = pool.get().await?;
    let pending = client
        .query_opt("SELECT pending FROM event_receipts WHERE id = $1", &[&accepted.id])
        .await?
        .is_some_and(|row| row.get::<_, bool>(0));
    if !pending {
        return Ok(false);
    }
    let subjects: Vec<String> = stored.subject_id.iter().cloned().collect();
    let keys = platform::crypto::load_keys(&client, &subjects).await?;
    let data: Option<proto::EventData> = platform::events::open(accepted.data.as_ref(), &keys)?;
    let definitions: Vec<(String, Value)> = catalog
        .auto_filled(&client, &accepted.schema_id)
        .await?
        .iter()
        .filter(|(key, _)| accepted.pending_keys.contains(key))
        .cloned()
        .collect();
    let credits = catalog.remaining_credits(&client, &accepted.space_id).await?;
    drop(client);
    let prepared = match data {
        None => Prepared {
            state: "failed",
            reason: "the event's subject was erased before preparation".to_owned(),
            values: Map::new(),
            credits_spent: 0,
        },
        Some(data) => {
            let input: Map<String, Value> = match serde_json::from_str(&data.values_json)? {
                Value::Object(input) => input,
                _ => Map::new(),
            };
            fill(provider, &input, &definitions, credits).await
        }
    };
    let mut sealed = platform::events::seal(
        stored.subject_id.as_deref().unwrap_or(&accepted.id),
        &proto::EventData { values_json: Value::Object(prepared.values.clone()).to_string() },
    );
    if let Some(key) = stored.subject_id.as_deref().and_then(|subject| keys.get(subject)) {
        platform::events::encrypt(&mut sealed, key)?;
    }
    let now = platform::time::now_millis();
    let change = proto::EventReadinessChanged {
        id: accepted.id.clone(),
        space_id: accepted.space_id.clone(),
        schema_id: accepted.schema_id.clone(),
        state: prepared.state.to_owned(),
        changed_at_ms: now,
        prepared: (prepared.state == "ready").then_some(sealed),
        reason: prepared.reason.clone(),
        credits_spent: prepared.credits_spent,
    };
    let outcome = log
        .append(AppendRequest::in_space(
            &accepted.space_id,
            vec![StreamAppend {
                stream_id: domain::business_events::stream_id(&accepted.id),
                expected: ExpectedVersion::Exactly(1),
                events: vec![NewEvent {
                    event: LogEvent::EventReadinessChanged(change),
                    subject_id: stored.subject_id.clone(),
                    occurred_at: platform::time::from_millis(now),
                }],
            }],
            domain::admission::preparation_guards(
                &accepted.id,
                &accepted.space_id,
                &accepted.schema_id,
                prepared.credits_spent,
            ),
        ))
        .await;
    match outcome {
        Ok(_) | Err(AppendError::WrongVersion { .. } | AppendError::Conflict { .. }) => Ok(true),
        Err(error) => Err(error.into()),
    }
}

/// What one pass reads from the live catalog, each at most once: its schema name and the
/// writable auto-fill attributes of each schema met.
#[derive(Default)]
struct Catalog {
    schema: Option<String>,
    auto_filled: std::collections::HashMap<String, Vec<(String, Value)>>,
}

impl Catalog {
    async fn schema(&mut self, client: &impl GenericClient) -> anyhow::Result<String> {
        if let Some(schema) = &self.schema {
            return Ok(schema.clone());
        }
        let statement =
            client.prepare_cached("SELECT version FROM projections WHERE name = $1 AND status = 'live'").await?;
        let version: i32 = client
            .query_opt(&statement, &[&domain::catalog::CATALOG])
            .await?
            .map(|row| row.get(0))
            .context("the catalog has no live version")?;
        let schema = platform::readmodel::schema_name(domain::catalog::CATALOG, version);
        self.schema = Some(schema.clone());
        Ok(schema)
    }

    /// The writable auto-fill attributes of `schema_id`, in order.
    async fn auto_filled(
        &mut self,
        client: &impl GenericClient,
        schema_id: &str,
    ) -> anyhow::Result<&[(String, Value)]> {
        if !self.auto_filled.contains_key(schema_id) {
            let catalog = self.schema(client).await?;
            let statement = client
                .prepare_cached(&format!(
                    "SELECT key, definition FROM {catalog}.attributes WHERE schema_id = $1 AND NOT is_base
                     ORDER BY ordinal"
                ))
                .await?;
            let rows = client.query(&statement, &[&schema_id]).await?;
            let attributes = rows
                .into_iter()
                .map(|row| (row.get::<_, String>(0), row.get::<_, Value>(1)))
                .filter(|(_, definition)| {
                    domain::attributes::is_writable(definition) && domain::attributes::has_auto_fill(definition)
                })
                .collect();
            self.auto_filled.insert(schema_id.to_owned(), attributes);
        }
        Ok(self.auto_filled.get(schema_id).map_or(&[], Vec::as_slice))
    }

    /// The space's remaining credits: its authored grant less what was spent (read fresh: the
    /// pass itself spends them).
    async fn remaining_credits(&mut self, client: &impl GenericClient, space_id: &str) -> anyhow::Result<i64> {
        let catalog = self.schema(client).await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT COALESCE((SELECT balance FROM {catalog}.ai_credits WHERE space_id = $1), 0)
                          - COALESCE((SELECT spent FROM ai_credit_spend WHERE space_id = $1), 0)"
                ),
                &[&space_id],
            )
            .await?;
        Ok(row.get(0))
    }
}

/// Fills the AI auto-fill attributes a record holds no value for, from its latest state, and
/// appends the filled values as a `RecordUpdated` at the stream version it read. A record
/// changed meanwhile loses the race and is looked at again when its newer event comes by; a
/// record whose attributes are all filled (including by this worker's own update) needs
/// nothing, so the worker never loops. A fill that fails leaves the attributes empty (the
/// next write of the record tries again) and records the credits it spent.
async fn fill_record(
    pool: &Pool,
    log: &EventLog,
    provider: &AiProvider,
    stored: &StoredEvent,
    catalog: &mut Catalog,
) -> anyhow::Result<bool> {
    let (record_id, schema_id) = match stored.decode()? {
        LogEvent::RecordCreated(created) => (created.record_id, created.schema_id),
        LogEvent::RecordUpdated(updated) => (updated.record_id, updated.schema_id),
        _ => return Ok(false),
    };
    let client = pool.get().await?;
    // Most schemas have no auto-fill attribute: nothing more to read for their records.
    if catalog.auto_filled(&client, &schema_id).await?.is_empty() {
        return Ok(false);
    }
    let latest = reads::records::load_records(&client, std::slice::from_ref(&record_id)).await?.pop();
    let Some((_, version, domain::records::Loaded::Live { state, key })) = latest else { return Ok(false) };
    let definitions: Vec<(String, Value)> = catalog
        .auto_filled(&client, &state.schema_id)
        .await?
        .iter()
        .filter(|(key, _)| state.values().get(key).is_none_or(Value::is_null))
        .cloned()
        .collect();
    if definitions.is_empty() || state.personal.is_none() {
        return Ok(false);
    }
    let credits = catalog.remaining_credits(&client, &state.space_id).await?;
    drop(client);
    let prepared = fill(provider, &state.values(), &definitions, credits).await;
    let now = platform::time::now_millis();
    let (stream, guards) = if prepared.state == "ready" {
        let mut values = state.values();
        values.extend(prepared.values.clone());
        let personal = state.personal_with_values(values);
        let mut sealed = platform::events::seal(&state.record_id, &personal);
        if let Some(key) = &key {
            platform::events::encrypt(&mut sealed, key)?;
        }
        // The same update rule as an API write.
        let updated = state.after_update(personal, now);
        let update = updated.updated_event(sealed, prepared.values.keys().cloned().collect(), prepared.credits_spent);
        let stream = StreamAppend {
            stream_id: stored.stream_id.clone(),
            expected: ExpectedVersion::Exactly(version),
            events: vec![NewEvent {
                event: LogEvent::RecordUpdated(update),
                subject_id: Some(state.record_id.clone()),
                occurred_at: platform::time::from_millis(now),
            }],
        };
        (stream, vec![domain::admission::spend_guard(&state.space_id, prepared.credits_spent)])
    } else if prepared.credits_spent > 0 {
        let spent = proto::AiCreditsSpent {
            space_id: state.space_id.clone(),
            subject_id: state.record_id.clone(),
            credits: prepared.credits_spent,
            reason: prepared.reason.clone(),
            spent_at_ms: now,
        };
        let stream = StreamAppend {
            stream_id: format!("credits/{}", state.space_id),
            expected: ExpectedVersion::Any,
            events: vec![NewEvent {
                event: LogEvent::AiCreditsSpent(spent),
                subject_id: Some(state.record_id.clone()),
                occurred_at: platform::time::from_millis(now),
            }],
        };
        (stream, vec![domain::admission::spend_guard(&state.space_id, prepared.credits_spent)])
    } else {
        return Ok(true);
    };
    match log.append(AppendRequest::in_space(&state.space_id, vec![stream], guards)).await {
        Ok(_) | Err(AppendError::WrongVersion { .. }) => Ok(true),
        Err(error) => Err(error.into()),
    }
}

/// Fills every attribute in `definitions` from `input`, with at most `credits` calls that
/// reach the provider.
pub async fn fill(
    provider: &AiProvider,
    input: &Map<String, Value>,
    definitions: &[(String, Value)],
    credits: i64,
) -> Prepared {
    let known: Map<String, Value> =
        input.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut prepared = Prepared { state: "ready", reason: String::new(), values: Map::new(), credits_spent: 0 };
    let fail = |mut prepared: Prepared, state: &'static str, reason: String| {
        prepared.state = state;
        prepared.reason = reason;
        prepared.values.clear();
        prepared
    };
    for (key, definition) in definitions {
        let mut unfit = 0;
        let mut transient = 0;
        // The waits between calls that did not reach the provider.
        let mut backoff = backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(5))
            .with_jitter()
            .without_max_times()
            .build();
        loop {
            if prepared.credits_spent >= credits {
                return fail(prepared, "failed", "insufficient_credits: the space has no AI credits left".to_owned());
            }
            let task = FillTask { attribute_key: key, definition, input: &known };
            let outcome = provider.fill(&task).await;
            if outcome.as_ref().err().is_none_or(AiError::spent) {
                prepared.credits_spent += 1;
            }
            match outcome {
                Ok(value) => {
                    prepared.values.insert(key.clone(), value);
                    break;
                }
                Err(AiError::Unfit(_)) if unfit + 1 < UNFIT_ATTEMPTS => unfit += 1,
                Err(AiError::Unfit(_)) => {
                    let reason = format!("ai_output_unfit: {UNFIT_ATTEMPTS} answers for {key} did not fit its type");
                    return fail(prepared, "failed", reason);
                }
                Err(AiError::Refused(_)) => {
                    return fail(prepared, "failed", format!("ai_refused: the AI provider refused to fill {key}"));
                }
                Err(AiError::OutcomeUnknown(_)) => {
                    let reason = format!("ai_outcome_unknown: the outcome of the call filling {key} is unknown");
                    return fail(prepared, "outcome_unknown", reason);
                }
                Err(AiError::Transient(_)) if transient + 1 < TRANSIENT_ATTEMPTS => {
                    transient += 1;
                    tokio::time::sleep(backoff.next().unwrap_or(Duration::from_secs(5))).await;
                }
                Err(AiError::Transient(_)) => {
                    let reason = format!("ai_unavailable: the AI provider could not be reached to fill {key}");
                    return fail(prepared, "failed", reason);
                }
            }
        }
    }
    prepared
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn definition(prompt: &str) -> Vec<(String, Value)> {
        vec![("summary".to_owned(), json!({"type": "string", "autoFill": {"enabled": true, "prompt": prompt}}))]
    }

    fn input() -> Map<String, Value> {
        let Value::Object(input) = json!({"plan": "pro", "summary": null}) else { panic!("object") };
        input
    }

    #[tokio::test]
    async fn a_fitting_answer_makes_the_event_ready_and_spends_one_credit() {
        let prepared = fill(&AiProvider::Deterministic, &input(), &definition("summary"), 5).await;
        assert_eq!(prepared.state, "ready");
        assert_eq!(prepared.credits_spent, 1);
        assert!(prepared.values["summary"].as_str().is_some_and(|s| s.starts_with("summary: ")));
    }

    #[tokio::test]
    async fn refusals_unfit_answers_and_unknown_outcomes_end_in_their_states() {
        let refused = fill(&AiProvider::Deterministic, &input(), &definition("[refuse]"), 5).await;
        assert_eq!((refused.state, refused.credits_spent), ("failed", 1));
        assert!(refused.reason.starts_with("ai_refused"));
        assert!(refused.values.is_empty());
        let unfit = fill(&AiProvider::Deterministic, &input(), &definition("[unfit]"), 5).await;
        assert_eq!((unfit.state, unfit.credits_spent), ("failed", UNFIT_ATTEMPTS as i64));
        let unknown = fill(&AiProvider::Deterministic, &input(), &definition("[unknown]"), 5).await;
        assert_eq!((unknown.state, unknown.credits_spent), ("outcome_unknown", 1));
    }

    #[tokio::test]
    async fn calls_that_never_reached_the_provider_are_retried_and_cost_nothing() {
        let transient = fill(&AiProvider::Deterministic, &input(), &definition("[transient]"), 5).await;
        assert_eq!((transient.state, transient.credits_spent), ("failed", 0));
        assert!(transient.reason.starts_with("ai_unavailable"));
    }

    #[tokio::test]
    async fn no_credits_fails_without_a_call() {
        let broke = fill(&AiProvider::Deterministic, &input(), &definition("summary"), 0).await;
        assert_eq!((broke.state, broke.credits_spent), ("failed", 0));
        assert!(broke.reason.starts_with("insufficient_credits"));
        let two =
            definition("a").into_iter().chain([("other".to_owned(), json!({"type": "integer"}))]).collect::<Vec<_>>();
        let short = fill(&AiProvider::Deterministic, &input(), &two, 1).await;
        assert_eq!((short.state, short.credits_spent), ("failed", 1));
    }
}
