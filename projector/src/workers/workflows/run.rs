//! Advancing one run: the shell around [`journeys::decide`]. A tick reads the run's row (the
//! engine's copy of the run's stream, written with it, with the workflow's pause control)
//! and the definition at the run's revision (from the log), loads each fact the decision asks
//! for (the contact, a template, a suppression, the signing secret), and appends the
//! transition: the run's events at its stream's version, the other streams' events and their
//! guards, and the row's update at the row's version. Then it does what the transition
//! leaves to do: an email's hand-off, or a webhook call. A call is two transitions: its start
//! is committed before the request goes out, with a lease on the row naming this process (so
//! no other process decides the run while the request is out), and its outcome after; a
//! start found without an outcome after a crash (the lease ran out, or its process stopped
//! beating) is `outcome_unknown`, never repeated.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::{GenericClient, Pool};
use domain::email::story::Story;
use domain::records::Loaded;
use domain::workflows::{WorkflowDef, run_stream_id};
use mail::outbox::{self, Prepared};
use mail::send::{Authored, Gate};
use mail::skipped::{DecidedBy, Refused};
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, Classify, ExpectedVersion, Guard, NewEvent, SetValue, StreamAppend};
use serde_json::Value;

use super::Inner;
use crate::workers::outbound::{AttemptResult, classify, describe, retry_after};
use journeys::decide::{
    Call, CallOutcome, Contact, ContactFacts, Decided, Engaged, Facts, Given, Need, Row, RunStatus, Tick, decide, open,
};

/// The largest webhook answer body kept for later conditions.
const ANSWER_MAX_BYTES: usize = 64 * 1024;
/// Facts one decision may ask for at most (the contact, a template and a suppression, the
/// secret): a decision that asks for more is broken.
const NEEDS_MAX: usize = 8;

/// What a tick reads of a run (`r`, a `workflow_runs` row), with its workflow's pause control
/// and its data key: the engine's read of due runs returns it, and the tick after a call
/// reads it again.
pub(super) const ROW: &str = "r.run_id, r.workflow_id, r.space_id, r.revision, r.contact_id, r.status, r.step_id,
    r.step_count, r.version, r.paused, r.in_flight, r.waiting_schema, r.matched_event, r.passes, r.input, r.outputs,
    COALESCE((SELECT c.paused FROM workflow_controls c WHERE c.workflow_id = r.workflow_id), false),
    (SELECT k.wrapped_key FROM subject_keys k WHERE k.subject_id = COALESCE(r.contact_id, r.run_id)),
    r.migrate_to, r.row_version";
/// The place of `r.row_version` in [`ROW`].
pub(super) const ROW_VERSION: usize = 19;

/// The run's row at `row_version`, the one this process's last transition wrote (see
/// [`ROW`]); none when another process has moved the run on since.
async fn load_row(client: &impl GenericClient, run_id: &str, row_version: i64) -> anyhow::Result<Option<Row>> {
    let statement = client
        .prepare_cached(&format!("SELECT {ROW} FROM workflow_runs r WHERE r.run_id = $1 AND r.row_version = $2"))
        .await?;
    client.query_opt(&statement, &[&run_id, &row_version]).await?.as_ref().map(read_row).transpose()
}

/// A row selected as [`ROW`], its data key unwrapped.
pub(super) fn read_row(row: &tokio_postgres::Row) -> anyhow::Result<Row> {
    let run_id: String = row.get(0);
    let contact_id: Option<String> = row.get(4);
    let subject = contact_id.clone().unwrap_or_else(|| run_id.clone());
    let mut keys = platform::crypto::Keys::default();
    if let Some(wrapped) = row.get::<_, Option<Vec<u8>>>(17) {
        let key = platform::crypto::keyring()?.unwrap_key(&subject, &wrapped)?;
        keys.insert(subject, key);
    }
    Ok(Row {
        run_id: run_id.into(),
        workflow_id: row.get(1),
        space_id: row.get(2),
        revision: row.get(3),
        contact_id,
        status: RunStatus::parse(row.get(5))?,
        step_id: row.get(6),
        step_count: row.get(7),
        version: row.get(8),
        paused: row.get(9),
        in_flight: row.get::<_, Option<Value>>(10).map(serde_json::from_value).transpose()?,
        waiting_schema: row.get(11),
        matched_event: row.get(12),
        passes: serde_json::from_value(row.get(13))?,
        input: row.get(14),
        outputs: row.get(15),
        control_paused: row.get(16),
        keys,
        migrate_to: row.get(18),
        row_version: row.get(ROW_VERSION),
    })
}

/// After a failed tick: the run is due again in a few seconds, a call's lease given back
/// (its start then reads as `outcome_unknown`), unless another process moved the row past
/// `row_version` meanwhile (none known: whatever its version).
pub(super) async fn back_off(pool: &Pool, run_id: &str, row_version: Option<i64>) {
    let Ok(client) = pool.get().await else { return };
    let _ = client
        .execute(
            "UPDATE workflow_runs SET due_at = clock_timestamp() + interval '2 seconds', lease_token = NULL,
                 lease_until = NULL, row_version = row_version + 1
             WHERE run_id = $1 AND ($2::bigint IS NULL OR row_version = $2)",
            &[&run_id, &row_version],
        )
        .await;
}

/// How many times a transition is decided again at once when the contact's marketing sends
/// moved under it.
const MOVED_RETRIES: u32 = 3;

/// Advances a due run by one transition (two around a webhook call), from the row the
/// engine read. A tick that fails backs the run off, unless another process moved it on.
pub(super) async fn advance(inner: &Arc<Inner>, claimed: Row) {
    let run_id = claimed.run_id.clone();
    let mut row_version = claimed.row_version;
    if let Err(error) = advance_from(inner, claimed, &mut row_version).await {
        tracing::warn!(run = %run_id, error = format!("{error:#}"), "a workflow run will be tried again");
        back_off(&inner.pool, &run_id, Some(row_version)).await;
    }
}

/// [`advance`]; `row_version` follows the row's version through the transitions this process
/// commits.
async fn advance_from(inner: &Arc<Inner>, claimed: Row, row_version: &mut i64) -> anyhow::Result<()> {
    let run_id = claimed.run_id.clone();
    let run_id = run_id.as_str();
    let mut claimed = Some(claimed);
    let mut outcome: Option<CallOutcome> = None;
    let mut allowance_refused = false;
    let mut moved = 0;
    loop {
        let row = match claimed.take() {
            Some(row) => row,
            None => {
                let client = inner.pool.get().await?;
                let Some(row) = load_row(&client, run_id, *row_version).await? else { return Ok(()) };
                row
            }
        };
        let definition = definition(inner, &row.workflow_id, row.revision).await?;
        let newer = match row.migrate_to {
            Some(to) if to > row.revision => Some((to, self::definition(inner, &row.workflow_id, to).await?)),
            _ => None,
        };
        let given = Given {
            now: platform::time::now_millis(),
            jitter: rand::random_range(0.8..1.2),
            allowance_refused,
            call_outcome: outcome.as_ref(),
            retry_schedule_ms: &inner.settings.webhooks.retry_schedule_ms,
            site: &inner.site,
            newer: newer.as_ref().map(|(to, definition)| (*to, definition.as_ref())),
        };
        let mut tick = decided(inner, &row, &definition, &given).await?;
        outcome = None;
        let email = tick.email.take();
        match append(inner, &mut tick).await {
            Ok(next) => *row_version = next,
            // The month's allowance ran out since the gate was read: the send is skipped.
            Err(AppendError::Conflict { code: Code::EmailLimitReached, .. }) if !allowance_refused => {
                allowance_refused = true;
                continue;
            }
            // The contact was sent marketing email since its sends were read: decide again now,
            // from a new reading (a few times, then as any lost race).
            Err(AppendError::Conflict { code: Code::StreamMoved, .. }) if moved < MOVED_RETRIES => {
                moved += 1;
                continue;
            }
            // The contact changed meanwhile, or another process moved the run on: decide again
            // later (the back-off leaves a run that moved alone).
            Err(error @ (AppendError::WrongVersion { .. } | AppendError::Conflict { .. })) => {
                tracing::debug!(run = %run_id, %error, "a workflow transition lost a race");
                back_off(&inner.pool, run_id, Some(*row_version)).await;
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
        if let Some(prepared) = email {
            // The run waits here (in its slot) while every hand-off permit is taken, so that
            // rendered messages do not pile up in memory when the relay is slower than the runs.
            let permit = inner.handoffs.clone().acquire_owned().await?;
            let inner = inner.clone();
            tokio::spawn(async move {
                hand_off(&inner, &prepared).await;
                drop(permit);
            });
        }
        let Some(call) = tick.call.take() else { return Ok(()) };
        // The attempt is committed as going out, under this process's lease: now it goes.
        let sent = send(inner, &call).await;
        if let AttemptResult::Retryable { status, error, .. } = &sent.result {
            // A retry goes out with the same `webhook-id`: a receiver sees it again.
            tracing::debug!(run = %run_id, call = %call.call_id, ?status, %error, "a workflow call's attempt failed");
        }
        outcome = Some(sent);
    }
}

/// The run's next transition, decided with each fact the decision asks for loaded.
async fn decided(inner: &Inner, row: &Row, definition: &WorkflowDef, given: &Given<'_>) -> anyhow::Result<Tick> {
    let opened = open(row)?;
    let mut facts = Facts::default();
    for _ in 0..NEEDS_MAX {
        match decide((row, &opened), definition, &facts, given)? {
            Decided::Tick(tick) => return Ok(*tick),
            Decided::Needs(need) => load(inner, row, definition, &mut facts, need).await?,
        }
    }
    anyhow::bail!("run {}: its decision kept asking for facts", row.run_id)
}

/// Loads the fact a decision asked for.
async fn load(inner: &Inner, row: &Row, definition: &WorkflowDef, facts: &mut Facts, need: Need) -> anyhow::Result<()> {
    match need {
        Need::Contact => facts.contact = Some(contact_facts(inner, row).await?),
        Need::Template(template_id) => {
            let client = inner.pool.get().await?;
            let catalog = live_schema(&client, "catalog").await?;
            let authored = Authored::load(&client, &catalog, &row.space_id, &template_id).await?;
            facts.templates.insert(template_id, authored);
        }
        Need::Suppression(address) => {
            let client = inner.pool.get().await?;
            let suppressed = mail::facts::suppressed(&client, &row.space_id, &[&address]).await?.contains(&address);
            facts.suppressed.insert(address, suppressed);
        }
        Need::Engagement(email_ids) => {
            // Each email's story, as `GET /emails/{id}` tells it: one rule of what a person did.
            let client = inner.pool.get().await?;
            let streams: Vec<String> = email_ids.iter().map(|id| domain::email::stream_id(id)).collect();
            let mut stories: BTreeMap<String, Story> = BTreeMap::new();
            for stored in platform::log::read_streams(&client, &streams).await? {
                let event = stored.decode()?;
                let Some(email_id) = event.email_id().map(str::to_owned) else { continue };
                if let Some(story) = domain::email::story::apply(stories.remove(&email_id), &event) {
                    stories.insert(email_id, story);
                }
            }
            for email_id in email_ids {
                let engagement = stories.get(&email_id).map(|story| &story.engagement);
                let engaged = Engaged {
                    opened: engagement.is_some_and(|engagement| engagement.human_opens > 0),
                    clicked: engagement.is_some_and(|engagement| engagement.human_clicks > 0),
                };
                facts.engagement.insert(email_id, engaged);
            }
        }
        Need::DecidedBy { gate, address, topic_id, filled_by } => {
            let refusal = (gate, address.as_str(), topic_id.as_deref(), filled_by);
            let decided_by = decided_by(inner, row, facts, refusal).await?;
            facts.decided_by.insert(gate.as_str(), decided_by);
        }
        Need::MarketingSends { since_ms } => {
            let client = inner.pool.get().await?;
            let contact_id = row.contact_id.clone().unwrap_or_default();
            let mut sent = mail::facts::marketing_sends(&client, std::slice::from_ref(&contact_id), since_ms).await?;
            facts.sent = Some(sent.remove(&contact_id).unwrap_or_default());
        }
        Need::Secret => {
            facts.secret = Some(match &definition.signing {
                Some(stored) => {
                    let keyring = platform::crypto::keyring()?;
                    let subject = domain::workflows::secret_subject(&row.workflow_id);
                    let key = keyring.unwrap_key(&subject, &domain::workflows::wrapped_key(stored)?)?;
                    let secret = domain::workflows::open_secret(&key, &row.workflow_id, stored)?;
                    domain::webhooks::signing::Secret::parse(&secret)
                }
                None => None,
            });
        }
    }
    Ok(())
}

/// The definition the run follows, from its authoring stream in the log.
async fn definition(inner: &Inner, workflow_id: &str, revision: i64) -> anyhow::Result<Arc<WorkflowDef>> {
    let cache_key = (workflow_id.to_owned(), revision);
    let cached = || inner.definitions.lock().ok().and_then(|cache| cache.get(&cache_key).cloned());
    if let Some(found) = cached() {
        return Ok(found);
    }
    // One read per definition: the runs that missed it together wait for the first.
    let _loading = inner.loading.lock().await;
    if let Some(found) = cached() {
        return Ok(found);
    }
    let client = inner.pool.get().await?;
    let definition = Arc::new(definition_at(&client, workflow_id, revision).await?);
    if let Ok(mut cache) = inner.definitions.lock() {
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(cache_key, definition.clone());
    }
    Ok(definition)
}

/// Revision `revision` of workflow `workflow_id`, from its authoring stream.
pub(super) async fn definition_at(
    client: &impl GenericClient,
    workflow_id: &str,
    revision: i64,
) -> anyhow::Result<WorkflowDef> {
    let stream = format!("authoring/{}/{workflow_id}", domain::workflows::WORKFLOW);
    let events = platform::log::read_streams(client, &[stream]).await?;
    let found = events
        .iter()
        .filter_map(|stored| match stored.decode() {
            Ok(LogEvent::ResourceDefined(resource)) if resource.revision == revision => Some(resource),
            _ => None,
        })
        .next_back()
        .ok_or_else(|| anyhow::anyhow!("workflow {workflow_id} has no revision {revision}"))?;
    Ok(serde_json::from_str(&found.definition_json)?)
}

async fn contact_facts(inner: &Inner, row: &Row) -> anyhow::Result<ContactFacts> {
    let Some(contact_id) = &row.contact_id else { return Ok(ContactFacts::None) };
    let client = inner.pool.get().await?;
    let mut found = contacts_facts(&client, std::slice::from_ref(contact_id)).await?;
    Ok(found.remove(contact_id).unwrap_or(ContactFacts::Gone))
}

/// What steps read of each contact (its record, consent, subscriptions and segments), in a
/// few statements for all of them: the engine asks for one, a replay for a batch. A contact
/// being deleted or erased is `Gone`.
pub(super) async fn contacts_facts(
    client: &impl GenericClient,
    contact_ids: &[String],
) -> anyhow::Result<BTreeMap<String, ContactFacts>> {
    let mut facts = BTreeMap::new();
    if contact_ids.is_empty() {
        return Ok(facts);
    }
    let catalog = live_schema(client, "catalog").await?;
    let segments_schema = live_schema(client, "segments").await?;
    let mut live = Vec::new();
    for (contact_id, version, loaded) in reads::records::load_records(client, contact_ids).await? {
        match loaded {
            Loaded::Live { state, key } if state.personal.is_some() => live.push((contact_id, version, state, key)),
            _ => {
                facts.insert(contact_id, ContactFacts::Gone);
            }
        }
    }
    let schema_ids: Vec<String> = live
        .iter()
        .map(|(_, _, state, _)| state.schema_id.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let rows = client
        .query(
            &format!("SELECT schema_id, key, definition, is_base FROM {catalog}.attributes WHERE schema_id = ANY($1)"),
            &[&schema_ids],
        )
        .await?;
    // By schema: every attribute (whose email consent keys the send decision's rule picks),
    // and what a record write holds values to (`reads::catalog::write_context`): the custom
    // attributes.
    let mut by_schema: BTreeMap<String, (Vec<domain::catalog::AttributeEntry>, Vec<domain::catalog::AttributeEntry>)> =
        BTreeMap::new();
    for row in rows {
        let (all, custom) = by_schema.entry(row.get(0)).or_default();
        let attribute = domain::catalog::AttributeEntry { key: row.get(1), definition: row.get::<_, Value>(2) };
        if !row.get::<_, bool>(3) {
            custom.push(attribute.clone());
        }
        all.push(attribute);
    }
    let schemas: BTreeMap<String, (Vec<String>, Vec<domain::catalog::AttributeEntry>)> = by_schema
        .into_iter()
        .map(|(schema_id, (all, custom))| (schema_id, (mail::send::consent_keys(&all), custom)))
        .collect();
    let live_ids: Vec<String> = live.iter().map(|(contact_id, ..)| contact_id.clone()).collect();
    let mut subscriptions = reads::email::subscriptions_of(client, &live_ids).await?;
    let mut segments: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    for row in client
        .query(
            &format!("SELECT contact_id, segment_id FROM {segments_schema}.members WHERE contact_id = ANY($1)"),
            &[&live_ids],
        )
        .await?
    {
        segments.entry(row.get(0)).or_default().insert(row.get(1));
    }
    for (contact_id, version, state, key) in live {
        let (consent_keys, attributes) = schemas.get(&state.schema_id).cloned().unwrap_or_default();
        let values = state.values();
        let consent = mail::send::email_consent(&consent_keys, |key| values.get(key));
        let contact = Contact {
            version,
            key,
            consent,
            consent_keys,
            subscriptions: subscriptions.remove(&contact_id).unwrap_or_default(),
            segments: segments.remove(&contact_id).unwrap_or_default(),
            attributes,
            state,
        };
        facts.insert(contact_id, ContactFacts::Live(Box::new(contact)));
    }
    Ok(facts)
}

/// The log event from which the state that made `gate` refuse a send to `address` held
/// (`mail::skipped::decided_by`).
async fn decided_by(
    inner: &Inner,
    row: &Row,
    facts: &Facts,
    (gate, address, topic_id, filled_by): (Gate, &str, Option<&str>, Option<i64>),
) -> anyhow::Result<Option<DecidedBy>> {
    let client = inner.pool.get().await?;
    let mut keys = platform::crypto::Keys::default();
    let (contact_id, consent_keys) = match &facts.contact {
        Some(ContactFacts::Live(contact)) => {
            if let Some(key) = &contact.key {
                keys.insert(contact.state.record_id.clone(), key.clone());
            }
            (contact.state.record_id.as_str(), contact.consent_keys.as_slice())
        }
        _ => return Ok(None),
    };
    let refused = [Refused { contact_id, gate, address, topic_id, consent_keys, filled_by }];
    Ok(mail::skipped::decided_by(&client, &row.space_id, &refused, &keys).await?.pop().flatten())
}

async fn live_schema(client: &impl GenericClient, name: &str) -> anyhow::Result<String> {
    platform::readmodel::live_schema(client, name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("read model {name} has no live version yet"))
}

/// One attempt of a call.
async fn send(inner: &Inner, call: &Call) -> CallOutcome {
    if let Some(refusal) = domain::webhooks::target::url_refusal(&call.url, inner.settings.webhooks.allow_loopback) {
        let error = format!("the target is refused: {}", refusal.message());
        return CallOutcome { result: AttemptResult::Rejected { status: None, error }, body: None };
    }
    let timestamp = chrono::Utc::now().timestamp();
    let mut request = inner
        .http
        .post(&call.url)
        .header("content-type", "application/json")
        .header("webhook-id", &call.call_id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("x-webhook-id", &call.call_id);
    if let Some(secret) = &call.secret {
        let signature = domain::webhooks::signing::signature_header(
            std::slice::from_ref(secret),
            &call.call_id,
            timestamp,
            &call.body,
        );
        request = request.header("webhook-signature", signature);
    }
    match request.body(call.body.clone()).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let result = classify(status, retry_after(response.headers()));
            let body = response
                .bytes()
                .await
                .ok()
                .filter(|bytes| bytes.len() <= ANSWER_MAX_BYTES)
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok());
            CallOutcome { result, body }
        }
        Err(error) => CallOutcome {
            result: AttemptResult::Retryable { status: None, error: describe(&error), retry_after: None },
            body: None,
        },
    }
}

/// Appends the transition with the row's update at the row's own version; returns the row's
/// new version. A transition that starts a call (or a call's next attempt) leases the row to this
/// process for the call.
async fn append(inner: &Inner, tick: &mut Tick) -> Result<i64, AppendError> {
    let row = &tick.row;
    // One log event per transition, however many changes it made.
    let events = domain::workflows::transition(&row.run_id, &row.space_id, std::mem::take(&mut tick.events));
    let count = i64::try_from(events.len()).unwrap_or(0);
    let next = tick.base_version + count;
    let base_row = row.row_version;
    // A call holds the row while it goes out: for the lease (the attempt's timeout and a
    // margin), or until this process stops beating. No owner when the process does not beat
    // (the lease's end alone then frees it).
    let lease_ms = if tick.call.is_some() { i64::try_from(inner.lease().as_millis()).unwrap_or(i64::MAX) } else { 0 };
    let owner = platform::liveness::process_id();
    let outputs = tick.sealed_outputs().map_err(|error| AppendError::Failed(format!("{error:#}")))?;
    // A step in flight keeps when it is due, so that a move to a newer revision keeps it.
    let in_flight = tick.in_flight_json().map_err(|e| AppendError::Failed(e.to_string()))?;
    let passes = serde_json::to_value(&row.passes).map_err(|error| AppendError::Failed(error.to_string()))?;
    // The set form's row: the same values, with sentinels for what an array cannot hold as
    // SQL NULL (no due time: -1; no call in flight: JSON null; no outputs: empty bytes).
    let set_row = vec![
        SetValue::Text(Some(row.run_id.clone().into())),
        SetValue::BigInt(base_row),
        SetValue::Text(Some(row.status.as_str().to_owned())),
        SetValue::Text(row.step_id.clone()),
        SetValue::Int(row.step_count),
        SetValue::BigInt(next),
        SetValue::BigInt(tick.due_ms.unwrap_or(-1)),
        SetValue::Int(i32::from(row.paused)),
        SetValue::Json(in_flight.clone().unwrap_or(Value::Null)),
        SetValue::Text(row.waiting_schema.clone()),
        SetValue::Int(i32::from(tick.new_wait)),
        SetValue::Json(passes.clone()),
        SetValue::Bytes(outputs.clone().unwrap_or_default()),
        SetValue::Int(i32::from(tick.finished)),
        SetValue::BigInt(lease_ms),
        SetValue::BigInt(row.revision),
        SetValue::BigInt(tick.migrated_to.unwrap_or(0)),
        SetValue::Uuid(owner.unwrap_or_default()),
    ];
    let mut guards: Vec<Guard> = Vec::new();
    guards.push(
        Guard::exactly_one(
            "UPDATE workflow_runs SET status = $3, step_id = $4, step_count = $5, version = $6,
             due_at = CASE WHEN migrate_to > GREATEST($16::bigint, $17::bigint) AND NOT $14 THEN clock_timestamp()
                           WHEN $7::bigint IS NULL THEN NULL ELSE to_timestamp($7::bigint / 1000.0) END,
             revision = $16, migrate_to = CASE WHEN migrate_to > GREATEST($16::bigint, $17::bigint) THEN migrate_to END,
             paused = $8, in_flight = $9, waiting_schema = $10,
             waiting_after = CASE WHEN $11 THEN (SELECT position FROM log_head)
                                  WHEN $10::text IS NULL THEN NULL ELSE waiting_after END,
             matched_event = CASE WHEN $10::text IS NULL OR $11 THEN NULL ELSE matched_event END,
             passes = $12, outputs = $13, finished_at = CASE WHEN $14 THEN clock_timestamp() END,
             lease_token = CASE WHEN $15::bigint > 0 THEN $18::uuid END,
             lease_until = CASE WHEN $15::bigint > 0 THEN clock_timestamp() + $15::bigint * interval '1 millisecond' END,
             row_version = row_version + 1
         WHERE run_id = $1 AND row_version = $2",
            vec![
                Box::new(row.run_id.clone()),
                Box::new(base_row),
                Box::new(row.status.as_str().to_owned()),
                Box::new(row.step_id.clone()),
                Box::new(row.step_count),
                Box::new(next),
                Box::new(tick.due_ms),
                Box::new(row.paused),
                Box::new(in_flight),
                Box::new(row.waiting_schema.clone()),
                Box::new(tick.new_wait),
                Box::new(passes),
                Box::new(outputs),
                Box::new(tick.finished),
                // A call holds the row while it goes out; every other transition frees it.
                Box::new(lease_ms),
                Box::new(row.revision),
                // The mark this transition handled; a newer one keeps the run due.
                Box::new(tick.migrated_to.unwrap_or(0)),
                Box::new(owner),
            ],
            AppendError::Conflict {
                code: Code::ConcurrentModification,
                message: "another process moved the run on".to_owned(),
            },
        )
        .with_set(
            "UPDATE workflow_runs r SET status = u.status, step_id = u.step_id, step_count = u.step_count,
             version = u.version,
             due_at = CASE WHEN r.migrate_to > GREATEST(u.revision, u.migrated_to) AND u.finished = 0
                               THEN clock_timestamp()
                           WHEN u.due_ms < 0 THEN NULL ELSE to_timestamp(u.due_ms::bigint / 1000.0) END,
             revision = u.revision,
             migrate_to = CASE WHEN r.migrate_to > GREATEST(u.revision, u.migrated_to) THEN r.migrate_to END,
             paused = u.paused = 1, in_flight = NULLIF(u.in_flight, 'null'::jsonb), waiting_schema = u.waiting_schema,
             waiting_after = CASE WHEN u.new_wait = 1 THEN (SELECT position FROM log_head)
                                  WHEN u.waiting_schema IS NULL THEN NULL ELSE r.waiting_after END,
             matched_event = CASE WHEN u.waiting_schema IS NULL OR u.new_wait = 1 THEN NULL ELSE r.matched_event END,
             passes = u.passes, outputs = NULLIF(u.outputs, ''::bytea),
             finished_at = CASE WHEN u.finished = 1 THEN clock_timestamp() END,
             lease_token = CASE WHEN u.lease_ms > 0 THEN NULLIF(u.owner, '00000000-0000-0000-0000-000000000000') END,
             lease_until = CASE WHEN u.lease_ms > 0 THEN clock_timestamp() + u.lease_ms * interval '1 millisecond' END,
             row_version = r.row_version + 1
         FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::int4[], $6::bigint[], $7::bigint[],
                     $8::int4[], $9::jsonb[], $10::text[], $11::int4[], $12::jsonb[], $13::bytea[], $14::int4[],
                     $15::bigint[], $16::bigint[], $17::bigint[], $18::uuid[])
             AS u(run_id, base, status, step_id, step_count, version, due_ms, paused, in_flight, waiting_schema,
                  new_wait, passes, outputs, finished, lease_ms, revision, migrated_to, owner)
         WHERE r.run_id = u.run_id AND r.row_version = u.base",
            set_row,
        ),
    );
    guards.extend(std::mem::take(&mut tick.guards));
    let mut streams = std::mem::take(&mut tick.streams);
    if !events.is_empty() {
        let occurred_at = platform::time::from_millis(platform::time::now_millis());
        streams.push(StreamAppend {
            stream_id: run_stream_id(&row.run_id),
            expected: ExpectedVersion::Exactly(tick.base_version),
            events: events
                .into_iter()
                .map(|event| NewEvent { event, subject_id: row.contact_id.clone(), occurred_at })
                .collect(),
        });
    }
    if streams.is_empty() {
        // Only the row changes (a retry's due time, a run parked before it started).
        return apply_guards_alone(inner, guards).await.map(|()| base_row + 1);
    }
    inner.log.append(AppendRequest::in_space(&row.space_id, streams, guards)).await.map(|_| base_row + 1)
}

/// Runs guards in a transaction of their own (a transition with no event).
async fn apply_guards_alone(inner: &Inner, guards: Vec<Guard>) -> Result<(), AppendError> {
    let mut client = inner.pool.get().await.map_err(Classify::append_error)?;
    let transaction = client.transaction().await.map_err(Classify::append_error)?;
    for guard in guards {
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            guard.params.iter().map(|param| param.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
        let rows = transaction.execute(guard.sql, &params).await.map_err(Classify::append_error)?;
        if guard.expect_rows.is_some_and(|expected| expected != rows) {
            return Err(guard.conflict);
        }
    }
    transaction.commit().await.map_err(Classify::append_error)?;
    Ok(())
}

/// Hands an email a run scheduled to the relay; the outbox worker finishes what this leaves.
/// A relay that refuses for now or cannot be reached queues it again on the email retry
/// schedule, as a broadcast's hand-off does: only the inline hand-off of a template send,
/// which answers its caller, makes those final.
async fn hand_off(inner: &Inner, prepared: &Prepared) {
    let email_id = &prepared.parties.email_id;
    let lease = match inner.claims.claim(email_id, inner.settings.email_lease()).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), email = %email_id, "could not claim a workflow email's hand-off");
            return;
        }
    };
    let started = Instant::now();
    let _ = outbox::hand_off(
        &inner.pool,
        &inner.log,
        &inner.mailer,
        &lease,
        prepared,
        Some(&inner.settings.email.retry_schedule_ms),
    )
    .await;
    metrics::histogram!("workflow_email_handoff_seconds").record(started.elapsed().as_secs_f64());
}
