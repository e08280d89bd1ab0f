//! The worker runtime: leases, wake-ups, backoff and health, shutdown, the due-time
//! scheduler, and choosing which workers a process runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use projector::runtime::{Lease, LeaseName, Outcome, Runtime, Worker};
use projector::timers::{Handled, Timer, TimerHandler, TimerWorker};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::helpers::*;

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_lease_has_one_holder_and_passes_on_when_its_holder_goes() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let mut first = app.pool.get().await.expect("client");
    let mut second = app.pool.get().await.expect("client");
    let lease = LeaseName::new("test-lease");
    let held = Lease::acquire(&mut first, &lease).await.expect("acquires").expect("free");
    assert!(Lease::acquire(&mut second, &lease).await.expect("asks").is_none(), "one holder at a time");
    held.commit(42).await.expect("commits");
    let taken = Lease::acquire(&mut second, &lease).await.expect("asks").expect("free again");
    assert_eq!(taken.checkpoint, 42, "the checkpoint committed with the step");
    // A holder that goes away (its transaction dropped, as when its process dies) releases
    // the lease, and nothing it did is kept.
    drop(taken);
    drop(second);
    let mut third = app.pool.get().await.expect("client");
    let taken = Lease::acquire(&mut third, &lease).await.expect("asks").expect("released");
    assert_eq!(taken.checkpoint, 42);
}

/// A worker that fails its first `failures` steps, then counts successful ones.
struct Flaky {
    failures: usize,
    steps: AtomicUsize,
    channel: &'static [&'static str],
}

impl Worker for Flaky {
    fn name(&self) -> String {
        "flaky".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        self.channel
    }

    fn poll_interval(&self) -> Duration {
        // Long: a wake-up must come from a notification.
        Duration::from_secs(600)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(async {
            let step = self.steps.fetch_add(1, Ordering::SeqCst);
            if step < self.failures { anyhow::bail!("failure {step}") } else { Ok(Outcome::Idle) }
        })
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}

#[tokio::test]
async fn a_failing_worker_backs_off_reports_it_recovers_and_wakes_on_notify() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let flaky = Arc::new(Flaky { failures: 3, steps: AtomicUsize::new(0), channel: &["test_wake"] });
    let runtime = Runtime::new(app.database_url.clone(), vec![flaky.clone()]);
    let health = runtime.health();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(runtime.run(shutdown.clone()));
    // Three failures, each followed by a backoff, then a success that clears the failure.
    eventually("the worker recovers", async || {
        health.snapshot().get("flaky").is_some_and(|h| h.failures == 3 && h.failing_since.is_none())
    })
    .await;
    let recovered = health.snapshot()["flaky"].clone();
    assert_eq!(recovered.last_error.as_deref(), Some("failure 2"));
    assert!(recovered.last_success_at.is_some());
    // Idle now (the listener's connection announcement may have woken it once more).
    let mut steps = flaky.steps.load(Ordering::SeqCst);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = flaky.steps.load(Ordering::SeqCst);
        if now == steps {
            break;
        }
        steps = now;
    }
    assert!((4..=5).contains(&steps), "{steps} steps");
    // Idle with a ten-minute poll: only a notification wakes it.
    let client = app.pool.get().await.expect("client");
    client.execute("SELECT pg_notify('test_wake', '')", &[]).await.expect("notify");
    eventually("a notification wakes the worker", async || flaky.steps.load(Ordering::SeqCst) > steps).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), running).await.expect("stops on shutdown").expect("joins");
}

/// A worker that records when each of its steps started, with a spacing of its own.
struct Spaced {
    spacing: Duration,
    starts: std::sync::Mutex<Vec<Instant>>,
}

impl Worker for Spaced {
    fn name(&self) -> String {
        "spaced".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &["test_spaced"]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_secs(600)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(async {
            self.starts.lock().expect("starts").push(Instant::now());
            Ok(Outcome::Idle)
        })
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }

    fn spacing(&self) -> Duration {
        self.spacing
    }
}

/// A worker with a spacing, woken by a run of notifications, takes them in a few steps at
/// least its spacing apart; the first notification after a quiet spell wakes it at once.
#[tokio::test]
async fn a_spaced_worker_takes_a_run_of_wake_ups_in_steps_its_spacing_apart() {
    const SPACING: Duration = Duration::from_millis(300);
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let spaced = Arc::new(Spaced { spacing: SPACING, starts: std::sync::Mutex::default() });
    let runtime = Runtime::new(app.database_url.clone(), vec![spaced.clone()]);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(runtime.run(shutdown.clone()));
    let steps = || spaced.starts.lock().expect("starts").clone();
    // The first step, and the listener's announcement once it listens; then a quiet spell.
    eventually("the worker has stepped", async || !steps().is_empty()).await;
    tokio::time::sleep(SPACING * 3).await;
    let before = steps().len();
    let client = app.pool.get().await.expect("client");
    let first = Instant::now();
    for _ in 0..20 {
        client.execute("SELECT pg_notify('test_spaced', '')", &[]).await.expect("notify");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let last = Instant::now();
    tokio::time::sleep(SPACING * 3).await;
    let woken: Vec<Instant> = steps().split_off(before);
    assert!(!woken.is_empty(), "the notifications woke it");
    assert!(woken[0] < first + SPACING, "the first wake-up after a quiet spell steps at once");
    for pair in woken.windows(2) {
        assert!(pair[1] - pair[0] >= SPACING - Duration::from_millis(5), "{:?} apart", pair[1] - pair[0]);
    }
    let allowed = ((last - first).as_millis() / SPACING.as_millis()) as usize + 2;
    assert!(woken.len() <= allowed, "{} steps for 20 wake-ups over {:?}", woken.len(), last - first);
    assert!(*woken.last().expect("a step") > last - SPACING, "the last wake-up was taken");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), running).await.expect("stops on shutdown").expect("joins");
}

/// A worker that records how many steps of its lane run at the same moment.
struct Busy {
    name: &'static str,
    lane: Option<&'static str>,
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    steps: AtomicUsize,
}

impl Worker for Busy {
    fn name(&self) -> String {
        self.name.to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn step(&self) -> BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(async {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.running.fetch_sub(1, Ordering::SeqCst);
            self.steps.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Progressed)
        })
    }

    fn lag(&self) -> BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }

    fn lane(&self) -> Option<&'static str> {
        self.lane
    }
}

/// Runs three always-busy workers for a moment; returns the most steps that overlapped and
/// each worker's step count.
async fn overlap(app: &TestApp, lane: Option<&'static str>) -> (usize, Vec<usize>) {
    let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<Arc<Busy>> = ["a", "b", "c"]
        .into_iter()
        .map(|name| {
            Arc::new(Busy { name, lane, running: running.clone(), most: most.clone(), steps: AtomicUsize::new(0) })
        })
        .collect();
    let runtime =
        Runtime::new(app.database_url.clone(), workers.iter().map(|w| w.clone() as Arc<dyn Worker>).collect());
    let shutdown = CancellationToken::new();
    let running_task = tokio::spawn(runtime.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(400)).await;
    shutdown.cancel();
    running_task.await.expect("stops");
    (most.load(Ordering::SeqCst), workers.iter().map(|w| w.steps.load(Ordering::SeqCst)).collect())
}

#[tokio::test]
async fn workers_of_one_lane_take_turns_and_none_starves() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let (most, steps) = overlap(&app, Some("test_lane")).await;
    assert_eq!(most, 1, "one step of a lane at a time");
    assert!(steps.iter().all(|&n| n >= 5), "each worker of the lane gets turns: {steps:?}");
    // Without a lane the same workers overlap (so the check above can fail).
    let (most, _) = overlap(&app, None).await;
    assert!(most > 1, "workers without a lane step concurrently");
}

/// A handler that fails each key's first attempt, and counts how often each key ran.
struct Deliveries {
    runs: std::sync::Mutex<Vec<String>>,
}

impl TimerHandler for Deliveries {
    fn kind(&self) -> &'static str {
        "test_delivery"
    }

    fn handle<'a>(
        &'a self,
        transaction: &'a deadpool_postgres::Transaction<'a>,
        timer: &'a Timer,
    ) -> BoxFuture<'a, anyhow::Result<Handled>> {
        Box::pin(async move {
            self.runs.lock().expect("lock").push(timer.key.clone());
            if timer.attempts == 0 {
                return Ok(Handled::RetryAt(chrono::Utc::now()));
            }
            // The effect commits with the timer's completion.
            transaction
                .execute("INSERT INTO worker_checkpoints (name) VALUES ($1)", &[&format!("delivered:{}", timer.key)])
                .await?;
            Ok(Handled::Done)
        })
    }
}

#[tokio::test]
async fn due_timers_run_once_each_across_processes_and_retry_after_a_failure() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let client = app.pool.get().await.expect("client");
    let now = chrono::Utc::now();
    for index in 0..40 {
        projector::timers::schedule(&client, "test_delivery", &format!("k{index}"), now, &json!({"n": index}))
            .await
            .expect("schedules");
    }
    // Scheduling the same key again keeps one timer.
    projector::timers::schedule(&client, "test_delivery", "k0", now, &json!({"n": 0})).await.expect("schedules");
    let later = now + chrono::Duration::hours(1);
    projector::timers::schedule(&client, "test_delivery", "later", later, &json!({})).await.expect("schedules");
    // Two runtimes stand for two processes.
    let handlers: Vec<Arc<Deliveries>> =
        (0..2).map(|_| Arc::new(Deliveries { runs: std::sync::Mutex::new(Vec::new()) })).collect();
    let shutdown = CancellationToken::new();
    let mut running = Vec::new();
    for handler in &handlers {
        let worker = Arc::new(TimerWorker::new(app.pool.clone(), handler.clone()));
        let runtime = Runtime::new(app.database_url.clone(), vec![worker]);
        running.push(tokio::spawn(runtime.run(shutdown.clone())));
    }
    eventually("every due timer is delivered", async || {
        app.query_i64("SELECT count(*) FROM worker_checkpoints WHERE name LIKE 'delivered:%'").await == 40
    })
    .await;
    let mut runs: Vec<String> = handlers.iter().flat_map(|h| h.runs.lock().expect("lock").clone()).collect();
    runs.sort();
    let mut expected: Vec<String> = (0..40).flat_map(|i| [format!("k{i}"), format!("k{i}")]).collect();
    expected.sort();
    assert_eq!(runs, expected, "each timer ran exactly twice: the failed attempt and the retry");
    assert_eq!(
        app.query_i64("SELECT count(*) FROM timers WHERE kind = 'test_delivery'").await,
        1,
        "only `later` is left"
    );
    shutdown.cancel();
    for task in running {
        task.await.expect("stops");
    }
}

#[tokio::test]
async fn a_claim_dies_with_its_transaction_and_another_process_runs_the_timer() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let client = app.pool.get().await.expect("client");
    projector::timers::schedule(&client, "test_delivery", "once", chrono::Utc::now(), &json!({}))
        .await
        .expect("schedules");
    let mut holder = app.pool.get().await.expect("client");
    let claim = holder.transaction().await.expect("begins");
    let claimed = projector::timers::claim_due(&claim, "test_delivery", 10).await.expect("claims");
    assert_eq!(claimed.len(), 1);
    let mut other = app.pool.get().await.expect("client");
    let second = other.transaction().await.expect("begins");
    assert!(projector::timers::claim_due(&second, "test_delivery", 10).await.expect("asks").is_empty(), "skipped");
    drop(second);
    // The claimant dies mid-claim: nothing it did stays, and the timer is free again (once
    // its rollback, sent on drop, has reached the server).
    drop(claim);
    drop(holder);
    let mut claimed_again = 0;
    for _ in 0..100 {
        let third = other.transaction().await.expect("begins");
        claimed_again = projector::timers::claim_due(&third, "test_delivery", 10).await.expect("claims").len();
        if claimed_again == 1 {
            break;
        }
        drop(third);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(claimed_again, 1);
}

#[tokio::test]
async fn a_process_runs_only_the_workers_it_is_configured_for() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let models_only = spawn_binary(
        "projector",
        &["run"],
        &app.database_url,
        &[("APP__PROJECTOR__WORKERS", "read_models".to_owned())],
    );
    // Read models follow the log ...
    let created = app.create_contact(&json!({"email": "split@example.com"})).await;
    let id = created["id"].as_str().expect("id").to_owned();
    eventually("the read models project the write", async || {
        app.get(&format!("/schemas/contacts/records/{id}"), ALPHA_ADMIN).await.status == 200
    })
    .await;
    // ... but no eraser runs in that process: a deletion stays pending ...
    let deleted = app
        .send(app.request(reqwest::Method::DELETE, &format!("/schemas/contacts/records/{id}"), Some(ALPHA_ADMIN)))
        .await;
    let operation = deleted.body["data"]["operationId"].as_str().expect("operationId").to_owned();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let erased =
        format!("SELECT count(*) FROM record_deletions WHERE operation_id = '{operation}' AND state = 'completed'");
    assert_eq!(app.query_i64(&erased).await, 0);
    // ... until a process that runs it starts.
    let _side_effects = spawn_binary(
        "projector",
        &["run"],
        &app.database_url,
        &[("APP__PROJECTOR__WORKERS", "eraser,preparation,maintenance".to_owned())],
    );
    eventually("the eraser completes the deletion", async || app.query_i64(&erased).await == 1).await;
    drop(models_only);
    let unknown = std::process::Command::new(binaries_dir().join("projector"))
        .arg("run")
        .env("APP__DATABASE__URL", &app.database_url)
        .env("APP__MASTER_KEY", platform::crypto::TEST_MASTER_KEY)
        .env("APP__PROJECTOR__PORT", "0")
        .env("APP__PROJECTOR__WORKERS", "read_models,nonsense")
        .output()
        .expect("runs");
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("nonsense"));
}

/// The rows of `keys` (text) that the share `(index, of)` holds, by `Share::holds`.
async fn held(app: &TestApp, keys: i64, index: i32, of: i32) -> Vec<String> {
    let client = app.pool.get().await.expect("client");
    let sql = format!(
        "SELECT k FROM (SELECT 'run_' || n AS k FROM generate_series(1, $1::bigint) n) keys WHERE {} ORDER BY k",
        platform::liveness::Share::holds("k", "$2", "$3")
    );
    client.query(&sql, &[&keys, &index, &of]).await.expect("held").into_iter().map(|row| row.get(0)).collect()
}

/// An app without a projector, and this test's process beating as a projector does, once its
/// first beat is in.
async fn beating_app() -> (TestApp, platform::liveness::Beat) {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let beat = platform::liveness::Beat::start(app.database_url.clone(), "test");
    let me = beat.id();
    eventually("this process's first beat", async || {
        app.query_i64(&format!("SELECT count(*) FROM process_beats WHERE process_id = '{me}'")).await == 1
    })
    .await;
    (app, beat)
}

#[tokio::test]
async fn a_shared_worker_splits_its_rows_among_the_live_members_and_a_dead_ones_go_to_the_others() {
    let (app, beat) = beating_app().await;
    let me = beat.id();
    let client = app.pool.get().await.expect("client");
    let share = async |client: &deadpool_postgres::Client| {
        platform::liveness::Share::read(client, "shared").await.expect("share")
    };
    assert_eq!(share(&client).await, platform::liveness::Share { index: 0, of: 1 }, "alone: every row");

    // Another member that beats, and one whose last beat is older than the dead-after bound;
    // a process that beats but is not a member of this worker counts for nothing.
    let (other, dead, stranger) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    client
        .execute(
            "INSERT INTO process_beats (process_id, role, beat_at) VALUES ($1, 'test', now()),
                 ($2, 'test', now() - interval '6 seconds'), ($3, 'test', now())",
            &[&other, &dead, &stranger],
        )
        .await
        .expect("beats");
    client
        .execute(
            "INSERT INTO worker_members (worker, process_id) VALUES ('shared', $1), ('shared', $2)",
            &[&other, &dead],
        )
        .await
        .expect("members");
    let two = share(&client).await;
    assert_eq!(two, platform::liveness::Share { index: i32::from(other < me), of: 2 }, "by the order of ids");

    // The two live members' shares hold every row once, and neither is empty.
    let (first, second) = (held(&app, 1000, 0, 2).await, held(&app, 1000, 1, 2).await);
    assert!(!first.is_empty() && !second.is_empty(), "{} and {}", first.len(), second.len());
    assert_eq!(first.len() + second.len(), 1000);
    assert!(first.iter().all(|key| !second.contains(key)), "no row is held twice");
    assert_eq!(held(&app, 1000, 0, 1).await.len(), 1000, "one member holds every row");

    // The other member stops beating: once its beat is older than the bound, its rows are
    // this process's again.
    client
        .execute("UPDATE process_beats SET beat_at = now() - interval '6 seconds' WHERE process_id = $1", &[&other])
        .await
        .expect("stale");
    assert_eq!(share(&client).await, platform::liveness::Share { index: 0, of: 1 });
    drop(beat);
}

/// Whether the process `id` is presumed dead, by `liveness::is_dead` and `DEAD_AFTER`.
async fn presumed_dead(client: &deadpool_postgres::Client, id: uuid::Uuid) -> bool {
    let sql = format!("SELECT {}", platform::liveness::is_dead("$1::uuid", "$2"));
    let dead_after = platform::liveness::DEAD_AFTER.as_secs_f64();
    client.query_one(&sql, &[&id, &dead_after]).await.expect("liveness").get(0)
}

#[tokio::test]
async fn a_process_that_beat_until_the_database_went_away_is_not_presumed_dead_when_it_comes_back() {
    let (app, beat) = beating_app().await;
    let me = beat.id();
    let client = app.pool.get().await.expect("client");
    // The database was away for 8 s, and another process beat last as it went: nobody could
    // beat since, so the clock stands where that beat read it.
    let other = uuid::Uuid::now_v7();
    let reading: f64 = client
        .query_one(
            "WITH away AS (UPDATE beat_clock SET ticked_at = now() - interval '8 seconds' RETURNING available)
             INSERT INTO process_beats (process_id, role, beat_at, available_at)
             SELECT $1, 'test', now() - interval '8 seconds', available FROM away
             RETURNING available_at",
            &[&other],
        )
        .await
        .expect("the other process's last beat")
        .get(0);
    let back = Instant::now();
    // This process beats on. Each sample reads the clock and the verdict together: the clock
    // moves by at most one step beyond the time that passed (not by the 8 s the database was
    // away), and the other process is presumed dead exactly when the clock has moved the
    // bound past its last beat; the first samples after a beat see it alive.
    let (step, dead_after) =
        (platform::liveness::CLOCK_STEP.as_secs_f64(), platform::liveness::DEAD_AFTER.as_secs_f64());
    let sql = format!("SELECT c.available, {} FROM beat_clock c", platform::liveness::is_dead("$1::uuid", "$2"));
    let mut alive_after_a_beat = false;
    loop {
        let row = client.query_one(&sql, &[&other, &dead_after]).await.expect("the clock and the verdict");
        let (moved, dead) = (row.get::<_, f64>(0) - reading, row.get::<_, bool>(1));
        assert!(moved <= step + back.elapsed().as_secs_f64() + 0.05, "the clock moved {moved} s");
        assert_eq!(dead, moved >= dead_after, "the verdict with the clock {moved} s past its last beat");
        alive_after_a_beat |= moved > 0.0 && !dead;
        if dead {
            break;
        }
        assert!(back.elapsed() < Duration::from_secs(20), "never presumed dead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(alive_after_a_beat, "8 s old by the wall, but alive after the database came back");
    // A process this one beat beside all along stays alive.
    assert!(!presumed_dead(&client, me).await);
    drop(beat);
}
