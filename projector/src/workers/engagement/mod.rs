//! The `engagement` worker: appends the opens and clicks the tracking endpoints took into
//! `engagement_inbox` to their emails' streams.
//!
//! A step takes the oldest rows once 200 wait or the oldest has waited 50 ms (one process
//! at a time, by an advisory lock held for the step), reads their emails' streams and their
//! recipients' data keys in one statement each, and decides each row in order (`decide.rs`,
//! pure, with `domain::engagement::history`: the first of its kind, a person's or a machine's:
//! the signal the request gave, or a scanner's timing). Each email's
//! `EmailOpened` and `EmailClicked` are appended at the stream's version read, with the
//! deletion of their rows as guards, so a row becomes an event exactly once across kill -9
//! and any number of processes: an append that lost a race leaves its rows for the next step.
//! A row of an unknown email, or of an erased contact, is deleted without an event.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use domain::engagement::history::History;
use futures_util::future::BoxFuture;
use platform::crypto::Keys;
use platform::events::LogEvent;
use platform::log::{AppendError, AppendRequest, EventLog, ExpectedVersion, StreamAppend};

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

mod decide;

use decide::{Decided, EmailAppend, Hit, Taken};

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
                "SELECT id, email_id, kind, link, link_id, signal, at_ms, link_position
                 FROM engagement_inbox ORDER BY id LIMIT $1",
                &[&BATCH],
            )
            .await?
            .into_iter()
            .map(|row| {
                let email_id: String = row.get(1);
                let taken = if row.get::<_, &str>(2) == "click" {
                    let link: Option<&[u8]> = row.get(3);
                    let url = link.and_then(|sealed| mail::inbox::open_inbox_link(&email_id, sealed).ok());
                    let position = u32::try_from(row.get::<_, i32>(7)).unwrap_or_default();
                    Taken::Click { link_id: row.get(4), url, position }
                } else {
                    Taken::Open
                };
                Hit { id: row.get(0), email_id, taken, signal: row.get(5), at_ms: row.get(6) }
            })
            .collect();
        if hits.is_empty() {
            return Ok(Outcome::Idle);
        }
        let kept = self.kept(hits.iter().map(|hit| hit.email_id.clone()));
        let (histories, keys) = load(&transaction, &hits, kept).await?;
        let keyed = histories
            .values()
            .filter(|history| keys.get(&history.contact_id).is_some())
            .map(|history| history.contact_id.clone())
            .collect();
        let Decided { appends, dropped, unreadable, histories } = decide::decide(hits, histories, &keyed);
        for (row, email_id) in unreadable {
            // Only this system writes rows; one it cannot read (a master key replaced
            // meanwhile) must not hold up every click after it.
            tracing::error!(row, email = %email_id, "a click's target cannot be opened; dropped");
        }
        let appends = appends.into_iter().map(|append| sealed(append, &keys)).collect::<anyhow::Result<Vec<_>>>()?;
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

/// Each hit's email's history: a kept one (a previous step's) with the events appended after
/// it, or the whole stream; and the data keys of their contacts. One statement each.
async fn load(
    client: &impl GenericClient,
    hits: &[Hit],
    mut kept: BTreeMap<String, History>,
) -> anyhow::Result<(BTreeMap<String, History>, Keys)> {
    let emails: BTreeSet<&str> = hits.iter().map(|hit| hit.email_id.as_str()).collect();
    let streams: Vec<String> = emails.iter().map(|email_id| domain::email::stream_id(email_id)).collect();
    let after: Vec<i64> =
        emails.iter().map(|email_id| kept.get(*email_id).map_or(0, |history| history.version)).collect();
    let mut events: BTreeMap<String, Vec<(i64, LogEvent)>> = BTreeMap::new();
    for stored in platform::log::read_streams_after(client, &streams, &after).await? {
        let Some(email_id) = stored.stream_id.strip_prefix("email-").map(str::to_owned) else { continue };
        let event = stored.decode()?;
        events.entry(email_id).or_default().push((stored.stream_version, event));
    }
    let histories: BTreeMap<String, History> = emails
        .into_iter()
        .filter_map(|email_id| {
            let appended = events.remove(email_id).unwrap_or_default();
            History::fold_onto(kept.remove(email_id), appended).map(|history| (email_id.to_owned(), history))
        })
        .collect();
    let contacts: Vec<String> =
        histories.values().map(|history| history.contact_id.clone()).collect::<HashSet<_>>().into_iter().collect();
    let keys = platform::crypto::load_keys(client, &contacts).await?;
    Ok((histories, keys))
}

/// An email's append with what it adds to the engagement counter: (kind, signal) per event.
type Append = (String, AppendRequest, Vec<(&'static str, &'static str)>);

/// An email's append as the log takes it, each click's link encrypted under the contact's key:
/// the email, the request and what it adds to the engagement counter.
fn sealed(append: EmailAppend, keys: &Keys) -> anyhow::Result<Append> {
    let EmailAppend { email_id, space_id, contact_id, version, mut events, guards, counted } = append;
    let key = keys.get(&contact_id).ok_or_else(|| anyhow::anyhow!("no data key for {contact_id}"))?;
    for new in &mut events {
        if let LogEvent::EmailClicked(clicked) = &mut new.event
            && let Some(link) = clicked.link.as_mut()
        {
            platform::events::encrypt(link, key)?;
        }
    }
    let stream = StreamAppend {
        stream_id: domain::email::stream_id(&email_id),
        expected: ExpectedVersion::Exactly(version),
        events,
    };
    Ok((email_id, AppendRequest::in_space(&space_id, vec![stream], guards), counted))
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
