//! Test support: a fresh database per test (cloned from a migrated template), the services
//! started in-process on port 0, and one method per kind of request.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
use platform::settings::Settings;
use reqwest::header::HeaderMap;
use serde_json::Value;

pub(crate) const ALPHA_ADMIN: &str = "sk_test_alpha_admin_00000000000001";
pub(crate) const ALPHA_ADMIN_SECOND: &str = "sk_test_alpha_admin_00000000000002";
pub(crate) const ALPHA_REVOKED: &str = "sk_test_alpha_revoked_000000000003";
pub(crate) const ALPHA_MEMBER: &str = "sk_test_alpha_member_0000000000004";
pub(crate) const ALPHA_NON_PAID_ADMIN: &str = "sk_test_alpha_npa_000000000000005";
pub(crate) const MULTI_UNBOUND: &str = "sk_test_multi_unbound_00000000006";
pub(crate) const MULTI_BETA: &str = "sk_test_multi_beta_0000000000007";
pub(crate) const SOLO_UNBOUND: &str = "sk_test_solo_unbound_000000000008";
pub(crate) const NOBODY_UNBOUND: &str = "sk_test_nobody_unbound_0000000009";
pub(crate) const NOBODY_BOUND: &str = "sk_test_nobody_bound_000000000010";

pub(crate) const WORKSPACE: &str = include_str!("../../fixtures/workspace.json");

fn admin_url(dbname: &str) -> String {
    let host = std::env::var("TEST_DATABASE_HOST").unwrap_or_else(|_| "127.0.0.1".into());
    let port = std::env::var("TEST_DATABASE_PORT")
        .expect("TEST_DATABASE_PORT is not set: run the tests with scripts/test, which starts PostgreSQL");
    format!("host={host} port={port} user=postgres dbname={dbname}")
}

/// The URL of `database_url`'s database on the hot standby that scripts/test starts beside
/// the cluster (streaming from it; `TEST_REPLICA_PORT`).
pub(crate) fn on_replica(database_url: &str) -> String {
    let replica = std::env::var("TEST_REPLICA_PORT")
        .expect("TEST_REPLICA_PORT is not set: run the tests with scripts/test, which starts a streaming replica");
    let primary = std::env::var("TEST_DATABASE_PORT").expect("TEST_DATABASE_PORT");
    database_url.replace(&format!("port={primary}"), &format!("port={replica}"))
}

/// Whether every test app's query service reads from the standby (`TEST_QUERY_ON_REPLICA`,
/// set by scripts/test for its second pass over the read-your-writes, consistency and
/// pagination tests).
pub(crate) fn queries_on_replica() -> bool {
    std::env::var("TEST_QUERY_ON_REPLICA").is_ok()
}

/// Waits until the standby at `replica_url` has replayed everything the primary (`pool`) has
/// written so far: up to its WAL insert position (with `synchronous_commit=off`, as the test
/// cluster runs, a commit can be acknowledged before its WAL is written, so the write
/// position, `pg_current_wal_lsn`, can be short of it).
pub(crate) async fn wait_for_replay(pool: &Pool, replica_url: &str) {
    let target: String = pool
        .get()
        .await
        .expect("client")
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .expect("the primary's WAL position")
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((client, connection)) = tokio_postgres::connect(replica_url, tokio_postgres::NoTls).await {
            tokio::spawn(connection);
            let replayed = client
                .query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&target])
                .await
                .map(|row| row.get::<_, bool>(0));
            if matches!(replayed, Ok(true)) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the standby did not replay up to {target}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A fresh database cloned from the migrated template.
pub(crate) async fn create_database() -> String {
    let name = format!("t_{}", uuid::Uuid::now_v7().simple());
    let (client, connection) =
        tokio_postgres::connect(&admin_url("postgres"), tokio_postgres::NoTls).await.expect("connect as admin");
    tokio::spawn(connection);
    // FILE_COPY copies the template's files; the default (WAL_LOG) writes all of it to the WAL,
    // which costs twice the time and makes the streaming replica replay every test's copy.
    client
        .batch_execute(&format!("CREATE DATABASE {name} TEMPLATE app_template STRATEGY FILE_COPY"))
        .await
        .expect("clone template");
    admin_url(&name)
}

/// The directory holding the built binaries (`target/debug`).
pub(crate) fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent().and_then(|deps| deps.parent()).expect("target directory").to_path_buf()
}

/// A child process killed when dropped.
pub(crate) struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The log filter of the processes a test starts: `TEST_LOG` shows their output, and a value
/// other than `1` is their filter (`TEST_LOG=info,projector=debug`); `warn` otherwise.
fn child_log_filter() -> String {
    match std::env::var("TEST_LOG") {
        Ok(filter) if filter != "1" => filter,
        _ => "warn".to_owned(),
    }
}

/// One of the built binaries with the database URL, the test master key, the children's log
/// filter and extra environment.
fn binary_command(name: &str, args: &[&str], database_url: &str, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(binaries_dir().join(name));
    command
        .args(args)
        .env("APP__DATABASE__URL", database_url)
        .env("APP__MASTER_KEY", platform::crypto::TEST_MASTER_KEY)
        .env("RUST_LOG", child_log_filter())
        .env("APP__PROJECTOR__PORT", "0")
        .env("APP__RATE_LIMITS__READ_PER_SECOND", "1000000")
        .env("APP__RATE_LIMITS__WRITE_PER_SECOND", "1000000");
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// Starts one of the built binaries with the database URL and extra environment.
pub(crate) fn spawn_binary(name: &str, args: &[&str], database_url: &str, env: &[(&str, String)]) -> ChildGuard {
    let mut command = binary_command(name, args, database_url, env);
    if std::env::var("TEST_LOG").is_err() {
        command.stdout(Stdio::null()).stderr(Stdio::null());
    }
    ChildGuard(command.spawn().unwrap_or_else(|error| panic!("starting {name}: {error}")))
}

/// [`spawn_binary`] with its output kept in a file (its `warn` and worse, or what `TEST_LOG`
/// asks for), for a test to show when it fails: the child and the file.
pub(crate) fn spawn_binary_logged(
    name: &str,
    args: &[&str],
    database_url: &str,
    env: &[(&str, String)],
) -> (ChildGuard, PathBuf) {
    let path = std::env::temp_dir().join(format!("{name}-{}.log", uuid::Uuid::new_v4().simple()));
    let log = std::fs::File::create(&path).unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
    let stderr = log.try_clone().unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut command = binary_command(name, args, database_url, env);
    command.stdout(Stdio::from(log)).stderr(Stdio::from(stderr));
    (ChildGuard(command.spawn().unwrap_or_else(|error| panic!("starting {name}: {error}"))), path)
}

/// The last `lines` lines of a log file (for a failure's message).
pub(crate) fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|error| format!("({}: {error})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs one of the built binaries to its end against `database_url` (a command such as
/// `projector migrate` or `command-service apply`), with the test master key.
pub(crate) fn run_binary(name: &str, args: &[&str], database_url: &str) -> std::process::Output {
    Command::new(binaries_dir().join(name))
        .args(args)
        .env("APP__DATABASE__URL", database_url)
        .env("APP__MASTER_KEY", platform::crypto::TEST_MASTER_KEY)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|error| panic!("running {name}: {error}"))
}

/// Starts `count` instances of a server binary on free ports with `env` and waits until each
/// answers; returns the processes (killed when dropped) and their base URLs.
pub(crate) async fn spawn_servers(
    app: &TestApp,
    name: &str,
    args: &[&str],
    count: usize,
    env: &[(&str, String)],
) -> (Vec<ChildGuard>, Vec<String>) {
    let mut processes = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..count {
        let port = free_port();
        let mut env = env.to_vec();
        env.push(("APP__HTTP__PORT", port.to_string()));
        if let (Some(replica), "query-service") = (&app.replica_url, name) {
            env.push(("APP__DATABASE__READ_URL", replica.clone()));
        }
        processes.push(spawn_binary(name, args, &app.database_url, &env));
        urls.push(format!("http://127.0.0.1:{port}/v1"));
    }
    for url in &urls {
        for attempt in 0.. {
            if app.http.get(format!("{url}/me")).send().await.is_ok() {
                break;
            }
            assert!(attempt < 200, "{url} did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (processes, urls)
}

/// A port for a process the test starts, free when chosen: below the kernel's range of
/// ephemeral ports, where no `bind` to port 0 and no outgoing connection is given it in the
/// moment before the process binds it (a projector's operations endpoint, bound to port 0,
/// once took a command service's port chosen by binding 0 and answered its requests 404),
/// and never the same twice in one test process.
pub(crate) fn free_port() -> u16 {
    use rand::Rng;
    static HANDED: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let top = ephemeral.saturating_sub(1).max(20_100);
    let mut handed = HANDED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut rng = rand::rng();
    for _ in 0..10_000 {
        let port = rng.random_range(20_000..=top);
        if !handed.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed.push(port);
            return port;
        }
    }
    panic!("no free port between 20000 and {top}")
}

#[derive(Debug)]
pub(crate) struct TestResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl TestResponse {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    pub(crate) fn code(&self) -> &Value {
        &self.body["error"]["code"]
    }
}

pub(crate) struct TestApp {
    pub database_url: String,
    pub pool: Pool,
    pub command_url: String,
    pub query_url: String,
    pub http: reqwest::Client,
    /// The standby the query service reads from, when it reads from one.
    pub replica_url: Option<String>,
    /// Stops the in-process workers when the test ends.
    _projector: ShutdownOnDrop,
}

/// A read model held back by [`TestApp::pause_read_model`]; dropping it resumes the model too.
pub(crate) struct PausedReadModel {
    release: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl PausedReadModel {
    /// Lets the projector apply the read model again (once the lock is gone).
    pub(crate) async fn resume(mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("the pausing task");
        }
    }
}

impl Drop for PausedReadModel {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
    }
}

/// Cancels a shutdown token when dropped.
pub(crate) struct ShutdownOnDrop(pub tokio_util::sync::CancellationToken);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The read model named `name`.
pub(crate) fn read_model(name: &str) -> &'static dyn projector::read_models::ReadModel {
    projector::read_models::by_name(name).unwrap_or_else(|| panic!("no read model {name}"))
}

#[derive(Clone)]
pub(crate) struct Options {
    /// Run the projector in-process.
    pub projector: bool,
    /// Request buckets; `None` raises them far above what any test sends.
    pub limits: Option<platform::settings::RateLimits>,
    /// How long a record deletion waits for projections before it is `blocked` (60 s).
    pub erasure_blocked_after: Option<Duration>,
    /// Event admission; `None` raises it far above what any test sends.
    pub admission: Option<platform::settings::AdmissionLimits>,
    /// The AI provider of the preparation worker (the deterministic one by default).
    pub ai: Option<platform::settings::AiSettings>,
    /// How long a read waits for read-your-writes (3 s by default).
    pub consistency_wait: Option<Duration>,
    /// Webhook delivery; `None`: [`test_webhooks`].
    pub webhooks: Option<platform::settings::WebhookSettings>,
    /// Email sending; `None`: `.eml` files in a folder of the test's own.
    pub email: Option<platform::settings::EmailSettings>,
    /// Any other change to the settings, applied last.
    pub tweak: Option<fn(&mut Settings)>,
    /// The query service reads from the streaming replica (`APP__DATABASE__READ_URL`); by
    /// default when `TEST_QUERY_ON_REPLICA` is set.
    pub query_on_replica: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            projector: true,
            limits: None,
            erasure_blocked_after: None,
            admission: None,
            ai: None,
            consistency_wait: None,
            webhooks: None,
            email: None,
            tweak: None,
            query_on_replica: queries_on_replica(),
        }
    }
}

impl Options {
    pub(crate) fn without_projector() -> Self {
        Self { projector: false, ..Self::default() }
    }
}

/// Event admission far above what any test sends, for tests that are not about admission.
pub(crate) fn unlimited_admission() -> platform::settings::AdmissionLimits {
    let open =
        platform::settings::ScopeLimits { rate: 1e6, burst: 1e6, pending: 1_000_000_000, receipts: 1_000_000_000 };
    platform::settings::AdmissionLimits { fleet: open, space: open, schema: open }
}

/// Webhook delivery for tests: loopback receivers allowed, retries after 100, 200, 400 ms.
pub(crate) fn test_webhooks() -> platform::settings::WebhookSettings {
    platform::settings::WebhookSettings {
        allow_loopback: true,
        attempt_timeout_ms: 5_000,
        retry_schedule_ms: vec![100, 200, 400],
        ..Default::default()
    }
}

/// Limits far above what any test sends, for tests that are not about rate limits.
pub(crate) fn unlimited() -> platform::settings::RateLimits {
    platform::settings::RateLimits {
        read_per_second: 1_000_000,
        write_per_second: 1_000_000,
        ai_per_minute: 1_000_000,
        ingest_per_second: 1_000_000,
        test_sends_per_minute: 1_000_000,
        ..Default::default()
    }
}

impl TestApp {
    pub(crate) async fn spawn() -> Self {
        Self::spawn_with(Options::default()).await
    }

    pub(crate) async fn spawn_with(options: Options) -> Self {
        if std::env::var("TEST_LOG").is_ok() {
            platform::telemetry::init(&Default::default(), "info");
        }
        let database_url = create_database().await;
        let mut settings = Settings::for_database(&database_url);
        platform::crypto::install(settings.keyring().expect("the test master key"));
        settings.rate_limits = options.limits.unwrap_or_else(unlimited);
        settings.events.admission = options.admission.unwrap_or_else(unlimited_admission);
        if let Some(ai) = options.ai.clone() {
            settings.ai = ai;
        }
        settings.webhooks = options.webhooks.clone().unwrap_or_else(test_webhooks);
        settings.email = options.email.clone().unwrap_or_else(|| platform::settings::EmailSettings {
            eml_dir: std::env::temp_dir().join(format!("eml-{}", uuid::Uuid::now_v7().simple())).display().to_string(),
            ..Default::default()
        });
        if let Some(wait) = options.consistency_wait {
            settings.reads.consistency_wait_millis = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        }
        if let Some(tweak) = options.tweak {
            tweak(&mut settings);
        }
        let pool = platform::db::pool(&database_url, 8).expect("pool");
        if let Some(blocked_after) = options.erasure_blocked_after {
            settings.erasure.blocked_after_millis = u64::try_from(blocked_after.as_millis()).unwrap_or(u64::MAX);
        }
        let shutdown = tokio_util::sync::CancellationToken::new();
        if options.projector {
            let projector_pool = platform::db::pool(&database_url, projector::POOL_SIZE).expect("pool");
            let provider = ai_provider::AiProvider::new(&settings.ai).expect("AI provider");
            let workers =
                projector::workers(&settings, &projector_pool, provider, "test-projector").expect("the workers");
            let runtime = projector::runtime::Runtime::new(database_url.clone(), workers);
            tokio::spawn(runtime.run(shutdown.clone()));
        }
        let command = command_service::Application::build(settings.clone()).await.expect("command service");
        let replica_url = options.query_on_replica.then(|| on_replica(&database_url));
        if let Some(replica) = &replica_url {
            // The new database reaches the standby when it has replayed its creation.
            wait_for_replay(&pool, replica).await;
            settings.database.read_url = Some(replica.clone().into());
        }
        let query = query_service::Application::build(settings).await.expect("query service");
        let command_url = format!("http://127.0.0.1:{}/v1", command.port());
        let query_url = format!("http://127.0.0.1:{}/v1", query.port());
        tokio::spawn(command.run_until_stopped());
        tokio::spawn(query.run_until_stopped());
        let app = Self {
            database_url,
            pool,
            command_url,
            query_url,
            http: reqwest::Client::new(),
            replica_url,
            _projector: ShutdownOnDrop(shutdown),
        };
        app.apply_workspace(WORKSPACE, options.projector).await;
        if !options.projector {
            app.catch_up_once().await;
        }
        app.wait_for_standby().await;
        app
    }

    /// Projects every live read model to the head of the log once, in this process.
    pub(crate) async fn catch_up_once(&self) {
        use projector::read_models::runner::{Faults, Outcome, project_batch};
        let faults = Faults::default();
        for model in projector::read_models::ALL {
            loop {
                let outcome = project_batch(&self.pool, model, 1, "test-catch-up", &faults).await.expect("projects");
                match outcome {
                    Outcome::Projected { .. } => continue,
                    Outcome::CaughtUp { .. } => break,
                    Outcome::Busy => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }
    }

    /// Holds the checkpoint rows of read model `name` locked, so no projector applies anything
    /// to it (its lease is taken) until the returned guard is resumed or dropped: a read model
    /// as far behind the log as a test wants.
    pub(crate) async fn pause_read_model(&self, name: &str) -> PausedReadModel {
        let (pool, name) = (self.pool.clone(), name.to_owned());
        let (locked, is_locked) = tokio::sync::oneshot::channel();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut client = pool.get().await.expect("client");
            let transaction = client.transaction().await.expect("transaction");
            transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await.expect("no timeout");
            transaction
                .query("SELECT 1 FROM projections WHERE name = $1 FOR UPDATE", &[&name])
                .await
                .expect("the checkpoint rows locked");
            let _ = locked.send(());
            let _ = released.await;
            transaction.rollback().await.expect("released");
        });
        is_locked.await.expect("the read model paused");
        PausedReadModel { release: Some(release), task: Some(task) }
    }

    /// Makes background work see an API server serving 1,000 requests a second (`live_load`),
    /// its row kept fresh for an hour.
    pub(crate) async fn publish_busy_live_load(&self) {
        let client = self.pool.get().await.expect("client");
        client
            .execute(
                "INSERT INTO live_load (instance, at, per_second) VALUES ('proc_busy', now() + interval '1 hour', 1000)",
                &[],
            )
            .await
            .expect("a busy server");
    }

    /// Waits (20 s at most) until `sql`, a count, finds something; `what` names it if not.
    pub(crate) async fn wait_for_count(&self, sql: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.query_i64(sql).await == 0 {
            assert!(Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A fault proxy in front of the app's database, and the database URL through it (for a
    /// process of its own whose database a test cuts or holds).
    pub(crate) async fn database_behind_proxy(&self) -> (crate::fault_proxy::FaultProxy, String) {
        let cluster_port: u16 = self
            .database_url
            .split_whitespace()
            .find_map(|part| part.strip_prefix("port="))
            .and_then(|port| port.parse().ok())
            .expect("the cluster's port");
        let proxy = crate::fault_proxy::FaultProxy::start(cluster_port).await;
        let proxied = self.database_url.replace(&format!("port={cluster_port}"), &format!("port={}", proxy.port()));
        (proxy, proxied)
    }

    /// A command service of its own process whose database sits behind a fault proxy, with
    /// `env` besides its port: the process, its base URL and the proxy.
    pub(crate) async fn command_service_behind_proxy(
        &self,
        env: &[(&str, String)],
    ) -> (ChildGuard, String, crate::fault_proxy::FaultProxy) {
        let (proxy, proxied) = self.database_behind_proxy().await;
        let port = free_port();
        let mut env = env.to_vec();
        env.push(("APP__HTTP__PORT", port.to_string()));
        let instance = spawn_binary("command-service", &["serve"], &proxied, &env);
        let url = format!("http://127.0.0.1:{port}/v1");
        crate::log::wait_until_listening(&self.http, &url).await;
        (instance, url, proxy)
    }

    pub(crate) async fn query_i64(&self, sql: &str) -> i64 {
        let client = self.pool.get().await.expect("client");
        client.query_one(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {error}")).get(0)
    }

    /// The first column of every row of `sql`, as text.
    pub(crate) async fn query_strings(&self, sql: &str) -> Vec<String> {
        let client = self.pool.get().await.expect("client");
        let rows = client.query(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {error}"));
        rows.into_iter().map(|row| row.get(0)).collect()
    }

    /// The definitions of the indexes of version `version` of read model `name`, its schema's
    /// name replaced by `{s}`, sorted.
    pub(crate) async fn index_definitions(&self, name: &str, version: i32) -> Vec<String> {
        let schema = platform::readmodel::schema_name(name, version);
        let mut definitions: Vec<String> = self
            .query_strings(&format!("SELECT indexdef FROM pg_indexes WHERE schemaname = '{schema}'"))
            .await
            .into_iter()
            .map(|definition| definition.replace(&schema, "{s}"))
            .collect();
        definitions.sort();
        definitions
    }

    pub(crate) async fn query_string(&self, sql: &str) -> String {
        let client = self.pool.get().await.expect("client");
        client.query_one(sql, &[]).await.unwrap_or_else(|error| panic!("{sql}: {error}")).get(0)
    }

    /// Applies a workspace file and, when asked (a projector runs), waits for every read model.
    pub(crate) async fn apply_workspace(&self, text: &str, wait: bool) -> command_service::authoring::ApplyReport {
        let workspace = command_service::authoring::parse(text).expect("workspace parses");
        let event_log = platform::log::EventLog::start(self.pool.clone(), 16);
        // The test apps allow loopback webhook targets (their receivers listen there).
        let rules = command_service::authoring::Rules { allow_loopback_webhooks: true };
        let report = command_service::authoring::apply(&self.pool, &event_log, &workspace, rules).await.expect("apply");
        if wait {
            command_service::authoring::wait_for_catalog(&self.pool, report.position, Duration::from_secs(20))
                .await
                .expect("catalog catches up");
            // Every read model, not only the catalog: a test then reads others (broadcasts,
            // templates) with keys that wrote nothing, so no consistency token would wait.
            self.wait_for_projections().await;
        }
        report
    }

    fn url_for(&self, method: &reqwest::Method, path: &str) -> String {
        // As the split deployment routes: each operation to the tier the route table names
        // (GETs that write, such as confirmation and tracking links, go to the command
        // service); a path the table does not know by the method, GETs to the query service.
        let api_path = format!("/v1{}", path.split('?').next().unwrap_or_default());
        let read = match api::routes::find(method.as_str(), &api_path) {
            Some(operation) => operation.tier == api::routes::Tier::Query,
            None => method == reqwest::Method::GET,
        };
        let base = if read { &self.query_url } else { &self.command_url };
        format!("{base}{path}")
    }

    pub(crate) async fn send(&self, request: reqwest::RequestBuilder) -> TestResponse {
        let response = request.send().await.expect("request is sent");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.expect("body is read");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap_or(Value::Null) };
        TestResponse { status, headers, body }
    }

    pub(crate) fn request(&self, method: reqwest::Method, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let url = self.url_for(&method, path);
        let mut builder = self.http.request(method, url);
        if let Some(key) = key {
            builder = builder.bearer_auth(key);
        }
        builder
    }

    pub(crate) async fn get(&self, path: &str, key: &str) -> TestResponse {
        self.send(self.request(reqwest::Method::GET, path, Some(key))).await
    }

    /// `GET path` as `key`, consistent with `written` (a write's answer: its `Consistency-Token`).
    pub(crate) async fn get_after(&self, written: &TestResponse, path: &str, key: &str) -> TestResponse {
        let token = written.header("consistency-token").unwrap_or("0").to_owned();
        self.send(self.request(reqwest::Method::GET, path, Some(key)).header("Consistency-Token", token)).await
    }

    /// Applies the test workspace with `attribute` added to schema `slug` of alpha's space.
    pub(crate) async fn apply_with_attribute(&self, slug: &str, attribute: Value) {
        let mut workspace: Value = serde_json::from_str(WORKSPACE).expect("JSON");
        let schemas = workspace["spaces"][0]["schemas"].as_array_mut().expect("schemas");
        let schema = schemas.iter_mut().find(|schema| schema["slug"] == slug).expect("the schema");
        schema["attributes"].as_array_mut().expect("attributes").push(attribute);
        self.apply_workspace(&workspace.to_string(), true).await;
    }

    /// `POST /schemas/contacts/records` as alpha's admin under `Idempotency-Key: idempotency_key`.
    pub(crate) async fn create_with_key(&self, idempotency_key: &str, body: &Value) -> TestResponse {
        self.send(
            self.request(reqwest::Method::POST, "/schemas/contacts/records", Some(ALPHA_ADMIN))
                .header("Idempotency-Key", idempotency_key)
                .json(body),
        )
        .await
    }

    pub(crate) async fn post(&self, path: &str, key: &str, body: &Value) -> TestResponse {
        self.send(self.request(reqwest::Method::POST, path, Some(key)).json(body)).await
    }

    /// Creates a contact in alpha's `contacts` schema and returns its body.
    pub(crate) async fn create_contact(&self, body: &Value) -> Value {
        let response = self.post("/schemas/contacts/records", ALPHA_ADMIN, body).await;
        assert_eq!(response.status, 201, "create contact: {:?}", response.body);
        response.body["data"].clone()
    }

    /// Waits until the opens and clicks taken in are in the log, the preparation worker, then
    /// every live projection, has reached the head of the log (what preparation appends is
    /// then projected too).
    pub(crate) async fn wait_for_workers(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.query_i64("SELECT count(*) FROM engagement_inbox").await > 0 {
            assert!(Instant::now() < deadline, "the engagement inbox is not drained");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        loop {
            let prepared = self
                .query_i64(
                    "SELECT COALESCE((SELECT position FROM worker_checkpoints WHERE name = 'preparation'), 0)
                          - (SELECT position FROM log_head)",
                )
                .await;
            if prepared >= 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the preparation worker is stuck {prepared} behind the head");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.wait_for_projections().await;
    }

    /// When the query service reads from the standby: waits until it has replayed everything
    /// written so far.
    pub(crate) async fn wait_for_standby(&self) {
        if let Some(replica) = &self.replica_url {
            wait_for_replay(&self.pool, replica).await;
        }
    }

    /// Waits until every live projection has reached the head of the log (and, when the
    /// query service reads from the standby, until the standby has it too).
    pub(crate) async fn wait_for_projections(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let client = self.pool.get().await.expect("client");
            let row = client
                .query_one(
                    "SELECT (SELECT position FROM log_head), (SELECT min(position) FROM projections WHERE status = 'live')",
                    &[],
                )
                .await
                .expect("positions");
            let (head, projected): (i64, i64) = (row.get(0), row.get(1));
            if projected >= head {
                drop(client);
                self.wait_for_standby().await;
                return;
            }
            assert!(Instant::now() < deadline, "projections stuck at {projected} of {head}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Starts one of the Python helpers of the tests (the webhook receiver, the SMTP sink, the DNS
/// server) under `$TEST_PYTHON` (the venv of `scripts/pyenv.sh`, which holds `packages`), with
/// `args` and `--exit-with-stdin` (so it cannot outlive the test process), `--verbose` under
/// `TEST_LOG`. Returns the process and its first line (`LISTENING ...`), read within 30 s.
pub(crate) async fn start_python_helper(
    script: &str,
    args: &[&str],
    what: &str,
    packages: &str,
) -> (ChildGuard, String) {
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "TEST_PYTHON is not set: run the tests with scripts/test, which creates the Python venv of the tests, \
             or set TEST_PYTHON to a Python with {packages} (see scripts/pyenv.sh)"
        )
    });
    let mut command = Command::new(&python);
    command.arg(script).args(args).arg("--exit-with-stdin").stdin(Stdio::piped()).stdout(Stdio::piped());
    command.stderr(Stdio::inherit());
    if std::env::var("TEST_LOG").is_ok() {
        command.arg("--verbose");
    }
    let mut child = ChildGuard(command.spawn().unwrap_or_else(|error| panic!("starting {python} {script}: {error}")));
    let stdout = child.0.stdout.take().unwrap_or_else(|| panic!("the {what}'s stdout is piped"));
    let line = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
        }),
    )
    .await
    .unwrap_or_else(|_| panic!("the {what} printed no LISTENING line within 30 s"))
    .unwrap_or_else(|error| panic!("reading the {what}'s stdout: {error}"))
    .unwrap_or_else(|error| panic!("reading the {what}'s stdout: {error}"));
    (child, line)
}

/// Asserts that every one of `instances` conforms to the schema `name` of the OpenAPI
/// document, as checked by an independent validator (`tests/openapi/conforms.py`).
pub(crate) fn assert_conforms(name: &str, instances: &[Value]) {
    let python = std::env::var("TEST_PYTHON").expect("TEST_PYTHON names the tests' Python (see scripts/pyenv.sh)");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut child = Command::new(python)
        .arg(format!("{root}/tests/openapi/conforms.py"))
        .arg(format!("{root}/docs/openapi.json"))
        .arg(name)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the validator starts");
    let input = serde_json::to_vec(instances).expect("instances serialize");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin is piped"), &input).expect("instances written");
    let output = child.wait_with_output().expect("the validator ends");
    assert!(
        output.status.success(),
        "{} of {name} do not conform to the document:\n{}",
        instances.len(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts a projector of the test's own (every worker, with `settings`) for `app`, spawned
/// without one, on a database whose sessions wait for their commits' flushes, as a
/// deployment's do (the suite's cluster does not). Each checkpoint a worker stores from then
/// on is noted in `checkpoint_commits` ([`checkpoint_commits`]) with the commit setting its
/// transaction had. Cancel the token to stop the projector.
pub(crate) async fn projector_noting_checkpoint_commits(
    app: &TestApp,
    settings: Settings,
) -> tokio_util::sync::CancellationToken {
    let name = app.query_strings("SELECT current_database()::text").await.remove(0);
    app.pool
        .get()
        .await
        .expect("client")
        .batch_execute(&format!(
            "ALTER DATABASE {name} SET synchronous_commit = on;
             CREATE TABLE checkpoint_commits (id bigserial, name text, position bigint, synchronous text,
                                              leased boolean);
             CREATE FUNCTION note_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                 INSERT INTO checkpoint_commits (name, position, synchronous, leased)
                 VALUES (NEW.name, NEW.position, current_setting('synchronous_commit'),
                         current_setting('idle_in_transaction_session_timeout') = '0');
                 RETURN NEW; END $$;
             CREATE TRIGGER note_checkpoint AFTER UPDATE ON worker_checkpoints
                 FOR EACH ROW EXECUTE FUNCTION note_checkpoint();"
        ))
        .await
        .expect("the trigger");
    // The projector connects after the change, so its sessions wait for flushes by default.
    let pool = platform::db::pool(&app.database_url, projector::POOL_SIZE).expect("pool");
    let provider = ai_provider::AiProvider::new(&settings.ai).expect("AI provider");
    let workers = projector::workers(&settings, &pool, provider, "noting").expect("the workers");
    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(projector::runtime::Runtime::new(app.database_url.clone(), workers).run(shutdown.clone()));
    shutdown
}

/// The last row of `checkpoint_commits` ([`projector_noting_checkpoint_commits`]), 0 when none.
pub(crate) async fn last_checkpoint_commit(app: &TestApp) -> i64 {
    app.query_i64("SELECT COALESCE(max(id), 0) FROM checkpoint_commits").await
}

/// A checkpoint a worker stored ([`checkpoint_commits`]).
#[derive(Debug)]
pub(crate) struct CheckpointCommit {
    pub(crate) position: i64,
    /// Whether its commit waited for the log's flush (`on`) or not (`off`).
    pub(crate) synchronous: String,
    /// Whether it was stored by a step under the worker's lease (`runtime::Lease`, whose
    /// transaction lifts the sessions' idle-in-transaction limit), rather than by a pass over
    /// a span in one statement without it.
    pub(crate) leased: bool,
}

/// The checkpoints worker `name` stored after row `after` of `checkpoint_commits`
/// ([`projector_noting_checkpoint_commits`]).
pub(crate) async fn checkpoint_commits(app: &TestApp, name: &str, after: i64) -> Vec<CheckpointCommit> {
    let client = app.pool.get().await.expect("client");
    let rows = client
        .query(
            "SELECT position, synchronous, leased FROM checkpoint_commits WHERE name = $1 AND id > $2 ORDER BY id",
            &[&name, &after],
        )
        .await
        .expect("the commits noted");
    rows.into_iter()
        .map(|row| CheckpointCommit { position: row.get(0), synchronous: row.get(1), leased: row.get(2) })
        .collect()
}

/// A fresh folder under `TEST_SCRATCH` (or the system's temporary folder), named after `name`.
pub(crate) fn scratch_dir(name: &str) -> PathBuf {
    let scratch = std::env::var("TEST_SCRATCH").map(PathBuf::from).unwrap_or_else(|_| std::env::temp_dir());
    let dir = scratch.join(format!("{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

/// A PostgreSQL cluster of one test's own, with default durability (fsync and synchronous
/// commit on, unlike the suite's shared cluster), which the test may kill or restore into.
pub(crate) struct PrivateCluster {
    dir: std::path::PathBuf,
    port: u16,
}

const PG_SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/pg.sh");

/// The processes whose parent is `pid`, from /proc.
fn children_of(pid: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).ok()?;
            // The fields after the command, which is in parentheses and may hold spaces.
            let after = &stat[stat.rfind(')')? + 1..];
            (after.split_whitespace().nth(1) == Some(pid)).then_some(name)
        })
        .collect()
}

impl PrivateCluster {
    /// A cluster on a free port. The port is free when chosen, but another test's process
    /// may bind it before PostgreSQL does: then it starts again on another one.
    pub(crate) fn start() -> Self {
        let dir = scratch_dir("private-pg").join("pg");
        for _ in 0..4 {
            let cluster = Self { dir: dir.clone(), port: free_port() };
            match cluster.try_pg_start() {
                Ok(()) => return cluster,
                Err(tail) if tail.iter().any(|line| line.contains("Address already in use")) => continue,
                Err(tail) => panic!("the private cluster started: {tail:?}"),
            }
        }
        let cluster = Self { dir, port: free_port() };
        cluster.pg_start();
        cluster
    }

    pub(crate) fn pg_start(&self) {
        if let Err(tail) = self.try_pg_start() {
            panic!("the private cluster started: {tail:?}");
        }
    }

    /// Starts the cluster; `Err` holds the end of its log.
    fn try_pg_start(&self) -> Result<(), Vec<String>> {
        let status = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source {PG_SCRIPT} && pg_start {} {} >/dev/null", self.dir.display(), self.port))
            .status()
            .expect("bash runs");
        if status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        Err(log.lines().rev().take(15).map(str::to_owned).collect())
    }

    /// kill -9 of the postmaster and every backend: a crash of the database server.
    pub(crate) fn kill9(&self) {
        let pid_file = std::fs::read_to_string(self.dir.join("postmaster.pid")).expect("postmaster.pid");
        let pid = pid_file.lines().next().expect("pid").trim().to_owned();
        // Stopped first, the postmaster forks no backend between the listing of its
        // children and their kill: one forked then would survive it and hold the shared
        // memory, and the restart would refuse to start ("pre-existing shared memory block
        // is still in use"). The children are read from /proc and signalled by bash's own
        // kill: a fresh machine may have neither pgrep nor a kill program.
        let signal = |signal: &str, pids: &[String]| {
            let status = std::process::Command::new("bash")
                .arg("-c")
                .arg(format!("kill {signal} {}", pids.join(" ")))
                .status()
                .expect("bash runs");
            assert!(status.success(), "kill {signal} {pids:?}");
        };
        signal("-STOP", std::slice::from_ref(&pid));
        let mut pids = vec![pid.clone()];
        pids.extend(children_of(&pid));
        signal("-KILL", &pids);
        // Dead, or a zombie nobody reaps (a container's init may not): either way its lock
        // file is stale, as after a crash of the machine, so it goes.
        let gone = |pid: &str| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
                stat.rfind(')').is_some_and(|end| stat[end + 1..].split_whitespace().next() == Some("Z"))
            })
        };
        for _ in 0..250 {
            if pids.iter().all(|pid| gone(pid)) && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
                let _ = std::fs::remove_file(self.dir.join("postmaster.pid"));
                let _ = std::fs::remove_file(self.dir.join(format!(".s.PGSQL.{}.lock", self.port)));
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the killed cluster is still running");
    }

    pub(crate) fn url(&self, database: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname={database}", self.port)
    }
    /// The cluster's `platform` database, created and migrated (`projector migrate`): its URL.
    pub(crate) async fn migrated_platform(&self) -> String {
        create_migrated_platform(&self.url("postgres"), &self.url("platform")).await
    }
}

/// Creates the `platform` database through `admin_url` and migrates it (`projector migrate`)
/// at `url`, which it returns.
pub(crate) async fn create_migrated_platform(admin_url: &str, url: &str) -> String {
    let (admin, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls).await.expect("admin");
    tokio::spawn(connection);
    admin.batch_execute("CREATE DATABASE platform").await.expect("database");
    let migrated = run_binary("projector", &["migrate"], url);
    assert!(migrated.status.success(), "migrate: {}", String::from_utf8_lossy(&migrated.stderr));
    url.to_owned()
}

/// `command-service apply <file> --wait` against `database_url` (a projector must be running).
pub(crate) fn apply_file(file: &str, database_url: &str) {
    let applied = run_binary("command-service", &["apply", file, "--wait"], database_url);
    assert!(applied.status.success(), "apply: {}", String::from_utf8_lossy(&applied.stderr));
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source {PG_SCRIPT} && ensure_postgres && pg_stop {}", self.dir.display()))
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
