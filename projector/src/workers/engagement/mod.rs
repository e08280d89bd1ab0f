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
//!
//! # Engagement
//!
//! What a recipient does with a message after it arrives: opens (the pixel fetched) and clicks
//! (a tracking link followed).
//!
//! **What is tracked.** A template's definition carries `tracking: {clicks, opens}`: as the
//! workspace file gives it, by default both for marketing and neither for transactional mail,
//! narrowed at apply time by the space's `emailTracking` (a space can only turn tracking off).
//! `mail::send::render_email` applies it after the footer: `mail::tracking::rewrite` (lol_html,
//! streaming) replaces each `http(s)` link of the HTML part with
//! `<public base>/emails/<id>/click?url=<target>&sig=<n>.<mac>` and appends the pixel
//! `<public base>/emails/<id>/open?sig=…`. The platform's own links (under the public base URL:
//! unsubscribe, preferences, confirmation), non-web links and links marked
//! `data-track="false"` stay; the text part is never rewritten. Entities in `href` are decoded
//! first, so the target is the URL a browser would have followed.
//!
//! **The signature** is HMAC-SHA256 truncated to 128 bits over (kind, email, target), each
//! length-prefixed, under key number `n`, derived from the master key
//! (`Keyring::derive_key("tracking-link-key-<n>")`). New links use `APP__EMAIL__TRACKING_KEY`;
//! links of the numbers in `TRACKING_KEYS_ACCEPTED` are still followed, so a rotation does not
//! break mail already delivered. Checking needs no database read and is constant-time; a link
//! this system did not make for that email and target is 404 `link_not_found` and redirects
//! nowhere (no open redirect).
//!
//! **Taking a hit in** (`command-service/src/engagement/`: `http.rs` the two public GET/HEAD
//! handlers, `store.rs` the insert: `Inbox`, on `platform::batch`, inserts the hits that arrive
//! while one statement runs in the next, one statement and one commit for all of them): after the signature, the request is judged as far as it
//! alone tells (`command-service/src/engagement/decide.rs`: `head`, `no_user_agent`, `privacy_proxy` for opens,
//! `known_bot`; else a person's, for now), and one row goes into `engagement_inbox`: the email,
//! `open` or `click`, that signal, the time, and for a click the link's position among the
//! email's tracked links (`n` in the link, signed with the target), a keyed digest of position and
//! target (`link_id`) and its target sealed under a key derived from the master key with the email's
//! id bound in (`mail::inbox::seal_inbox_link`). The 302 or the GIF is sent once the
//! `INSERT` that carried it is committed (a statement that fails answers each of its hits 503
//! and stores none): no database read, no wait for the log's batcher, and no acknowledged
//! click or open is lost; a failed insert is a 503 and the person may click again. The
//! client's address and user agent are used for that signal only and never stored. In the split
//! deployment nginx sends `/v1/emails/<id>/(click|open)` to the command service whatever the
//! method.
//!
//! **Into the log** (`projector/src/workers/engagement/`, worker `engagement`, one process at
//! a time by an advisory lock held for the step, polling every 100 ms): once 200 rows wait or
//! the oldest has waited 50 ms (under load, bigger batches make each row's append cheaper; when
//! quiet, a click is in the log within about 150 ms), a step takes the oldest 1,000 rows, reads what their emails' streams gained since the worker last saw them (it keeps each
//! recently engaged email's history, up to 20,000, at its stream's version: every click is an
//! event of its email's stream, so reading whole streams read every earlier click again; a
//! history is kept only once its append committed) and their contacts' data keys (one statement each),
//! and decides each row in arrival order (`decide.rs`, pure, given each click's target opened
//! and the contacts that still have a key) with `domain::engagement::history`: its
//! timing (`right_after_delivery`, `link_burst`, judged against the email's stream as of that
//! row, earlier rows of the batch included) and whether it is the first of its kind (the
//! email's first open, a link's first click, counted apart for people and machines, so a
//! person's first open after a privacy proxy's prefetch is still a unique open). Each email's
//! `EmailOpened` and `EmailClicked` are appended at the stream's version read, with one guard
//! per row deleting it, so a row becomes an event exactly once: an append that lost a race (a
//! send's outcome or a bounce landed meanwhile) leaves its rows for the next step, and a step
//! killed anywhere leaves them too. The click's target is opened from the row and sealed under
//! the contact's key (`ClickedLink`) beside `link_id`. A row of an unknown email or of an
//! erased contact is deleted with no event (its link still redirected: the signature proved it).
//! `projector status` reports the rows waiting and the oldest's age (a problem past 60 s).
//!
//! **Machines.** Opens and clicks by machines are recorded with the signal that gave them
//! away, and left out of human counts: `head` (a HEAD request), `no_user_agent`,
//! `privacy_proxy` (opens: Apple Mail Privacy Protection, a fetch from `17.0.0.0/8` or with the
//! bare user agent `Mozilla/5.0`), `known_bot` (the `isbot` list, except the Gmail and Yahoo
//! image proxies, which fetch when a person opens the message), `right_after_delivery` (a
//! click within 10 s of the relay accepting the message, or of its scheduling until that is
//! recorded) and `link_burst` (a click within 2 s of a click on another link of the email).
//!
//! **Where it shows.** `email.opened` and `email.clicked` webhooks (with `first`, `machine`
//! and, for a click, the URL and `linkId`), the contact's audit trail (`email_opened`,
//! `email_clicked`), the counter `email_engagement_total{kind, signal}`, the email's
//! story, and a broadcast run's per-link counts (`link_counts` in the `emails` read model, by
//! cohort, variant and link position; `GET /broadcasts/{id}/runs/{runId}/links` names each link
//! by one clicker's target opened from the log, so no target is kept in the clear).
//!
//! **An email's story** (`GET /emails/{id}`): the `emails` read model
//! (`projector/src/read_models/emails.rs`) keeps one row per email, folded by
//! `domain::email::story` (pure) from its stream: template and revision, contact, origin (a
//! template send, a form's confirmation, a broadcast and run, a workflow, run and step: the
//! last two recorded in `EmailScheduled` as `parent_id` and `step_id`), status, the timeline of
//! status changes and of first opens and clicks (a person's and a machine's apart), and the
//! counts. Each row keeps the log position it applied, so no event is folded twice; a contact's
//! rows go when its deletion is requested. Segments read engagement (see Segments), and
//! journeys branch and wait on it (see Workflows). A story keeps a click's link id, never its
//! target: `GET /emails/{id}` opens the targets from the email's stream with the contact's key
//! as it answers, as the audit trail does.
//!
//! **The delivery log** (`GET /emails`, `query-service/src/emails/`): the read model keeps, beside
//! each story, its status, the broadcast run or workflow and step that sent it, the engagement
//! flags and the address (opened from the sealed content with the contact's key as the
//! `EmailScheduled` is applied), with an index per scope on (scope, `scheduled_at` desc, id
//! desc). A page is one statement by keyset after the cursor's row (`log.rs`: the cursor names
//! the request it was issued for); an export (`Accept: text/csv` or `application/x-ndjson`) is
//! the same statement a thousand rows at a time on a connection taken per page, streamed, so
//! its memory is one page. A contact's unfiltered list keeps its total beside the rows.
//!
//! **The send decision.** Every send asks one pure function, `domain::email::send::decide`
//! (re-exported as `mail::send::decide`): a template send, a form's confirmation, a broadcast's
//! recipient and a journey's send step. From the facts its caller loads (for a broadcast, a few
//! set-wise statements per batch) it answers send, hold until an instant, or skip with the gate.
//! The gates, in order: `gone` (deleted or erased), `no_address`, `suppressed` (every send),
//! then for marketing mail `consent` (every email consent attribute of the schema true:
//! `email_consent`, the one definition) and `topic`, then the space's send policy (a catalog
//! resource `send_policy`, loaded with the template: `frequency_cap`, then `quiet_hours`, in the
//! recipient's zone from the policy's contact attribute or its default zone), and last
//! `allowance`, which the append counts and reports back so the decision is asked again. A
//! form's confirmation is decided as transactional mail. Every marketing email's append records
//! it in `marketing_sends` (a guard with a set form, so a broadcast batch writes one statement);
//! a decision reads the contact's rows within the policy's longest window, one statement per
//! batch, and only for a marketing send under caps (a journey step asks for them as a fact it
//! needs). Caps hold under concurrency: the rows carry each contact's order (`seq`, unique per
//! contact), a send decided under caps takes the place after the newest send it read
//! (`EmailTo::follows`), and of two sends decided from the same reading (a journey and a
//! broadcast at the same moment) only the first append commits; the other fails `stream_moved`
//! and is decided again from a new reading (a template send at once, a journey's transition at
//! once, a broadcast recipient at the run's next step, a held batch at once). The guard holds
//! only because a decision counts every send it read, including one recorded after its own
//! clock was read (another process's, or a clock a little ahead). The first
//! maintenance pass of each UTC day prunes rows older than any cap can count (368 days).
//!
//! **Held sends.** A `Hold` verdict stores the email as a send would (`send::Scheduled::hold`):
//! `EmailHeld` follows its `EmailScheduled`, its outbox row is inserted `held` with
//! `next_attempt_at` at the hold's end (`outbox::held_guard`), it is counted against the
//! allowance but not in `marketing_sends`, and nothing is handed off. The held sends worker
//! (`projector/src/workers/email/held.rs`, `email_held`, run by the processes that run the outbox)
//! leases due `held` rows `FOR UPDATE SKIP LOCKED` (a lease token and time on the row), reads
//! their `EmailScheduled`, loads what the decision needs for the whole batch
//! (`workers/email/recipients.rs`, the loader the broadcast engine uses: contacts and topic
//! statuses from the segments read model, consent attributes, suppressions, data keys, marketing
//! sends) and asks the decision again, contact by contact in order (a release counts against
//! the same contact's next email in the batch). The outcomes are one append per space, every
//! guard under the lease token: `EmailReleased` with the row back to `pending` and its
//! `marketing_sends` row; `EmailHeld` with the row's time moved; `EmailSkipped` on the email's
//! stream with the row `skipped` and a broadcast recipient `skipped` (not counted yet: the
//! worker counts such recipients into runs no step holds, `SKIP LOCKED`). A contact deleted
//! meanwhile gets no story (its stories went with it). A released email goes to a bounded queue
//! of the process's hand-off tasks (`HANDOFFS` of them, the outbox's claims), which the step
//! does not wait on, so releases keep their time whatever the relay's pace; one the queue cannot
//! take, or a dead process did not reach, is `pending` and old, and the outbox worker takes it. A process killed mid-step leaves its lease to run
//! out and its rows are decided again: each held email is released, held again or skipped once
//! per time.
//!
//! **A send a gate refused** has a story too. A journey's send step, a broadcast's recipient
//! and a form's confirmation that a gate refused append `EmailSkipped` (`mail::skipped`), which
//! begins the email's stream: the template, the contact, what would have sent it, the gate with
//! the refusal's code, and the log event that decided, found in the log when the gate refuses:
//! for `suppressed` the first event of the earliest suppression of the address in force (space
//! or global); for `consent` the record event since which the consent attributes have not all
//! been true (the record's stream walked in order, opened with the contact's key: the
//! withdrawal, or the creation when consent was never given, not the latest write); for `topic`
//! the contact's last `SubscriptionChanged` for the topic (none when it never had a status); for
//! `frequency_cap` the `EmailScheduled` of the send that filled the cap; for `allowance` (a
//! count) and `quiet_hours` (a clock) none. Its status is `skipped` and it counts in no tally (the step's
//! skips count it). A journey step's email id is derived from (run, step index), as a sent
//! one's, so deciding again after a crash records it once; a broadcast's batch appends the
//! stories of all its refused recipients in one append whose guard moves them `pending →
//! skipped`, so a recipient has one story or one email, never both. `mail::skipped::decided_by`
//! reads set-wise (four statements at most for a batch, one per gate that names an event). A template send that a gate refuses writes
//! nothing (D9): its 422 names the refusal's code.
//!
//! **Counts** (`email_counts` in the same read model): each broadcast run and each workflow
//! send step (`story::bucket`) has counters of its emails: scheduled, sent, failed, outcome
//! unknown, bounced, complained, unsubscribed, opened and clicked by a person. An email's
//! `story::Tally` is 0 or 1 per fact; each event adds the difference it makes to its email's
//! tally, so every email counts once per fact whatever repeats, and a late bounce moves nothing
//! twice. The counters hold no personal data and stay when a contact is erased (its story
//! goes). Rates are computed at read, over the delivered emails (sent less bounced). A broadcast
//! run reads them beside its own skip counters (see Broadcasts); a workflow's step counters are
//! in the `workflows` read model (see Workflows).

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
/// How long to sleep when the inbox is empty.
const POLL: Duration = Duration::from_millis(100);
/// The longest sleep of an inbox found empty poll after poll (`runtime::idle_sleep`): the
/// first click after a quiet spell reaches the log within about a second, the clicks while
/// they keep coming within about `GATHER_MS + POLL`.
const IDLE_CEILING: Duration = Duration::from_secs(1);
/// A step takes the inbox once this many rows wait or the oldest has waited [`GATHER_MS`]
/// (it waits out the rest of that itself): under load, bigger batches make each append cheaper.
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
        // One statement a poll while the inbox is empty (the usual case between hits).
        let waiting = client
            .query_one(
                "SELECT count(*), (extract(epoch FROM clock_timestamp()) * 1000)::bigint - min(at_ms)
                 FROM (SELECT at_ms FROM engagement_inbox ORDER BY id LIMIT $1) w",
                &[&GATHER_ROWS],
            )
            .await?;
        let (rows, oldest_ms): (i64, Option<i64>) = (waiting.get(0), waiting.get(1));
        let Some(age) = oldest_ms else { return Ok(Outcome::Idle) };
        if rows < GATHER_ROWS && age < GATHER_MS {
            // Rows are gathering: the step waits out the oldest one's `GATHER_MS` rather than
            // going idle, whose sleep after a quiet spell can be a second (`IDLE_CEILING`).
            tokio::time::sleep(Duration::from_millis(u64::try_from(GATHER_MS - age).unwrap_or(0))).await;
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
                Hit { id: row.get(0), email_id: email_id.into(), taken, signal: row.get(5), at_ms: row.get(6) }
            })
            .collect();
        if hits.is_empty() {
            return Ok(Outcome::Idle);
        }
        let kept = self.kept(hits.iter().map(|hit| hit.email_id.to_string()));
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
    Ok((email_id.into(), AppendRequest::in_space(&space_id, vec![stream], guards), counted))
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

    fn idle_ceiling(&self) -> Duration {
        IDLE_CEILING
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(Engagement::step(self))
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}
