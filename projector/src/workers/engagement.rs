//! The `engagement` worker: appends the opens and clicks the tracking endpoints took into
//! `engagement_inbox` to their emails' streams.
//!
//! A step takes the oldest rows once 200 wait or the oldest has waited 50 ms (one process
//! at a time, by an advisory lock held for the step), reads their emails' streams and their recipients' data keys in one statement each,
//! and decides each row in order with `domain::engagement::history` (the first of its kind,
//! a person's or a machine's: the signal the request gave, or a scanner's timing). Each email's
//! `EmailOpened` and `EmailClicked` are appended at the stream's version read, with the
//! deletion of their rows as guards, so a row becomes an event exactly once across kill -9
//! and any number of processes: an append that lost a race leaves its rows for the next step.
//! A row of an unknown email, or of an erased contact, is deleted without an event.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use domain::engagement::Actor;
use domain::engagement::history::{self, History};
use futures_util::future::BoxFuture;
use platform::error::Code;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, Guard, NewEvent, SetValue, StreamAppend};
use platform::proto;

use crate::runtime::{Outcome, Worker};

/// Rows one step takes at most.
const BATCH: i64 = 1_000;
/// How long to sleep when the inbox is empty or still gathering.
const POLL: Duration = Duration::from_millis(100);
/// A step waits until this many rows wait, or the oldest has waited [`GATHER_MS`]: so a
/// click reaches the log (and webhooks, segments, journeys) within about `GATHER_MS + POLL`.
const GATHER_ROWS: i64 = 200;
const GATHER_MS: i64 = 50;
/// The advisory lock that makes one process at a time take rows (others would only race for
/// the same streams).
const LOCK: i64 = 0x656e_6761_6765; // "engage"

/// A row of `engagement_inbox`.
struct Hit {
    id: i64,
    email_id: String,
    kind: String,
    link: Option<Vec<u8>>,
    link_id: String,
    signal: String,
    at_ms: i64,
}

/// Histories kept between steps at most; past it the worker starts over (each is the size of
/// its email's links).
const KEPT_HISTORIES: usize = 20_000;

pub struct Engagement {
    pool: Pool,
    log: EventLog,
    /// Each recently engaged email's history as of its stream's version, so that a step reads
    /// only the events appended since (every click is one: reading whole streams made each
    /// step read every earlier click of its emails again, 300 MB of buffers for 73,000 clicks
    /// on 200 emails). Only a committed append's history is kept; any failed one is dropped.
    histories: std::sync::Mutex<HashMap<String, History>>,
}

impl Engagement {
    pub fn new(pool: Pool, log: EventLog) -> Self {
        Self { pool, log, histories: std::sync::Mutex::default() }
    }

    fn kept(&self, emails: impl Iterator<Item = String>) -> BTreeMap<String, History> {
        let Ok(kept) = self.histories.lock() else { return BTreeMap::new() };
        emails.filter_map(|email| kept.get(&email).map(|history| (email, history.clone()))).collect()
    }

    fn keep(&self, decided: Vec<(String, History)>, failed: &HashSet<String>) {
        let Ok(mut kept) = self.histories.lock() else { return };
        if kept.len() + decided.len() > KEPT_HISTORIES {
            kept.clear();
        }
        for (email, history) in decided {
            if failed.contains(&email) {
                kept.remove(&email);
            } else {
                kept.insert(email, history);
            }
        }
    }

    async fn step(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        // One statement a poll while the inbox is empty (the usual case between hits), or
        // while a few rows gather: under load, bigger batches make each append cheaper.
        let waiting = client
            .query_one(
                "SELECT count(*), (extract(epoch FROM clock_timestamp()) * 1000)::bigint - min(at_ms)
                 FROM (SELECT at_ms FROM engagement_inbox ORDER BY id LIMIT $1) w",
                &[&GATHER_ROWS],
            )
            .await?;
        let (rows, oldest_ms): (i64, Option<i64>) = (waiting.get(0), waiting.get(1));
        if rows < GATHER_ROWS && oldest_ms.is_none_or(|age| age < GATHER_MS) {
            return Ok(Outcome::Idle);
        }
        let transaction = client.transaction().await?;
        transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
        if !transaction.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&LOCK]).await?.get::<_, bool>(0) {
            return Ok(Outcome::Idle);
        }
        let hits: Vec<Hit> = transaction
            .query(
                "SELECT id, email_id, kind, link, link_id, signal, at_ms FROM engagement_inbox ORDER BY id LIMIT $1",
                &[&BATCH],
            )
            .await?
            .into_iter()
            .map(|row| Hit {
                id: row.get(0),
                email_id: row.get(1),
                kind: row.get(2),
                link: row.get(3),
                link_id: row.get(4),
                signal: row.get(5),
                at_ms: row.get(6),
            })
            .collect();
        if hits.is_empty() {
            return Ok(Outcome::Idle);
        }
        let kept = self.kept(hits.iter().map(|hit| hit.email_id.clone()));
        let (appends, dropped, histories) = decide(&transaction, hits, kept).await?;
        if !dropped.is_empty() {
            transaction.execute("DELETE FROM engagement_inbox WHERE id = ANY($1)", &[&dropped]).await?;
        }
        let results = futures_util::future::join_all(
            appends
                .into_iter()
                .map(|(email, request, counted)| async move { (email, self.log.append(request).await, counted) }),
        )
        .await;
        let mut failed = HashSet::new();
        let mut error = None;
        for (email, result, counted) in results {
            match result {
                Ok(_) => {
                    for (kind, signal) in counted {
                        metrics::counter!("email_engagement_total", "kind" => kind, "signal" => signal).increment(1);
                    }
                }
                // The email's stream moved since it was read (a bounce, a send's outcome) or the
                // rows went with another process's append: the next step decides them again.
                Err(AppendError::WrongVersion { .. } | AppendError::Conflict { .. }) => {
                    failed.insert(email);
                }
                Err(other) => {
                    failed.insert(email);
                    error = Some(other);
                }
            }
        }
        self.keep(histories, &failed);
        if let Some(error) = error {
            return Err(error.into());
        }
        transaction.commit().await?;
        Ok(Outcome::Progressed)
    }
}

/// An email's append with what it adds to the engagement counter: (kind, signal) per event.
type Append = (String, AppendRequest, Vec<(&'static str, &'static str)>);

/// What a step decided: one append per email (with its id), the rows to drop (unknown email,
/// erased contact), and each decided email's history once its append is committed.
type Decided = (Vec<Append>, Vec<i64>, Vec<(String, History)>);

/// Decides the rows against their emails' streams, as `kept` histories (a previous step's)
/// and the events appended after them tell.
async fn decide(
    client: &impl GenericClient,
    hits: Vec<Hit>,
    mut kept: BTreeMap<String, History>,
) -> anyhow::Result<Decided> {
    let mut by_email: BTreeMap<String, Vec<Hit>> = BTreeMap::new();
    for hit in hits {
        by_email.entry(hit.email_id.clone()).or_default().push(hit);
    }
    let streams: Vec<String> = by_email.keys().map(|email_id| domain::email::stream_id(email_id)).collect();
    let after: Vec<i64> =
        by_email.keys().map(|email_id| kept.get(email_id).map_or(0, |history| history.version)).collect();
    let mut events: BTreeMap<String, Vec<(i64, LogEvent)>> = BTreeMap::new();
    for stored in platform::log::read_streams_after(client, &streams, &after).await? {
        let Some(email_id) = stored.stream_id.strip_prefix("email-").map(str::to_owned) else { continue };
        let event = stored.decode()?;
        events.entry(email_id).or_default().push((stored.stream_version, event));
    }
    let histories: BTreeMap<String, History> = by_email
        .keys()
        .filter_map(|email_id| {
            let appended = events.remove(email_id).unwrap_or_default();
            History::fold_onto(kept.remove(email_id), appended).map(|history| (email_id.clone(), history))
        })
        .collect();
    let contacts: Vec<String> =
        histories.values().map(|history| history.contact_id.clone()).collect::<HashSet<_>>().into_iter().collect();
    let keys = platform::crypto::load_keys(client, &contacts).await?;
    let mut appends = Vec::new();
    let mut dropped = Vec::new();
    let mut decided = Vec::new();
    for (email_id, hits) in by_email {
        let Some(mut history) = histories.get(&email_id).cloned() else {
            dropped.extend(hits.iter().map(|hit| hit.id));
            continue;
        };
        let Some(key) = keys.get(&history.contact_id) else {
            dropped.extend(hits.iter().map(|hit| hit.id));
            continue;
        };
        let version = history.version;
        let mut new_events = Vec::with_capacity(hits.len());
        let mut guards = Vec::with_capacity(hits.len());
        let mut counted = Vec::with_capacity(hits.len());
        for hit in &hits {
            let actor = Actor::from_signal(&hit.signal);
            let (event, kind, machine) = if hit.kind == "click" {
                let url = hit.link.as_deref().map(|sealed| domain::engagement::open_inbox_link(&email_id, sealed));
                let Some(Ok(url)) = url else {
                    // Only this system writes rows; one it cannot read (a master key replaced
                    // meanwhile) must not hold up every click after it.
                    tracing::error!(row = hit.id, email = %email_id, "a click's target cannot be opened; dropped");
                    dropped.push(hit.id);
                    continue;
                };
                let verdict = history::click(&history, &hit.link_id, actor, hit.at_ms);
                let mut link = platform::events::seal(&history.contact_id, &proto::ClickedLink { url });
                platform::events::encrypt(&mut link, key)?;
                let event = LogEvent::EmailClicked(proto::EmailClicked {
                    email_id: email_id.clone(),
                    space_id: history.space_id.clone(),
                    contact_id: history.contact_id.clone(),
                    link: Some(link),
                    link_id: hit.link_id.clone(),
                    first: verdict.first,
                    machine: verdict.machine.to_owned(),
                    at_ms: hit.at_ms,
                    source: Some(history.source.clone()),
                });
                (event, "click", verdict.machine)
            } else {
                let verdict = history::open(&history, actor);
                let event = LogEvent::EmailOpened(proto::EmailOpened {
                    email_id: email_id.clone(),
                    space_id: history.space_id.clone(),
                    contact_id: history.contact_id.clone(),
                    first: verdict.first,
                    machine: verdict.machine.to_owned(),
                    at_ms: hit.at_ms,
                    source: Some(history.source.clone()),
                });
                (event, "open", verdict.machine)
            };
            history.record(&event);
            new_events.push(NewEvent {
                event,
                subject_id: Some(history.contact_id.clone()),
                occurred_at: platform::time::from_millis(hit.at_ms),
            });
            guards.push(taken(hit.id));
            counted.push((kind, if machine.is_empty() { "none" } else { machine }));
        }
        if new_events.is_empty() {
            decided.push((email_id, history));
            continue;
        }
        let stream = StreamAppend {
            stream_id: domain::email::stream_id(&email_id),
            expected: ExpectedVersion::Exactly(version),
            events: new_events,
        };
        let request = AppendRequest::in_space(&history.space_id, vec![stream], guards);
        appends.push((email_id.clone(), request, counted));
        decided.push((email_id, history));
    }
    Ok((appends, dropped, decided))
}

/// The row's deletion, in the append of its event: a row becomes an event once.
fn taken(id: i64) -> Guard {
    Guard::exactly_one(
        "DELETE FROM engagement_inbox WHERE id = $1",
        vec![Box::new(id)],
        AppendError::Conflict { code: Code::OperationTaken, message: "the hit was already recorded".to_owned() },
    )
    .with_set("DELETE FROM engagement_inbox WHERE id = ANY($1::bigint[])", vec![SetValue::BigInt(id)])
}

impl Worker for Engagement {
    fn name(&self) -> String {
        "engagement".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        POLL
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Engagement::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}
