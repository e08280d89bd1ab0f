//! The fault harness: the split deployment (two command services, two query services and two
//! projector processes behind nginx, PostgreSQL behind a TCP fault proxy) under mixed load,
//! while, in each started minute, one process of each kind is killed with SIGKILL at a random
//! moment and started again, the postmaster is killed and restarted, and the proxy delays,
//! and at another moment cuts, every database connection for a few seconds. Then a checker
//! proves from the clients' own records what survived: every acknowledged write is present
//! and readable, nothing is duplicated, every read model reaches the head of the log with no
//! dead letter, every email and workflow call left at most once, every webhook delivery
//! arrived under one id per write, and erasures requested before the faults completed.
//!
//! It loads the whole machine, so it runs only with `CHAOS=1` (otherwise it says it was
//! skipped), and then alone (`.config/nextest.toml` gives it every test thread): `scripts/test`
//! runs it in a short form (`CHAOS_SECONDS`, 40 by default); `scripts/chaos` runs the long form
//! and prints the counts kept in `docs/benchmarks.md`. `CHAOS_SEED` replays a schedule of faults.
//!
//! # The invariants under faults, together
//!
//! Each invariant above has its own kill test; `tests/tests/api/chaos.rs` breaks the whole
//! deployment at once. It starts two command services, two query services and two projector
//! processes behind nginx (`deploy/nginx.conf.template`, two servers per upstream) on a
//! PostgreSQL cluster of its own with default durability, which every service reaches through a
//! TCP proxy that can hold every chunk (150 ms) or reset every connection. Seven clients write
//! through nginx (record creates and upserts, event fires and batches, suppressions, template
//! sends, workflow triggers), each operation retried as it was first sent after a transport
//! error, a 5xx, a 429 or `idempotency_conflict`: under its `Idempotency-Key`, or, where the
//! contract takes none, deduplicated by its `eventId` (a fire) or found already made (a
//! suppression's retry that meets `suppression_already_exists`), while a broadcast to 200
//! contacts runs under a send policy (30 of them capped by a promo sent before the faults, 30 in
//! their quiet hours and held), an eighth client follows the tracking links of its mail as it arrives (each
//! request a click of its own), and 20 erasures requested beforehand complete. Meanwhile, in each started minute and at
//! random moments (`CHAOS_SEED` replays them), one process of each kind is killed with SIGKILL
//! and started again, the postmaster and its backends are killed with SIGKILL and restarted,
//! and the proxy delays, and at another moment cuts, every database connection for 3 s; the
//! links to the SMTP relay and to the webhook receivers, each behind a proxy of its own, are
//! held (every chunk 2.5 s, beyond the services' timeouts) for 4 s and cut for 3 s. Once the workers have drained, the
//! checker compares what each client was told with what the API then serves: each acknowledged
//! write present (read back by id and found once in its list), nothing duplicated, each email
//! and broadcast message at the relay at most once (exactly once when recorded `sent`), each
//! capped or held fan with its story in the run's delivery log and no message from the run, each
//! workflow call under one `webhook-id` (repeats under it allowed, as for webhooks), each click answered 302 in the log (and no more clicks there than
//! requests sent), each acknowledged create delivered to its webhook under one id,
//! every read model at the head with no dead letter, and `projector status` clean. An
//! operation whose claim was left by a killed process answers `idempotency_outcome_unknown`
//! after 60 s and counts as unknown; such writes may or may not exist, but never twice.
//! It runs only with `CHAOS=1` and then alone (`.config/nextest.toml`): `scripts/test` runs it
//! after the suite for 40 s; `scripts/chaos [seconds] [seed]` runs it at length, and its counts
//! are in `docs/benchmarks.md`.
//!
//! The same load and checker run on the HA deployment (`chaos::no_failover_loses_an_acknowledged_write`,
//! `tests/tests/api/ha.rs` over `scripts/ha.sh`): pg_auto_failover's monitor, a primary and a
//! synchronous standby, each server in a network namespace of its own, the services listing both
//! nodes (`target_session_attrs=read-write`; the query services read from whichever is the
//! standby). In each round, beside the process kills and the link faults, the primary's machine
//! is killed for good (every process of its namespace, SIGKILL) and a new server replaces it
//! 12 s later; the primary is cut off from everyone (its link down: packets vanish, no reset)
//! for 15 s while it runs, then rejoins as a standby; and the monitor switches over under the
//! load. A probe writes a suppression through nginx every 100 ms during each of these and the
//! report gives the longest time without an acknowledged write. `scripts/test` runs it for
//! 30 s after the other; `scripts/chaos ha [seconds] [seed]` at length.
//!
//! - **Architecture Invariant: no service decides who is primary.** The HA engine
//!   (pg_auto_failover) does; the services only list every node and connect to the one that
//!   takes writes (`target_session_attrs=read-write`), with connect, keepalive and TCP user
//!   timeouts (`platform::db::connection_config`) so that a vanished server is noticed within
//!   seconds. Nothing of ours is kept per server: positions, leases, claims and timers are rows
//!   of the replicated database, so they carry over a failover as they are.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::deployment::{Nginx, start_nginx};
use crate::email::{BLAST_BROADCAST, MAIL_KEY, mail_workspace};
use crate::fault_proxy::{Fault, FaultProxy};
use crate::ha::{CutPrimary, HaCluster};
use crate::helpers::*;
use crate::receiver::Receiver;
use crate::smtp_sink::SmtpSink;

const SECRET: &str = "whsec_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
/// How long a client keeps retrying one operation (same idempotency key) before it counts the
/// operation as unknown.
const GIVE_UP_AFTER: Duration = Duration::from_secs(90);
const FANS: usize = 200;
/// Fans mailed the promo before the faults: the broadcast's frequency cap skips them.
const CAPPED_FANS: usize = 30;
/// Fans in their quiet hours (UTC) when the broadcast runs: held for an hour or more.
const HELD_FANS: usize = 30;
const ERASED: usize = 20;
const UPSERT_KEYS: usize = 10;

/// One service process the harness may kill and start again on the same port.
struct Slot {
    binary: &'static str,
    args: &'static [&'static str],
    env: Vec<(&'static str, String)>,
    child: ChildGuard,
}

impl Slot {
    fn start(binary: &'static str, args: &'static [&'static str], env: Vec<(&'static str, String)>, url: &str) -> Slot {
        let child = spawn_binary(binary, args, url, &env);
        Slot { binary, args, env, child }
    }

    fn kill9(&mut self) {
        let _ = self.child.0.kill();
        let _ = self.child.0.wait();
    }

    fn restart(&mut self, url: &str) {
        self.child = spawn_binary(self.binary, self.args, url, &self.env);
    }
}

#[derive(Clone, Copy, Debug)]
enum FaultKind {
    KillCommand,
    KillQuery,
    KillProjector,
    KillPostmaster,
    DelayDatabase,
    CutDatabase,
    /// Every chunk between the services and the SMTP relay held longer than their timeout.
    HoldMail,
    /// Every connection to the SMTP relay reset, new ones too.
    CutMail,
    HoldWebhooks,
    CutWebhooks,
    /// The primary's machine dies for good (then, later, a new server replaces it).
    KillPrimary,
    /// The primary cut off from everyone while it runs (then the network heals).
    CutPrimary,
    /// A planned switchover under the load.
    Switchover,
}

/// The faults of one round: those of any deployment, and those of its database.
fn round_faults(ha: bool) -> Vec<FaultKind> {
    let mut faults = vec![
        FaultKind::KillCommand,
        FaultKind::KillQuery,
        FaultKind::KillProjector,
        FaultKind::HoldMail,
        FaultKind::CutMail,
        FaultKind::HoldWebhooks,
        FaultKind::CutWebhooks,
    ];
    if ha {
        faults.extend([FaultKind::KillPrimary, FaultKind::CutPrimary, FaultKind::Switchover]);
    } else {
        faults.extend([FaultKind::KillPostmaster, FaultKind::DelayDatabase, FaultKind::CutDatabase]);
    }
    faults
}

/// The database the services run on.
enum Database {
    /// One server, behind a fault proxy.
    Single { cluster: PrivateCluster, proxy: FaultProxy },
    /// A failover cluster: a primary, a synchronous standby and the monitor.
    Ha(HaCluster),
}

/// The deployment the faults act on.
struct Deployment {
    database: Database,
    /// The database as the services reach it (through the proxy, or every node of the cluster).
    services_url: String,
    commands: Vec<Slot>,
    queries: Vec<Slot>,
    projectors: Vec<Slot>,
    /// Between the services and the SMTP sink, and the webhook receiver.
    mail_proxy: FaultProxy,
    hook_proxy: FaultProxy,
    /// Writes through the front, to time what clients see while the database fails over.
    prober: Prober,
}

impl Deployment {
    /// Applies one fault and returns a line describing it.
    async fn apply(&mut self, fault: FaultKind, rng: &mut StdRng) -> String {
        let which = rng.random_range(0..2usize);
        let process = match fault {
            FaultKind::KillCommand => Some((&mut self.commands, "command-service")),
            FaultKind::KillQuery => Some((&mut self.queries, "query-service")),
            FaultKind::KillProjector => Some((&mut self.projectors, "projector")),
            _ => None,
        };
        if let Some((slots, what)) = process {
            let slot = &mut slots[which];
            slot.kill9();
            tokio::time::sleep(Duration::from_millis(800)).await;
            slot.restart(&self.services_url);
            return format!("kill -9 {what} #{which}");
        }
        let link = match fault {
            FaultKind::HoldMail | FaultKind::CutMail => Some((&self.mail_proxy, "the SMTP relay")),
            FaultKind::HoldWebhooks | FaultKind::CutWebhooks => Some((&self.hook_proxy, "webhook receivers")),
            _ => None,
        };
        if let Some((proxy, what)) = link {
            return if matches!(fault, FaultKind::HoldMail | FaultKind::HoldWebhooks) {
                // Longer than the services wait for an answer (2 s): sends and deliveries
                // time out with their outcome unknown.
                hold(proxy, Duration::from_millis(2500), Duration::from_secs(4)).await;
                format!("every chunk to {what} held 2.5 s for 4 s")
            } else {
                format!("connections to {what} cut for 3 s ({} reset)", cut(proxy, Duration::from_secs(3)).await)
            };
        }
        match (&self.database, fault) {
            (Database::Single { cluster, .. }, FaultKind::KillPostmaster) => {
                cluster.kill9();
                tokio::time::sleep(Duration::from_secs(1)).await;
                tokio::task::block_in_place(|| cluster.pg_start());
                "kill -9 of the postmaster and its backends, restarted after 1 s".to_owned()
            }
            (Database::Single { proxy, .. }, FaultKind::DelayDatabase) => {
                hold(proxy, Duration::from_millis(150), Duration::from_secs(3)).await;
                "every database chunk held 150 ms for 3 s".to_owned()
            }
            (Database::Single { proxy, .. }, FaultKind::CutDatabase) => {
                format!("database connections cut for 3 s ({} reset)", cut(proxy, Duration::from_secs(3)).await)
            }
            (Database::Ha(cluster), FaultKind::KillPrimary | FaultKind::CutPrimary | FaultKind::Switchover) => {
                let Some(primary) = tokio::task::block_in_place(|| cluster.primary()) else {
                    return format!("{fault:?} skipped: no primary ({})", cluster.state());
                };
                // A write whose consistency token, taken on this primary, must still hold after.
                let tokened = self.prober.tokened_write().await;
                let probe = self.prober.start();
                let started = Instant::now();
                let what = match fault {
                    FaultKind::KillPrimary => {
                        tokio::task::block_in_place(|| cluster.kill(primary));
                        // The server stays dead while the load goes on, then a new one
                        // replaces it, as docs/operations.md says.
                        tokio::time::sleep(Duration::from_secs(12)).await;
                        tokio::task::block_in_place(|| {
                            cluster.replace(primary);
                            cluster.wait_healthy();
                        });
                        format!("node{primary} (the primary) killed for good, replaced by a new server after 12 s")
                    }
                    FaultKind::CutPrimary => {
                        // Long enough for the standby to be promoted while the old primary runs.
                        let cut_at = chrono::Local::now().format("%H:%M:%S").to_string();
                        tokio::task::block_in_place(|| cluster.cut(primary));
                        tokio::time::sleep(Duration::from_secs(15)).await;
                        let stopped = tokio::task::block_in_place(|| {
                            cluster.heal(primary);
                            cluster.wait_healthy();
                            cluster.stopped_before_promotion(primary, &cut_at)
                        });
                        // The old primary is down before the standby takes writes
                        // (docs/operations.md, "Timings"): the timeouts keep that order, unless its
                        // keeper's first look found no standby, which that section describes (no
                        // write it takes is acknowledged: its commits wait for the standby).
                        match stopped.unwrap_or_else(|missing| panic!("{missing}")) {
                            CutPrimary::Stopped(stopped) => {
                                assert!(
                                    stopped >= 0,
                                    "node{primary} stopped {} s after the standby took writes",
                                    -stopped
                                );
                                format!(
                                    "node{primary} (the primary) cut off from everyone for 15 s, then rejoined; it \
                                     had stopped {stopped} s before the standby took writes"
                                )
                            }
                            CutPrimary::StayedUp(look) => format!(
                                "node{primary} (the primary) cut off from everyone for 15 s, then rejoined; its \
                                 keeper's first look found no standby ({look}), so it ran on until the network healed"
                            ),
                        }
                    }
                    _ => {
                        tokio::task::block_in_place(|| {
                            cluster.switchover();
                            cluster.wait_healthy();
                        });
                        format!("switchover from node{primary}")
                    }
                };
                let seen = probe.finish(started).await;
                let token = self.prober.read_with_token(&tokened).await;
                let line = format!(
                    "{what}; healthy again after {:.1} s; {}; {token}",
                    started.elapsed().as_secs_f64(),
                    seen.describe()
                );
                self.prober.done.extend(seen.operations);
                line
            }
            (_, fault) => format!("{fault:?} does not apply to this deployment"),
        }
    }
}

/// Holds every chunk through `proxy` for `delay`, for `lasting`.
async fn hold(proxy: &FaultProxy, delay: Duration, lasting: Duration) {
    proxy.set(Fault::Delay(delay));
    tokio::time::sleep(lasting).await;
    proxy.set(Fault::Pass);
}

/// Resets every connection through `proxy`, new ones too, for `lasting`; how many it reset.
async fn cut(proxy: &FaultProxy, lasting: Duration) -> u64 {
    let before = proxy.resets();
    proxy.set(Fault::Cut);
    tokio::time::sleep(lasting).await;
    proxy.set(Fault::Pass);
    proxy.resets() - before
}

/// Writes one suppression at a time through the front while a failover goes on, each retried
/// under its identifier until acknowledged: when writes stopped being acknowledged and when
/// they were again, and what clients got in between.
struct Prober {
    http: reqwest::Client,
    /// The front's base URL.
    base: String,
    url: String,
    next: Arc<std::sync::atomic::AtomicUsize>,
    /// The probes' writes, for the checker (as suppressions).
    done: Vec<Operation>,
}

struct Probe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<ProbeSeen>,
}

#[derive(Default)]
struct ProbeSeen {
    /// When each acknowledged write's first attempt began, and when it was acknowledged.
    acknowledged: Vec<(Instant, Instant)>,
    /// What the attempts that failed got, counted.
    errors: BTreeMap<String, usize>,
    operations: Vec<Operation>,
    /// The longest time without an acknowledged write (see [`longest_gap`]), in seconds after
    /// the fault began.
    gap: Option<(f64, f64)>,
}

impl ProbeSeen {
    fn describe(&self) -> String {
        let errors: Vec<String> = self.errors.iter().map(|(what, count)| format!("{what} ×{count}")).collect();
        let gap = match self.gap {
            Some((stopped, resumed)) => format!(
                "no write acknowledged for {:.1} s (from {stopped:.1} s to {resumed:.1} s after the fault began)",
                resumed - stopped
            ),
            None => "no write acknowledged after the fault began".to_owned(),
        };
        format!(
            "{gap}; {} probe writes acknowledged; failed attempts: {}",
            self.acknowledged.len(),
            if errors.is_empty() { "none".to_owned() } else { errors.join(", ") }
        )
    }
}

impl Prober {
    /// Creates a contact (retried under its key until acknowledged): its id and the
    /// `Consistency-Token` of the answer.
    async fn tokened_write(&self) -> (String, String) {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let url = format!("{}/schemas/contacts/records", self.base);
        let body = json!({"email": format!("token-{n}@chaos.test")});
        let deadline = Instant::now() + GIVE_UP_AFTER;
        loop {
            let sent = self
                .http
                .post(&url)
                .bearer_auth(ALPHA_ADMIN)
                .header("Idempotency-Key", format!("token-{n}"))
                .json(&body)
                .send()
                .await;
            if let Ok(response) = sent
                && response.status().is_success()
            {
                let token = response.headers().get("consistency-token").and_then(|v| v.to_str().ok());
                let token = token.expect("a write answers a consistency token").to_owned();
                let answer: Value = response.json().await.expect("a JSON answer");
                return (answer["data"]["id"].as_str().expect("an id").to_owned(), token);
            }
            assert!(Instant::now() < deadline, "a contact could not be created before the failover");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reads the record of a [`Prober::tokened_write`] with its token, under another key:
    /// what it got, for the report; panics on any refusal, or unless a read is current (200,
    /// no `stale_read`) within 30 s.
    async fn read_with_token(&self, (id, token): &(String, String)) -> String {
        let url = format!("{}/schemas/contacts/records/{id}", self.base);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sent = self.http.get(&url).bearer_auth(ALPHA_MEMBER).header("Consistency-Token", token).send().await;
            if let Ok(response) = sent {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status < 500 {
                    // Never refused: the token is a position of the log, which moved over with it.
                    assert_eq!(status, 200, "the record written before the failover, with its token: {body}");
                    // A `stale_read` warning says the read models had not caught up within the
                    // wait; they do once the new primary's projector runs.
                    if body["warnings"].as_array().is_none_or(Vec::is_empty) {
                        return format!("a consistency token ({token}) taken before it read the write after it");
                    }
                }
            }
            assert!(Instant::now() < deadline, "the read with the token was not current within 30 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn start(&self) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let (http, url, next, stopped) = (self.http.clone(), self.url.clone(), self.next.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut seen = ProbeSeen::default();
            while !stopped.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let identifier = format!("probe-{n}@chaos.test");
                let body = json!({"identifier": identifier, "reason": "manual"});
                let began = Instant::now();
                let mut history = Vec::new();
                let outcome = loop {
                    let attempt = http.post(&url).bearer_auth(ALPHA_ADMIN).json(&body).send().await;
                    let answer = match attempt {
                        Ok(response) => {
                            let status = response.status().as_u16();
                            let body: Value = response.json().await.unwrap_or(Value::Null);
                            format!("{status} {}", body["error"]["code"].as_str().unwrap_or_default())
                        }
                        Err(error) => if error.is_timeout() { "timed out" } else { "no answer" }.to_owned(),
                    };
                    history.push((answer.clone(), began.elapsed()));
                    let retry = history.len() > 1;
                    if answer.starts_with('2') || (retry && answer == "409 suppression_already_exists") {
                        break Outcome::Acknowledged(Value::Null);
                    }
                    if answer.starts_with('4') && !answer.starts_with("429") {
                        break Outcome::Refused(answer[..3].parse().unwrap_or(400), json!(answer));
                    }
                    *seen.errors.entry(answer).or_default() += 1;
                    if began.elapsed() > GIVE_UP_AFTER {
                        break Outcome::Unknown;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                if matches!(outcome, Outcome::Acknowledged(_)) {
                    seen.acknowledged.push((began, Instant::now()));
                }
                let attempts = u32::try_from(history.len()).unwrap_or(u32::MAX);
                seen.operations.push(Operation {
                    kind: "suppress",
                    subject: identifier,
                    attempts,
                    history,
                    began,
                    took: began.elapsed(),
                    outcome,
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        });
        Probe { stop, task }
    }
}

impl Probe {
    /// Stops probing; what was seen, timed from `started` (when the fault began).
    async fn finish(self, started: Instant) -> ProbeSeen {
        self.stop.store(true, Ordering::Relaxed);
        let mut seen = self.task.await.expect("the prober");
        seen.gap = longest_gap(started, seen.acknowledged.iter().map(|&(_, acknowledged)| acknowledged));
        seen
    }
}

/// The longest time without an acknowledgement from `started` (when the fault began) on, in
/// seconds after it: from the fault's beginning or an acknowledgement to the next one. The
/// wait for the first acknowledgement after the fault counts: the probe runs from just before
/// the fault, and it often has no write acknowledged in between.
fn longest_gap(started: Instant, acknowledged: impl Iterator<Item = Instant>) -> Option<(f64, f64)> {
    let after = |instant: Instant| instant.saturating_duration_since(started).as_secs_f64();
    let since_fault: Vec<f64> = acknowledged.filter(|&instant| instant > started).map(after).collect();
    std::iter::once(0.0)
        .chain(since_fault.iter().copied())
        .zip(since_fault.iter().copied())
        .max_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)))
}

#[test]
fn the_longest_gap_counts_the_wait_for_the_first_acknowledgement_after_the_fault() {
    let started = Instant::now();
    let at = |seconds: f64| started + Duration::from_secs_f64(seconds);
    // Acknowledged before the fault, then only 10 s after it began, then every 0.5 s.
    let gap = longest_gap(started, [started - Duration::from_secs(1), at(10.0), at(10.5), at(11.0)].into_iter());
    assert_eq!(gap.map(|(from, to)| (from.round(), to.round())), Some((0.0, 10.0)));
    // A longer wait later is the longest.
    let gap = longest_gap(started, [at(0.1), at(0.2), at(3.0)].into_iter());
    assert_eq!(gap.map(|(from, to)| ((from * 10.0).round(), (to * 10.0).round())), Some((2.0, 30.0)));
    assert_eq!(longest_gap(started, std::iter::empty()), None);
}

/// What a client learned of one operation.
#[derive(Debug, Clone)]
enum Outcome {
    /// A 2xx answer, with its body.
    Acknowledged(Value),
    /// No final answer within [`GIVE_UP_AFTER`], or `idempotency_outcome_unknown`.
    Unknown,
    /// A 4xx other than those worth retrying: a defect of the harness or of the service.
    Refused(u16, Value),
}

#[derive(Debug, Clone)]
struct Operation {
    kind: &'static str,
    /// What identifies the operation to the checker (an address, an `eventId`, a key).
    subject: String,
    attempts: u32,
    /// What each attempt got, and when its answer came (from the first attempt).
    history: Vec<(String, Duration)>,
    /// When the first attempt was sent.
    began: Instant,
    /// From the first attempt to the final answer.
    took: Duration,
    outcome: Outcome,
}

/// Sends one operation under `Idempotency-Key: key` until it gets a final answer, retrying the
/// same request on exactly the answers docs/operations.md ("What a client retries") names: no
/// answer, 502, 503, 504, 429 (after `Retry-After`) and 409 `idempotency_conflict`. (Event
/// fires and single suppressions take no key: a fire's retry is deduplicated by its `eventId`.)
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    auth: &str,
    key: &str,
    body: &Value,
) -> (Vec<(String, Duration)>, Outcome) {
    let started = Instant::now();
    // What each attempt got: a status and code, or the transport error.
    let mut history = Vec::new();
    let mut pause = Duration::from_millis(100);
    loop {
        // Each attempt names itself in the services' logs: the key and the attempt's number.
        let mut request = http
            .request(method.clone(), url)
            .bearer_auth(auth)
            .header("Idempotency-Key", key)
            .header("X-Request-Id", format!("{key}.{}", history.len() + 1));
        if !body.is_null() {
            request = request.json(body);
        }
        let mut wait = pause;
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| value.trim().parse::<u64>().ok());
                wait = wait.max(Duration::from_secs(retry_after.unwrap_or(0)));
                let answer: Value = response.json().await.unwrap_or(Value::Null);
                let code = answer["error"]["code"].as_str().unwrap_or_default().to_owned();
                history.push((format!("{status} {code}"), started.elapsed()));
                match (status, code.as_str()) {
                    (200..=299, _) => return (history, Outcome::Acknowledged(answer)),
                    (409, "idempotency_outcome_unknown") => return (history, Outcome::Unknown),
                    // A single suppression takes no idempotency key (the contract): a retry
                    // that meets the address suppressed has met the earlier attempt's write.
                    (409, "suppression_already_exists") if history.len() > 1 => {
                        return (history, Outcome::Acknowledged(answer));
                    }
                    (409, "idempotency_conflict")
                    | (429, "idempotency_admission_busy" | "rate_limit_exceeded")
                    | (502..=504, _) => {}
                    _ => return (history, Outcome::Refused(status, answer)),
                }
            }
            Err(error) => history
                .push((if error.is_timeout() { "timed out".into() } else { "no answer".into() }, started.elapsed())),
        }
        if started.elapsed() > GIVE_UP_AFTER {
            return (history, Outcome::Unknown);
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// One client: runs `next` (which names the operation `n`) until `stop`, one at a time.
fn client<F>(http: reqwest::Client, stop: Arc<AtomicBool>, next: F) -> tokio::task::JoinHandle<Vec<Operation>>
where
    F: Fn(usize) -> (&'static str, String, reqwest::Method, String, &'static str, Value) + Send + 'static,
{
    tokio::spawn(async move {
        let mut done = Vec::new();
        for n in 0.. {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let (kind, subject, method, url, auth, body) = next(n);
            let key = format!("{kind}-{subject}");
            let started = Instant::now();
            let (history, outcome) = call(&http, method, &url, auth, &key, &body).await;
            let attempts = u32::try_from(history.len()).unwrap_or(u32::MAX);
            done.push(Operation { kind, subject, attempts, history, began: started, took: started.elapsed(), outcome });
        }
        done
    })
}

/// Every item of a list endpoint, following its cursor or offset pages.
async fn list_all(http: &reqwest::Client, url: &str, auth: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut next = format!("{url}{}limit=100", if url.contains('?') { '&' } else { '?' });
    loop {
        let page: Value = get_json(http, &next, auth).await;
        let data = page["data"].as_array().unwrap_or_else(|| panic!("a page of {url}: {page}"));
        items.extend(data.iter().cloned());
        let pagination = &page["pagination"];
        if pagination["hasMore"] != true {
            return items;
        }
        let base = format!("{url}{}limit=100", if url.contains('?') { '&' } else { '?' });
        next = match (pagination["nextCursor"].as_str(), pagination["offset"].as_u64()) {
            (Some(cursor), _) => format!("{base}&cursor={cursor}"),
            (None, Some(offset)) => format!("{base}&offset={}", offset + 100),
            _ => panic!("a page with more but no way on: {pagination}"),
        };
    }
}

/// A GET that must answer 200 (retried while the deployment recovers).
async fn get_json(http: &reqwest::Client, url: &str, auth: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = http.get(url).bearer_auth(auth).send().await {
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            if status == 200 {
                return body;
            }
            assert!(status >= 500 || status == 429, "GET {url}: {status} {body}");
        }
        assert!(Instant::now() < deadline, "GET {url} did not answer 200 within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The status of a GET, retried while it is a 5xx.
async fn get_status(http: &reqwest::Client, url: &str, auth: &str) -> u16 {
    for _ in 0..100 {
        if let Ok(response) = http.get(url).bearer_auth(auth).send().await {
            let status = response.status().as_u16();
            if status < 500 {
                return status;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("GET {url} kept failing");
}

/// The fixture workspace with the mail space (a large allowance) and a workflow that waits a
/// second and calls the receiver.
fn chaos_workspace(call_url: &str) -> String {
    let mut workspace: Value = serde_json::from_str(&mail_workspace(100_000_000)).expect("the workspace is JSON");
    let spaces = workspace["spaces"].as_array_mut().expect("spaces");
    let mail = spaces.iter_mut().find(|space| space["slug"] == "mail").expect("the mail space");
    // The broadcast's mail has a link to follow (clicks are part of the load).
    if let Some(promo) = mail["templates"]
        .as_array_mut()
        .and_then(|templates| templates.iter_mut().find(|template| template["slug"] == "promo"))
    {
        promo["html"] = json!("<p>Promo: <a href=\"https://shop.example.com/sale\">the sale</a></p>");
    }
    // A send policy: one marketing email a day, and quiet hours (held) from an hour ago to two
    // hours from now in UTC, where the held fans live; the others are in a zone twelve hours
    // ahead, where it is day.
    mail["schemas"][0]["attributes"]
        .as_array_mut()
        .expect("attributes")
        .push(json!({"key": "timeZone", "definition": {"type": "timezone"}}));
    let hour = chrono::Timelike::hour(&chrono::Utc::now());
    mail["sendPolicy"] = json!({
        "timeZone": {"attribute": "timeZone", "default": "Etc/GMT-12"},
        "quietHours": {"from": format!("{:02}:00", (hour + 23) % 24), "to": format!("{:02}:00", (hour + 2) % 24),
                       "outcome": "hold"},
        "frequencyCaps": [{"max": 1, "per": {"days": 1}, "outcome": "skip"}]
    });
    mail["workflows"] = json!([{"slug": "chaos", "name": "Chaos", "signingSecret": SECRET, "steps": [
        {"id": "start", "type": "incoming_webhook", "referenceId": "chaos-hook"},
        {"id": "nap", "type": "wait", "duration": "1s"},
        {"id": "call", "type": "call_webhook", "url": call_url},
        {"id": "done", "type": "exit"}
    ]}]);
    workspace.to_string()
}

/// The counts of one kind of operation.
#[derive(Debug, Default, Clone)]
struct Counts {
    acknowledged: usize,
    present: usize,
    retried: usize,
    unknown: usize,
    duplicated: usize,
    lost: usize,
}

fn tally(operations: &[&Operation]) -> Counts {
    Counts {
        acknowledged: operations.iter().filter(|op| matches!(op.outcome, Outcome::Acknowledged(_))).count(),
        retried: operations.iter().filter(|op| op.attempts > 1).count(),
        unknown: operations.iter().filter(|op| matches!(op.outcome, Outcome::Unknown)).count(),
        ..Counts::default()
    }
}

fn acknowledged<'a>(operations: &'a [&'a Operation]) -> impl Iterator<Item = (&'a Operation, &'a Value)> + 'a {
    operations.iter().filter_map(|op| match &op.outcome {
        Outcome::Acknowledged(body) => Some((*op, body)),
        _ => None,
    })
}

/// The rows of a two-column text query, as a map from the first column to the second.
async fn pairs(client: &tokio_postgres::Client, sql: &str) -> HashMap<String, String> {
    let rows = client.query(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {error}"));
    rows.into_iter().map(|row| (row.get(0), row.get(1))).collect()
}

async fn query_i64(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {error}")).get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_fault_loses_an_acknowledged_write() {
    if chaos_enabled("no_fault_loses_an_acknowledged_write", false) {
        harness(false).await;
    }
}

/// The same load and checker on the HA deployment (pg_auto_failover: a primary, a synchronous
/// standby and the monitor), whose primary is killed for good, cut off from everyone while it
/// runs, and switched over, beside the process kills and the mail and webhook link faults.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_failover_loses_an_acknowledged_write() {
    if chaos_enabled("no_failover_loses_an_acknowledged_write", true) {
        harness(true).await;
    }
}

/// Whether the fault harness `name` runs: only when `CHAOS=1` (scripts/test, scripts/chaos and
/// CI set it), because it loads the whole machine for a minute or more; otherwise it says it
/// was skipped and why. The HA form also needs root (a network namespace per database
/// server): without it, it is skipped, except in CI (`CI` set), where that is a failure.
fn chaos_enabled(name: &str, needs_root: bool) -> bool {
    if std::env::var("CHAOS").as_deref() != Ok("1") {
        skipped(&format!(
            "chaos::{name} SKIPPED: the fault harness loads the whole machine for a minute or more; \
             it runs with CHAOS=1 (scripts/test sets it; scripts/chaos runs it at length)"
        ));
        return false;
    }
    if needs_root && !running_as_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "chaos::{name} needs root (a network namespace per database server), and CI must run it"
        );
        skipped(&format!("chaos::{name} SKIPPED: it needs root (a network namespace per database server)"));
        return false;
    }
    true
}

/// Says why a test did nothing, past the test harness's capture of its output (written to the
/// process's stderr, not through `eprintln!`), so that a plain `cargo test` shows it.
fn skipped(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

pub(crate) fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false)
}

async fn harness(ha: bool) {
    let seconds: u64 = std::env::var("CHAOS_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let seed: u64 = std::env::var("CHAOS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let what = if ha { "the HA deployment" } else { "one database server" };
    eprintln!("chaos: {seconds} s of load and faults on {what}, CHAOS_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);

    // PostgreSQL of its own (durable: fsync and synchronous commit on): one server behind the
    // proxy, or the HA cluster, whose nodes the services list.
    let (database, direct_url, services_url, read_url) = if ha {
        let cluster = tokio::task::block_in_place(|| HaCluster::start(2));
        let url = cluster.migrated_platform().await;
        let read_url = cluster.read_url();
        (Database::Ha(cluster), url.clone(), url, Some(read_url))
    } else {
        let cluster = PrivateCluster::start();
        let direct_url = cluster.migrated_platform().await;
        let cluster_port: u16 = direct_url
            .split_whitespace()
            .find_map(|part| part.strip_prefix("port="))
            .and_then(|port| port.parse().ok())
            .expect("the cluster's port");
        let proxy = FaultProxy::start(cluster_port).await;
        let proxied_url = direct_url.replace(&format!("port={cluster_port}"), &format!("port={}", proxy.port()));
        (Database::Single { cluster, proxy }, direct_url, proxied_url, None)
    };

    // The SMTP sink and the webhook receiver, each behind a fault proxy of its own.
    let sink = Arc::new(SmtpSink::start().await);
    let receiver = Receiver::start().await;
    let mail_proxy = FaultProxy::start(sink.smtp_port()).await;
    let hook_proxy = FaultProxy::start(receiver.port()).await;
    let proxied_hook =
        |name: &str| receiver.url(name).replace(&format!(":{}/", receiver.port()), &format!(":{}/", hook_proxy.port()));
    receiver.endpoint("crm", &[SECRET], json!({"status": 200})).await;
    let mut common = sink.process_env(2000);
    for (name, value) in &mut common {
        if *name == "APP__EMAIL__RELAY_URL" {
            *value = format!("smtp://127.0.0.1:{}", mail_proxy.port());
        }
    }
    common.extend([
        ("APP__WEBHOOKS__ALLOW_LOOPBACK", "true".to_owned()),
        ("APP__WEBHOOKS__ATTEMPT_TIMEOUT_MS", "2000".to_owned()),
        ("APP__WEBHOOKS__RETRY_SCHEDULE_MS", "[100,200,400,800,1600,3200,5000,5000,5000]".to_owned()),
        ("APP__WORKFLOWS__LEASE_MS", "3000".to_owned()),
        ("APP__BROADCASTS__RATE_PER_SECOND", "10".to_owned()),
        ("APP__RATE_LIMITS__ENABLED", "false".to_owned()),
    ]);
    // Event admission is not what this is about (the contract's 5 per second per schema would
    // refuse most of the load).
    for name in [
        "APP__EVENTS__ADMISSION__FLEET__RATE",
        "APP__EVENTS__ADMISSION__FLEET__BURST",
        "APP__EVENTS__ADMISSION__SPACE__RATE",
        "APP__EVENTS__ADMISSION__SPACE__BURST",
        "APP__EVENTS__ADMISSION__SCHEMA__RATE",
        "APP__EVENTS__ADMISSION__SCHEMA__BURST",
    ] {
        common.push((name, "1000000".to_owned()));
    }
    let served = |port: u16| {
        let mut env = common.clone();
        env.push(("APP__HTTP__PORT", port.to_string()));
        env
    };
    let (command_ports, query_ports) = ([free_port(), free_port()], [free_port(), free_port()]);
    // Each projector's slot, which its replacement after a kill fills (its port is picked at
    // random, so it names none of its own).
    let projectors: Vec<Slot> = (0..2)
        .map(|slot| {
            let mut env = common.clone();
            env.push(("APP__INSTANCE", format!("chaos-projector-{slot}")));
            Slot::start("projector", &["run"], env, &services_url)
        })
        .collect();
    let commands: Vec<Slot> = command_ports
        .iter()
        .map(|port| Slot::start("command-service", &["serve"], served(*port), &services_url))
        .collect();
    // On the HA deployment the query services read from whichever node is the standby.
    let queries: Vec<Slot> = query_ports
        .iter()
        .map(|port| {
            let mut env = served(*port);
            if let Some(read_url) = &read_url {
                env.push(("APP__DATABASE__READ_URL", read_url.clone()));
            }
            Slot::start("query-service", &[], env, &services_url)
        })
        .collect();
    let listen = free_port();
    let _nginx: Nginx = start_nginx(listen, &command_ports, &query_ports);
    let base = format!("http://127.0.0.1:{listen}/v1");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(15)).build().expect("client");
    for port in command_ports.iter().chain(&query_ports) {
        crate::log::wait_until_listening(&http, &format!("http://127.0.0.1:{port}/v1")).await;
    }
    let workspace_file = scratch_dir("chaos").join("workspace.json");
    std::fs::write(&workspace_file, chaos_workspace(&proxied_hook("crm"))).expect("workspace written");
    apply_file(&workspace_file.display().to_string(), &direct_url);
    // Both keys work before the load begins (on the HA deployment the query services read the
    // catalog on the standby, and a key it has not replayed yet on the primary).
    for key in [MAIL_KEY, ALPHA_ADMIN] {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answered = http.get(format!("{base}/me")).bearer_auth(key).send().await;
            if answered.is_ok_and(|response| response.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "the workspace's key {key} did not authenticate within 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Before the faults: the DKIM key published, a webhook, the broadcast's audience, erasures.
    let domains = get_json(&http, &format!("{base}/domains"), MAIL_KEY).await;
    for record in domains["data"][0]["records"].as_array().expect("records") {
        if record["purpose"] == "dkim" {
            sink.add_dkim_record(record["name"].as_str().expect("name"), record["value"].as_str().expect("value"))
                .await;
        }
    }
    let setup = |kind: &'static str, subject: String, path: &str, auth: &'static str, body: Value| {
        let (http, url) = (http.clone(), format!("{base}{path}"));
        async move {
            match call(&http, reqwest::Method::POST, &url, auth, &format!("setup-{kind}-{subject}"), &body).await {
                (_, Outcome::Acknowledged(body)) => body,
                other => panic!("setting up {kind} {subject}: {other:?}"),
            }
        }
    };
    let webhook = setup(
        "webhook",
        "contacts".into(),
        "/webhooks",
        ALPHA_ADMIN,
        json!({"url": proxied_hook("hooks"), "trigger": "contact upserted", "schemaId": "contacts"}),
    )
    .await;
    let webhook_secret = webhook["data"]["signatureVerificationSecret"].as_str().expect("secret").to_owned();
    receiver.endpoint("hooks", &[&webhook_secret], json!({"status": 204})).await;
    let fans = futures_util::future::join_all((0..FANS).map(|index| {
        let mut fan = json!({"email": format!("fan-{index}@chaos.test"), "firstName": "Fan", "newsConsent": true});
        if (CAPPED_FANS..CAPPED_FANS + HELD_FANS).contains(&index) {
            fan["timeZone"] = json!("UTC");
        }
        setup("fan", index.to_string(), "/schemas/people/records", MAIL_KEY, fan)
    }))
    .await;
    assert_eq!(fans.len(), FANS);
    // The capped fans had their marketing email of the day already.
    let promo = {
        let templates = get_json(&http, &format!("{base}/templates"), MAIL_KEY).await;
        let promo = templates["data"].as_array().expect("templates").iter().find(|t| t["slug"] == "promo").cloned();
        promo.and_then(|t| t["id"].as_str().map(str::to_owned)).expect("the promo template")
    };
    for index in 0..CAPPED_FANS {
        let body = json!({"data": {"contact": {"email": format!("fan-{index}@chaos.test")}}});
        let sent = setup("today", index.to_string(), &format!("/templates/{promo}/send"), MAIL_KEY, body).await;
        assert_eq!(sent["data"]["status"], "sent", "{sent}");
    }
    let segment = setup(
        "segment",
        "fans".into(),
        "/segments",
        MAIL_KEY,
        json!({"name": "Fans", "definition": "firstName is Fan"}),
    )
    .await;
    let segment_id = segment["data"]["id"].as_str().expect("segment id").to_owned();
    let aimed = http
        .patch(format!("{base}/broadcasts/{BLAST_BROADCAST}"))
        .bearer_auth(MAIL_KEY)
        .json(&json!({"audience": {"segmentId": segment_id}, "scheduledAt": null}))
        .send()
        .await
        .expect("PATCH the broadcast");
    assert_eq!(aimed.status().as_u16(), 200);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get_json(&http, &format!("{base}/segments/{segment_id}"), MAIL_KEY).await["data"]["memberCount"] != FANS {
        assert!(Instant::now() < deadline, "the segment did not fill");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut erasures = Vec::new();
    for index in 0..ERASED {
        let email = format!("erased-{index}@chaos.test");
        let created =
            setup("erased", index.to_string(), "/schemas/contacts/records", ALPHA_ADMIN, json!({"email": email})).await;
        let id = created["data"]["id"].as_str().expect("id").to_owned();
        let deleted = match call(
            &http,
            reqwest::Method::DELETE,
            &format!("{base}/schemas/contacts/records/{id}"),
            ALPHA_ADMIN,
            &format!("erase-{index}"),
            &Value::Null,
        )
        .await
        {
            (_, Outcome::Acknowledged(body)) => body,
            other => panic!("erasing {id}: {other:?}"),
        };
        let operation = deleted["data"]["operationId"].as_str().expect("an operation id").to_owned();
        erasures.push((id, operation));
    }

    // The load: one client per kind of write, all through nginx.
    let stop = Arc::new(AtomicBool::new(false));
    let receipt = {
        let templates = get_json(&http, &format!("{base}/templates"), MAIL_KEY).await;
        let receipt = templates["data"].as_array().expect("templates").iter().find(|t| t["slug"] == "receipt").cloned();
        receipt.and_then(|t| t["id"].as_str().map(str::to_owned)).expect("the receipt template")
    };
    let post = reqwest::Method::POST;
    // Two clients create contacts (the one path most writes take), one does each other kind.
    let creators = [("a", "pro"), ("b", "free")].map(|(prefix, plan)| {
        let (base, post) = (base.clone(), post.clone());
        client(http.clone(), stop.clone(), move |n| {
            let email = format!("{prefix}-{n}@chaos.test");
            let body = json!({"email": email, "plan": plan});
            ("create", email, post.clone(), format!("{base}/schemas/contacts/records"), ALPHA_ADMIN, body)
        })
    });
    let others = vec![
        client(http.clone(), stop.clone(), {
            let (base, post) = (base.clone(), post.clone());
            move |n| {
                let email = format!("u-{}@chaos.test", n % UPSERT_KEYS);
                let body = json!({"email": email, "age": n});
                (
                    "upsert",
                    format!("{email}#{n}"),
                    post.clone(),
                    format!("{base}/schemas/contacts/records/upsert"),
                    ALPHA_ADMIN,
                    body,
                )
            }
        }),
        client(http.clone(), stop.clone(), {
            let (base, post) = (base.clone(), post.clone());
            move |n| {
                if n % 4 == 3 {
                    let events: Vec<Value> =
                        (0..5).map(|item| json!({"eventId": format!("batch-{n}-{item}"), "plan": "pro"})).collect();
                    let body = json!({"events": events});
                    (
                        "batch",
                        format!("batch-{n}"),
                        post.clone(),
                        format!("{base}/events/signup/batch"),
                        ALPHA_ADMIN,
                        body,
                    )
                } else {
                    let body = json!({"eventId": format!("fire-{n}"), "plan": "free"});
                    ("fire", format!("fire-{n}"), post.clone(), format!("{base}/events/signup"), ALPHA_ADMIN, body)
                }
            }
        }),
        client(http.clone(), stop.clone(), {
            let (base, post) = (base.clone(), post.clone());
            move |n| {
                let identifier = format!("s-{n}@chaos.test");
                let body = json!({"identifier": identifier, "reason": "manual"});
                ("suppress", identifier, post.clone(), format!("{base}/contacts/suppressions"), ALPHA_ADMIN, body)
            }
        }),
        client(http.clone(), stop.clone(), {
            let (base, post) = (base.clone(), post.clone());
            move |n| {
                let email = format!("r-{n}@chaos.test");
                let body = json!({"data": {
                    "contact": {"email": email, "firstName": "Receipt"},
                    "order": {"externalId": format!("ord-{n}"), "total": 42.5}
                }});
                ("send", email, post.clone(), format!("{base}/templates/{receipt}/send"), MAIL_KEY, body)
            }
        }),
        client(http.clone(), stop.clone(), {
            let (base, post) = (base.clone(), post.clone());
            move |n| {
                let body = json!({"n": n, "contact": {"email": format!("w-{n}@chaos.test"), "firstName": "W"}});
                ("trigger", format!("w-{n}"), post.clone(), format!("{base}/workflows/chaos-hook"), MAIL_KEY, body)
            }
        }),
    ];
    let broadcast = {
        let url = format!("{base}/broadcasts/{BLAST_BROADCAST}/send");
        match call(&http, reqwest::Method::POST, &url, MAIL_KEY, "chaos-blast", &Value::Null).await {
            (_, Outcome::Acknowledged(body)) => body["data"]["id"].as_str().expect("a run id").to_owned(),
            other => panic!("sending the broadcast: {other:?}"),
        }
    };
    // Recipients follow the broadcast's link as its messages arrive: each request is a click
    // of its own (a person who gets no answer clicks again), answered 302 once taken in.
    let clicker = {
        let (stop, sink, base) = (stop.clone(), Arc::clone(&sink), base.clone());
        tokio::spawn(async move {
            let (mut attempted, mut answered) = (0usize, 0usize);
            let mut links: Vec<String> = Vec::new();
            let no_redirects = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(5))
                .build()
                .expect("a client");
            let mut refreshed = Instant::now() - Duration::from_secs(10);
            while !stop.load(Ordering::Relaxed) {
                if refreshed.elapsed() > Duration::from_secs(2) {
                    links = sink
                        .messages()
                        .await
                        .iter()
                        .filter(|message| message["rcptTo"][0].as_str().is_some_and(|to| to.starts_with("fan-")))
                        .flat_map(|message| crate::engagement::tracked(message, "click?"))
                        .map(|link| link.replacen(crate::engagement::PUBLIC_BASE, &base, 1))
                        .collect();
                    refreshed = Instant::now();
                }
                let Some(link) = links.get(attempted.wrapping_mul(7919) % links.len().max(1)).cloned() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                attempted += 1;
                let browser = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0";
                if let Ok(response) = no_redirects.get(&link).header("User-Agent", browser).send().await {
                    answered += usize::from(response.status().as_u16() == 302);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (attempted, answered)
        })
    };

    // The faults: one round of each kind per started minute of the window, each at a random
    // moment of its round (within its first 80%), applied one after another.
    let window = Duration::from_secs(seconds);
    let rounds = seconds.div_ceil(60).max(1);
    let round = window / u32::try_from(rounds).unwrap_or(1);
    let mut schedule: Vec<(Duration, FaultKind)> = Vec::new();
    for index in 0..rounds {
        let start = round * u32::try_from(index).unwrap_or(0);
        for fault in round_faults(ha) {
            schedule.push((start + round.mul_f64(rng.random_range(0.1..0.8)), fault));
        }
    }
    schedule.sort_by_key(|(at, _)| *at);
    let prober = Prober {
        http: reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("a client"),
        base: base.clone(),
        url: format!("{base}/contacts/suppressions"),
        next: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        done: Vec::new(),
    };
    let mut deployment = Deployment {
        database,
        services_url: services_url.clone(),
        commands,
        queries,
        projectors,
        mail_proxy,
        hook_proxy,
        prober,
    };
    // What each HA node said it was throughout, to set beside the faults if a write is lost.
    let roles = match &deployment.database {
        Database::Ha(cluster) => Some(tokio::task::block_in_place(|| cluster.watch_roles())),
        Database::Single { .. } => None,
    };
    let started = Instant::now();
    // The same moment on the wall clock, to set the HA monitor's events on the faults' clock.
    let started_wall = std::time::SystemTime::now();
    let mut faults = Vec::new();
    for (at, fault) in schedule {
        if let Some(wait) = at.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let at = started.elapsed();
        let line = deployment.apply(fault, &mut rng).await;
        eprintln!("chaos: at {:.1} s: {line}", at.as_secs_f64());
        faults.push(format!("{:.1} s: {line}", at.as_secs_f64()));
    }
    if let Some(rest) = window.checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut operations = Vec::new();
    for handle in creators.into_iter().chain(others) {
        operations.extend(handle.await.expect("a client"));
    }
    // The probes' writes during failovers are suppressions like any other.
    operations.append(&mut deployment.prober.done);
    let (clicks_attempted, clicks_answered) = clicker.await.expect("the clicker");
    let load_took = started.elapsed();

    // Settling: every worker drains what the load left.
    let (checker, connection) = tokio_postgres::connect(&direct_url, tokio_postgres::NoTls).await.expect("checker");
    tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let open: Vec<String> = checker
            .query(
                "SELECT 'outbox ' || state, count(*) FROM email_outbox WHERE state IN ('pending', 'attempting')
                   GROUP BY state
                 UNION ALL SELECT 'webhook deliveries pending', count(*) FROM webhook_deliveries
                   WHERE state = 'pending' HAVING count(*) > 0
                 UNION ALL SELECT 'engagement inbox', count(*) FROM engagement_inbox HAVING count(*) > 0
                 UNION ALL SELECT 'workflow runs unfinished', count(*) FROM workflow_runs
                   WHERE finished_at IS NULL HAVING count(*) > 0
                 UNION ALL SELECT 'read model ' || name || ' behind', (SELECT position FROM log_head) - min(position)
                   FROM projections WHERE status = 'live' GROUP BY name
                   HAVING min(position) < (SELECT position FROM log_head)
                 UNION ALL SELECT 'worker ' || name || ' behind', (SELECT position FROM log_head) - position
                   FROM worker_checkpoints WHERE position < (SELECT position FROM log_head)
                   AND name IN ('preparation', 'webhook_enqueue', 'workflow_events')",
                &[],
            )
            .await
            .map(|rows| {
                rows.iter().map(|row| format!("{} {}", row.get::<_, String>(0), row.get::<_, i64>(1))).collect()
            })
            .unwrap_or_else(|error| vec![format!("not queried: {error}")]);
        let run = get_json(&http, &format!("{base}/broadcasts/{BLAST_BROADCAST}/runs/{broadcast}"), MAIL_KEY).await;
        let mut erasing = 0;
        for (_, operation) in &erasures {
            let deletion = get_json(&http, &format!("{base}/record-deletions/{operation}"), ALPHA_ADMIN).await;
            erasing += usize::from(deletion["data"]["status"] != "completed");
        }
        if open.is_empty() && run["data"]["status"] == "completed" && erasing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the deployment did not settle: {open:?}, broadcast {}, {erasing} erasures pending",
            run["data"]["status"]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settle_took = started.elapsed() - load_took;

    // The checker.
    let refused: Vec<String> = operations
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Refused(status, body) => {
                Some(format!("{} {}: {status} {body} after {:?}", op.kind, op.subject, op.history))
            }
            _ => None,
        })
        .collect();
    for op in operations.iter().filter(|op| matches!(op.outcome, Outcome::Refused(..))).take(3) {
        let key = format!("{}-{}", op.kind, op.subject);
        let claims = checker
            .query(
                "SELECT state || ' ' || COALESCE(status::text, '-') || ' claimed ' || claimed_at::text
                        || ' completed ' || COALESCE(completed_at::text, '-')
                 FROM idempotency_records WHERE idempotency_key = $1",
                &[&key],
            )
            .await
            .map(|rows| rows.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>());
        let events = checker
            .query(
                "SELECT position || ' ' || event_type || ' ' || recorded_at::text || ' ' || COALESCE(request_id, '-')
                 FROM events WHERE idempotency_key = $1 ORDER BY position",
                &[&key],
            )
            .await
            .map(|rows| rows.iter().map(|row| row.get::<_, String>(0)).collect::<Vec<_>>());
        eprintln!("chaos: refused {key}: claims {claims:?}; events under the key {events:?}");
    }
    let first: Vec<&String> = refused.iter().take(5).collect();
    assert!(refused.is_empty(), "{} operations refused with a 4xx, first: {first:#?}", refused.len());
    let of_kind =
        |kinds: &[&str]| -> Vec<&Operation> { operations.iter().filter(|op| kinds.contains(&op.kind)).collect() };
    let mut report: BTreeMap<&str, Counts> = BTreeMap::new();
    // When each acknowledged write found lost had begun, to set the losses beside the faults.
    let mut lost_began: Vec<Instant> = Vec::new();

    // Records: each acknowledged create is the one record with its address, and readable.
    let contacts = list_all(&http, &format!("{base}/schemas/contacts/records"), ALPHA_ADMIN).await;
    let mut by_email: HashMap<String, Vec<String>> = HashMap::new();
    for contact in &contacts {
        if let (Some(email), Some(id)) = (contact["email"].as_str(), contact["id"].as_str()) {
            by_email.entry(email.to_owned()).or_default().push(id.to_owned());
        }
    }
    let creates = of_kind(&["create"]);
    let mut counts = tally(&creates);
    for (op, body) in acknowledged(&creates) {
        let id = body["data"]["id"].as_str().expect("an id");
        let readable = get_status(&http, &format!("{base}/schemas/contacts/records/{id}"), ALPHA_ADMIN).await == 200;
        if by_email.get(&op.subject).is_some_and(|ids| ids == &[id.to_owned()]) && readable {
            counts.present += 1;
        } else {
            counts.lost += 1;
            lost_began.push(op.began);
            eprintln!(
                "chaos: lost create {} ({id}): listed as {:?}, readable {readable}",
                op.subject,
                by_email.get(&op.subject)
            );
        }
    }
    counts.duplicated = by_email.values().filter(|ids| ids.len() > 1).count();
    report.insert("records created", counts);

    // Upserts: one record per key, holding the last acknowledged age (or a later unknown one).
    let upserts = of_kind(&["upsert"]);
    let mut counts = tally(&upserts);
    for key in 0..UPSERT_KEYS {
        let email = format!("u-{key}@chaos.test");
        let ours: Vec<&&Operation> = upserts.iter().filter(|op| op.subject.starts_with(&format!("{email}#"))).collect();
        let age_of = |op: &Operation| op.subject.rsplit('#').next().and_then(|n| n.parse::<i64>().ok());
        let last_acknowledged = ours.iter().rposition(|op| matches!(op.outcome, Outcome::Acknowledged(_)));
        let Some(last) = last_acknowledged else { continue };
        let allowed: HashSet<i64> = ours[last..]
            .iter()
            .enumerate()
            .filter(|(index, op)| *index == 0 || matches!(op.outcome, Outcome::Unknown))
            .filter_map(|(_, op)| age_of(op))
            .collect();
        let ids = by_email.get(&email).cloned().unwrap_or_default();
        counts.duplicated += ids.len().saturating_sub(1);
        let acknowledged_here = ours.iter().filter(|op| matches!(op.outcome, Outcome::Acknowledged(_))).count();
        let current = match ids.first() {
            Some(id) => get_json(&http, &format!("{base}/schemas/contacts/records/{id}"), ALPHA_ADMIN).await,
            None => Value::Null,
        };
        if current["data"]["age"].as_i64().is_some_and(|age| allowed.contains(&age)) {
            counts.present += acknowledged_here;
        } else {
            counts.lost += acknowledged_here;
            eprintln!("chaos: upserts of {email} ended at {} (allowed {allowed:?})", current["data"]["age"]);
        }
    }
    report.insert("records upserted", counts);

    // Events, counted per event: each accepted one listed once, its status readable; a batch
    // item answered `failed` for a transient reason wrote nothing, so it is nowhere.
    let listed = list_all(&http, &format!("{base}/events?schema=signup"), ALPHA_ADMIN).await;
    let mut events: HashMap<String, usize> = HashMap::new();
    for event in &listed {
        *events.entry(event["eventId"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    let fires = of_kind(&["fire", "batch"]);
    let tallied = tally(&fires);
    let mut counts = Counts { retried: tallied.retried, unknown: tallied.unknown, ..Counts::default() };
    let mut items_failed = 0;
    for (op, body) in acknowledged(&fires) {
        let results: Vec<Value> = if op.kind == "batch" {
            body["data"]["results"].as_array().cloned().unwrap_or_default()
        } else {
            vec![json!({"index": 0, "status": "accepted", "id": body["data"]["id"]})]
        };
        for result in results {
            let event_id = if op.kind == "batch" {
                format!("{}-{}", op.subject, result["index"].as_u64().unwrap_or(0))
            } else {
                op.subject.clone()
            };
            if result["status"] != "accepted" {
                let code = result["error"]["code"].as_str().unwrap_or_default();
                assert!(matches!(code, "service_unavailable" | "event_rate_limited"), "{event_id}: {result}");
                assert!(!events.contains_key(&event_id), "{event_id} failed ({code}) yet was written");
                items_failed += 1;
                continue;
            }
            counts.acknowledged += 1;
            let id = result["id"].as_str().unwrap_or_default();
            let status = get_status(&http, &format!("{base}/events/signup/{id}/status"), ALPHA_ADMIN).await;
            if status == 200 && events.get(&event_id) == Some(&1) {
                counts.present += 1;
            } else {
                counts.lost += 1;
                lost_began.push(op.began);
                eprintln!("chaos: lost event {event_id} ({id}): status {status}, listed {:?}", events.get(&event_id));
            }
        }
    }
    counts.duplicated = events.values().filter(|count| **count > 1).count();
    report.insert("events fired and batched", counts);

    // Suppressions.
    let suppressions = list_all(&http, &format!("{base}/contacts/suppressions"), ALPHA_ADMIN).await;
    let mut suppressed: HashMap<String, usize> = HashMap::new();
    for suppression in &suppressions {
        *suppressed.entry(suppression["identifier"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    let suppresses = of_kind(&["suppress"]);
    let mut counts = tally(&suppresses);
    for (op, _) in acknowledged(&suppresses) {
        if suppressed.get(&op.subject) == Some(&1) {
            counts.present += 1;
        } else {
            counts.lost += 1;
            lost_began.push(op.began);
            eprintln!("chaos: lost suppression {}", op.subject);
        }
    }
    counts.duplicated = suppressed.values().filter(|count| **count > 1).count();
    report.insert("suppressions", counts);

    // Template sends: each left at most once; a sent one exactly once.
    let summary = sink.summary().await;
    let mut delivered: HashMap<String, usize> = HashMap::new();
    for message_id in summary["messageIds"].as_array().expect("ids").iter().filter_map(Value::as_str) {
        let id = message_id.trim_start_matches('<').split('@').next().unwrap_or_default().to_owned();
        *delivered.entry(id).or_default() += 1;
    }
    assert_eq!(summary["dkimInvalid"], 0, "every message verified against the published key");
    let outbox = pairs(&checker, "SELECT email_id, state FROM email_outbox").await;
    let sends = of_kind(&["send"]);
    let mut counts = tally(&sends);
    let mut email_unknown = 0;
    for (op, body) in acknowledged(&sends) {
        let id = body["data"]["emailId"].as_str().expect("an email id");
        let copies = delivered.get(id).copied().unwrap_or(0);
        match (outbox.get(id).map(String::as_str), copies) {
            // Failed: the client was told nothing left, and nothing did.
            (Some("sent"), 1) | (Some("failed"), 0) => counts.present += 1,
            (Some("unknown"), 0 | 1) => {
                counts.present += 1;
                email_unknown += 1;
            }
            (state, copies) => {
                counts.lost += 1;
                lost_began.push(op.began);
                eprintln!("chaos: send {} ({id}) is {state:?} with {copies} copies delivered", op.subject);
            }
        }
    }
    counts.duplicated = delivered.values().filter(|copies| **copies > 1).count();
    report.insert("template sends", counts);

    // The broadcast: every fan once, sent or unknown, except the capped ones (skipped with a
    // story) and the held ones (held with a story); never two of these, never a message twice.
    let run = get_json(&http, &format!("{base}/broadcasts/{BLAST_BROADCAST}/runs/{broadcast}"), MAIL_KEY).await;
    let run_counts = &run["data"]["counts"];
    let (sent, unknown) =
        (run_counts["sent"].as_u64().unwrap_or(0), run_counts["outcomeUnknown"].as_u64().unwrap_or(0));
    let mut fan_copies: HashMap<&str, usize> = HashMap::new();
    for recipient in summary["rcptTo"].as_array().expect("recipients").iter().filter_map(Value::as_str) {
        if recipient.starts_with("fan-") {
            *fan_copies.entry(recipient).or_default() += 1;
        }
    }
    let mailed = FANS - CAPPED_FANS - HELD_FANS;
    let broadcast_counts = Counts {
        acknowledged: mailed,
        present: usize::try_from(sent + unknown).unwrap_or(0),
        unknown: usize::try_from(unknown).unwrap_or(0),
        // A capped fan's one message is the promo it had before the broadcast.
        duplicated: fan_copies.values().filter(|copies| **copies > 1).count(),
        lost: mailed.saturating_sub(usize::try_from(sent + unknown).unwrap_or(0)),
        retried: 0,
    };
    assert!(fan_copies.len() >= usize::try_from(sent).unwrap_or(usize::MAX), "every sent fan got the broadcast: {run}");
    report.insert("broadcast recipients", broadcast_counts);
    // The run's delivery log: one row per fan, the capped ones skipped by the cap and the held
    // ones held, each of them never mailed by the run.
    let log = get_json(&http, &format!("{base}/emails?broadcastRunId={broadcast}&limit=200"), MAIL_KEY).await;
    let rows = log["data"].as_array().cloned().unwrap_or_default();
    let contacts: HashSet<&str> = rows.iter().filter_map(|row| row["contactId"].as_str()).collect();
    assert_eq!((rows.len(), contacts.len()), (FANS, FANS), "one email per fan: {log}");
    for (kind, status, gate, fans, expected) in [
        ("broadcast recipients capped (stories)", "skipped", "frequency_cap", 0..CAPPED_FANS, CAPPED_FANS),
        ("broadcast recipients held (stories)", "held", "quiet_hours", CAPPED_FANS..CAPPED_FANS + HELD_FANS, HELD_FANS),
    ] {
        let storied: Vec<&Value> = rows.iter().filter(|row| row["status"] == status && row["gate"] == gate).collect();
        let mailed_by_run = fans
            .clone()
            .filter(|index| {
                fan_copies.get(format!("fan-{index}@chaos.test").as_str()).copied().unwrap_or(0)
                    > usize::from(status == "skipped")
            })
            .count();
        report.insert(
            kind,
            Counts {
                acknowledged: expected,
                present: storied.len(),
                unknown: 0,
                duplicated: mailed_by_run,
                lost: expected.saturating_sub(storied.len()),
                retried: 0,
            },
        );
    }
    assert_eq!(run_counts["skipped"]["frequencyCap"], CAPPED_FANS, "{run}");
    assert_eq!(run_counts["held"], HELD_FANS, "{run}");

    // Webhooks: every acknowledged create delivered under exactly one id; every attempt verified.
    let hooks = receiver.received("hooks").await;
    assert!(
        hooks.iter().all(|delivery| delivery["verifiedWith"] == json!([0])),
        "every delivery verifies with the webhook's secret"
    );
    let mut hook_ids: HashMap<String, HashSet<String>> = HashMap::new();
    for delivery in &hooks {
        if let (Some(email), Some(id)) = (delivery["body"]["data"]["email"].as_str(), delivery["webhookId"].as_str()) {
            hook_ids.entry(email.to_owned()).or_default().insert(id.to_owned());
        }
    }
    let repeats = hooks.len() - hook_ids.values().map(HashSet::len).sum::<usize>();
    let mut counts = Counts { retried: repeats, ..Counts::default() };
    for (op, _) in acknowledged(&creates) {
        counts.acknowledged += 1;
        match hook_ids.get(&op.subject).map(HashSet::len) {
            Some(1) => counts.present += 1,
            Some(_) => counts.duplicated += 1,
            None => {
                counts.lost += 1;
                lost_began.push(op.began);
                eprintln!("chaos: no delivery for {}", op.subject);
            }
        }
    }
    report.insert("webhook deliveries (creates)", counts);

    // Workflow runs: each acknowledged trigger ran to its exit; each call arrived at most once.
    let runs = pairs(&checker, "SELECT run_id, status FROM workflow_runs").await;
    let triggers = of_kind(&["trigger"]);
    let mut counts = tally(&triggers);
    for (op, body) in acknowledged(&triggers) {
        let run_id = body["data"]["id"].as_str().expect("a run id");
        if runs.get(run_id).map(String::as_str) == Some("exited") {
            counts.present += 1;
        } else {
            counts.lost += 1;
            lost_began.push(op.began);
            eprintln!("chaos: run {run_id} of {} is {:?}", op.subject, runs.get(run_id));
        }
    }
    // A call is retried under its `webhook-id` (stable per run and step) when its answer is
    // lost, as webhooks are: a repeat under the same id is allowed, a second id is not.
    let calls = receiver.ids("crm").await;
    let call_repeats: u64 = calls.values().map(|received| received - 1).sum();
    counts.duplicated = calls.len().saturating_sub(runs.len());
    report.insert("workflow runs", counts);

    // Clicks: each one answered 302 is in the log once; none is there that was not asked for.
    let clicked =
        usize::try_from(query_i64(&checker, "SELECT count(*) FROM events WHERE event_type = 'EmailClicked.v1'").await)
            .unwrap_or(0);
    report.insert(
        "clicks (each request one)",
        Counts {
            acknowledged: clicks_answered,
            present: clicked.min(clicks_answered),
            retried: 0,
            unknown: clicks_attempted - clicks_answered,
            duplicated: clicked.saturating_sub(clicks_attempted),
            lost: clicks_answered.saturating_sub(clicked),
        },
    );

    // Erasures requested before the faults: complete, and the records gone.
    let mut counts = Counts { acknowledged: ERASED, ..Counts::default() };
    for (id, _) in &erasures {
        match get_status(&http, &format!("{base}/schemas/contacts/records/{id}"), ALPHA_ADMIN).await {
            404 => counts.present += 1,
            other => {
                counts.lost += 1;
                eprintln!("chaos: erased record {id} answers {other}");
            }
        }
    }
    report.insert("erasures completed", counts);

    // Every read model at the head, no dead letter, and the operator's status clean.
    let behind = query_i64(
        &checker,
        "SELECT count(*) FROM projections WHERE status = 'live' AND position < (SELECT position FROM log_head)",
    )
    .await;
    let dead_letters = query_i64(&checker, "SELECT count(*) FROM projection_dead_letters").await;
    let status = run_binary("projector", &["status"], &direct_url);
    let status_text = String::from_utf8_lossy(&status.stdout).into_owned();

    let longest = operations.iter().max_by_key(|op| op.took).map_or(String::new(), |op| {
        let outcome = match op.outcome {
            Outcome::Acknowledged(_) => "acknowledged",
            Outcome::Unknown => "unknown",
            Outcome::Refused(..) => "refused",
        };
        // Its attempts, runs of the same answer counted, each run with when its first and last
        // answers came: `503 service_unavailable ×5 (0.1–6.2 s), 409 idempotency_conflict (7.3 s),
        // 201 (8.4 s)`.
        let mut runs: Vec<(&str, usize, Duration, Duration)> = Vec::new();
        for (answer, at) in &op.history {
            match runs.last_mut() {
                Some((last, count, _, to)) if last == answer => {
                    *count += 1;
                    *to = *at;
                }
                _ => runs.push((answer, 1, *at, *at)),
            }
        }
        let answers: Vec<String> = runs
            .iter()
            .map(|(answer, count, from, to)| {
                let (from, to) = (from.as_secs_f64(), to.as_secs_f64());
                if *count == 1 {
                    format!("{answer} ({from:.1} s)")
                } else {
                    format!("{answer} ×{count} ({from:.1}–{to:.1} s)")
                }
            })
            .collect();
        // When it began, on the clock of the faults' list (negative: before the first fault's
        // window opened), so the fault it met can be read off.
        let began = if op.began >= started {
            op.began.duration_since(started).as_secs_f64()
        } else {
            -started.duration_since(op.began).as_secs_f64()
        };
        format!(
            "{} {} began at {began:.1} s, took {:.1} s over {} attempts ({outcome}): {}",
            op.kind,
            op.subject,
            op.took.as_secs_f64(),
            op.attempts,
            answers.join(", ")
        )
    });
    let table: Vec<String> = report
        .iter()
        .map(|(kind, c)| {
            format!(
                "| {kind} | {} | {} | {} | {} | {} | {} |",
                c.acknowledged, c.present, c.retried, c.unknown, c.duplicated, c.lost
            )
        })
        .collect();
    let printed = format!(
        "{what}; seed {seed}; load {:.0} s, settled {:.0} s later; faults:\n{}\n\n| kind | acknowledged | present | retried | unknown | duplicated | lost |\n|---|---|---|---|---|---|---|\n{}\n\nbatch items answered failed, transient, written nowhere: {items_failed}; webhook repeats under the same id: {repeats}; emails settled as unknown: {email_unknown}; clicks in the log: {clicked} of {clicks_attempted} requests; \
         workflow calls {} for {} runs ({call_repeats} repeats under the same id); read models behind the head: {behind}; dead letters: {dead_letters}\nlongest operation: {longest}",
        load_took.as_secs_f64(),
        settle_took.as_secs_f64(),
        faults.iter().map(|line| format!("- {line}")).collect::<Vec<_>>().join("\n"),
        table.join("\n"),
        calls.len(),
        runs.len(),
    );
    println!("{printed}");
    // Where the losses fall among the faults, and what the HA monitor and each node did around
    // them: printed whole, and the lines within 5 s of the losses carried in the failure.
    let mut diagnosis = String::new();
    if !lost_began.is_empty() {
        let on_clock = |at: Instant| {
            if at >= started {
                at.duration_since(started).as_secs_f64()
            } else {
                -started.duration_since(at).as_secs_f64()
            }
        };
        let mut by_second: BTreeMap<i64, usize> = BTreeMap::new();
        for began in &lost_began {
            *by_second.entry(on_clock(*began).floor() as i64).or_default() += 1;
        }
        let seconds: Vec<String> = by_second.iter().map(|(second, lost)| format!("{second} s: {lost}")).collect();
        diagnosis = format!("acknowledged writes found lost, by the second they began: {}", seconds.join(", "));
        let (first, last) = (
            by_second.keys().next().copied().unwrap_or_default() as f64 - 5.0,
            by_second.keys().last().copied().unwrap_or_default() as f64 + 6.0,
        );
        // Lines that begin with their time on the faults' clock (`12.3 s: ...`), near the losses.
        let near = |text: &str| -> String {
            text.lines()
                .filter(|line| {
                    line.split(" s:")
                        .next()
                        .and_then(|at| at.trim().parse::<f64>().ok())
                        .is_some_and(|at| (first..=last).contains(&at))
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let mut whole = Vec::new();
        if let Database::Ha(cluster) = &deployment.database {
            let epoch = started_wall.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
            let events = tokio::task::block_in_place(|| cluster.events(epoch));
            diagnosis.push_str(&format!("\nthe monitor's events near them:\n{}", near(&events)));
            whole.push(format!("the monitor's events:\n{events}"));
        }
        if let Some(roles) = roles {
            let said = roles.finish(started).await;
            diagnosis.push_str(&format!("\nwhat each node said it was near them:\n{}", near(&said)));
            whole.push(format!("what each node said it was:\n{said}"));
        }
        println!("{}\n{}", diagnosis.lines().next().unwrap_or_default(), whole.join("\n"));
    }
    if let Ok(path) = std::env::var("CHAOS_REPORT") {
        std::fs::write(path, format!("{printed}\n")).expect("the report written");
    }
    assert_eq!(behind, 0, "every read model reached the head of the log");
    assert_eq!(dead_letters, 0, "no event was dead-lettered");
    assert!(status.status.success(), "projector status reports problems:\n{status_text}");
    for (kind, counts) in &report {
        assert_eq!(counts.lost, 0, "{kind}: acknowledged and lost\n{diagnosis}");
        assert_eq!(counts.duplicated, 0, "{kind}: duplicated");
    }
    assert!(report["records created"].acknowledged > 0 && report["template sends"].acknowledged > 0, "load ran");
    assert!(report.values().map(|c| c.retried).sum::<usize>() > 0, "the faults reached the clients");
    drop(deployment);
}
