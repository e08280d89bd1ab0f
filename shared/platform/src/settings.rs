//! Typed settings of every component, loaded once with figment: the defaults below (the only
//! place a default is written), then an optional TOML file named by `APP_CONFIG`, then
//! environment variables with the `APP__` prefix and `__` between levels (`APP__DATABASE__URL`,
//! `APP__EVENTS__ADMISSION__FLEET__RATE`). `RUST_LOG` sets the log filter. No other module
//! reads the environment: what a component needs is passed to it from here. Secrets (the
//! database URL, the master key, the AI key) are `secrecy` strings that never print.

use std::time::Duration;

pub use kernel::limits::{AdmissionLimits, ScopeLimits};

use anyhow::Context;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    pub database: DatabaseSettings,
    /// `APP__INSTANCE`: the slot this process fills, for a deployment that starts a killed
    /// process again under another host name or port. Unset: `<role>@<host name>:<port>` when
    /// the port is fixed, none when it is picked at random. A process that starts in a slot
    /// takes over at once what the slot's earlier process held (`platform::liveness`), so two
    /// live processes must never share one.
    pub instance: Option<String>,
    /// `APP__MASTER_KEY`: 64 hex characters (`openssl rand -hex 32`). It wraps every data
    /// subject's key, so losing it loses all personal data in the log. Required.
    #[serde(skip_serializing)]
    pub master_key: Option<SecretString>,
    pub http: HttpSettings,
    pub auth: AuthSettings,
    pub reads: ReadSettings,
    pub append: AppendSettings,
    pub rate_limits: RateLimits,
    pub erasure: ErasureSettings,
    pub events: EventSettings,
    pub ai: AiSettings,
    pub identity: IdentityCapacity,
    pub projector: ProjectorSettings,
    pub telemetry: TelemetrySettings,
    pub webhooks: WebhookSettings,
    pub email: EmailSettings,
    pub inbound: InboundSettings,
    pub forms: FormSettings,
    pub broadcasts: BroadcastSettings,
    pub workflows: WorkflowSettings,
    pub imports: ImportSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DatabaseSettings {
    /// `APP__DATABASE__URL`: a libpq-style URL or key=value string. Required. For a failover
    /// cluster, list every node (`host=a,b port=5432,5432`) with
    /// `target_session_attrs=read-write`: each new connection finds the primary of the moment.
    #[serde(skip_serializing)]
    pub url: Option<SecretString>,
    /// `APP__DATABASE__POOL_SIZE`: connections per process. Default: twice this machine's
    /// cores, at least 4 (see [`default_pool_size`]).
    pub pool_size: usize,
    /// `APP__DATABASE__READ_URL`: a hot standby (physical streaming replica) of the database
    /// for the query service to read from. Unset: it reads from `APP__DATABASE__URL`. Set:
    /// reads go to the standby, while what a read must write (rate-limit reservations) and what
    /// it must know as of now (the caller's last write, the head of the log) go to the primary.
    /// With a failover cluster, list every node with `target_session_attrs=read-only`: reads go
    /// to whichever node is a standby, and to the primary while none answers
    /// ([`crate::db::standby_pool`]).
    #[serde(skip_serializing)]
    pub read_url: Option<SecretString>,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        Self { url: None, pool_size: default_pool_size(), read_url: None }
    }
}

/// Twice the cores this process can use, at least 4: more connections working at once than
/// PostgreSQL has cores to run them only moves the queue from the pool (first come, first
/// served) into the kernel's scheduler, where a request waits behind every other backend's
/// time slice. On two cores with sixteen clients, sixteen connections served reads by id at
/// p99 360 ms (15,000 a second) and four at p99 5.6 ms (13,400 a second), and four took
/// record creates from about 2,400 to 2,800 a second. When PostgreSQL runs on a larger
/// machine of its own, size the pool to its cores instead.
fn default_pool_size() -> usize {
    std::thread::available_parallelism().map_or(4, |cores| 2 * cores.get()).max(4)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct HttpSettings {
    /// `APP__HTTP__HOST` and `APP__HTTP__PORT` (0 picks a free port).
    pub host: String,
    pub port: u16,
    /// `APP__HTTP__SHUTDOWN_TIMEOUT_MILLIS`: on SIGTERM, how long requests in flight may take
    /// to finish after the listener stops accepting.
    pub shutdown_timeout_millis: u64,
    /// `APP__HTTP__TRUSTED_PROXIES` (for example `["127.0.0.1"]`): the addresses of proxies
    /// (the split deployment's nginx) whose `X-Forwarded-For` names the client. From any
    /// other peer the header is ignored, so a client cannot choose its own address for the
    /// form limiters.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// `APP__HTTP__KEEP_ALIVE_SECONDS`: how long an idle client connection is kept open.
    /// Longer than common client pools and proxies keep theirs (nginx keeps upstream
    /// connections 60 s and client connections 75 s), so the server is not the side that
    /// closes a connection a client is about to reuse.
    pub keep_alive_seconds: u64,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: 8080,
            shutdown_timeout_millis: 10_000,
            trusted_proxies: Vec::new(),
            keep_alive_seconds: 75,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AuthSettings {
    /// `APP__AUTH__CACHE_MILLIS`: how long a key lookup is cached. Revocation takes effect
    /// within this plus the catalog projection's lag.
    pub cache_millis: u64,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self { cache_millis: 500 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ReadSettings {
    /// `APP__READS__CONSISTENCY_WAIT_MILLIS`: the longest a read waits for its read models to
    /// reach the caller's last write.
    pub consistency_wait_millis: u64,
}

impl Default for ReadSettings {
    fn default() -> Self {
        Self { consistency_wait_millis: 3000 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AppendSettings {
    /// `APP__APPEND__BATCH_MAX`: most commands grouped into one log transaction.
    pub batch_max: usize,
    /// `APP__APPEND__BATCH_BYTES`: most bytes of events one log transaction writes (a command
    /// larger than that alone); see `platform::log::BATCH_BYTES`.
    pub batch_bytes: usize,
}

impl Default for AppendSettings {
    fn default() -> Self {
        Self { batch_max: 256, batch_bytes: crate::log::BATCH_BYTES }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ErasureSettings {
    /// `APP__ERASURE__BLOCKED_AFTER_MILLIS`: how long a record deletion may wait for a read
    /// model to pass its position before it is reported `blocked`.
    pub blocked_after_millis: u64,
}

impl Default for ErasureSettings {
    fn default() -> Self {
        Self { blocked_after_millis: 60_000 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EventSettings {
    /// `APP__EVENTS__ADMISSION__{FLEET,SPACE,SCHEMA}__{RATE,BURST,PENDING,RECEIPTS}`.
    pub admission: AdmissionLimits,
    /// `APP__EVENTS__RECEIPT_RETENTION_HOURS`: how long a receipt is retained after
    /// acceptance (and after its preparation is over) before it is retired.
    pub receipt_retention_hours: u64,
}

impl Default for EventSettings {
    fn default() -> Self {
        Self { admission: AdmissionLimits::default(), receipt_retention_hours: 24 }
    }
}

/// Identity binding capacity per space: `APP__IDENTITY__ALIASES` and
/// `APP__IDENTITY__CHANGES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdentityCapacity {
    pub aliases: i64,
    pub changes: i64,
}

impl Default for IdentityCapacity {
    /// The contract's values.
    fn default() -> Self {
        Self { aliases: 100_000, changes: 1_000_000 }
    }
}

/// What a projector process runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ProjectorSettings {
    /// `APP__PROJECTOR__WORKERS`: a comma-separated list of the workers this process runs
    /// (`read_models`, `preparation`, `eraser`, `maintenance`, `webhook_enqueue`,
    /// `webhook_delivery`), so a deployment can run, say,
    /// two read-model processes and one process for side effects. Default: all.
    pub workers: String,
    /// `APP__PROJECTOR__PORT`: the port of the projector's operations endpoints (health,
    /// metrics); 0 picks a free one.
    pub port: u16,
    /// `APP__PROJECTOR__CRASH_AFTER_EVENTS` (and `..._CRASH_PROJECTION`): abort the whole
    /// process after applying this many events of a batch, before COMMIT. Only the
    /// crash-recovery test sets it.
    pub crash_after_events: Option<usize>,
    pub crash_projection: Option<String>,
    /// `APP__PROJECTOR__CRASH_AFTER_VERDICT`: abort the whole process right after a broadcast
    /// experiment's verdict is appended, before it is applied. Only the kill test sets it.
    pub crash_after_verdict: bool,
}

impl Default for ProjectorSettings {
    fn default() -> Self {
        Self {
            workers: "all".to_owned(),
            port: 8081,
            crash_after_events: None,
            crash_projection: None,
            crash_after_verdict: false,
        }
    }
}

/// Outgoing webhook delivery (`APP__WEBHOOKS__*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WebhookSettings {
    /// `ALLOW_LOOPBACK`: accept delivery targets on loopback (local development and the
    /// tests). Private, link-local and metadata addresses stay refused.
    pub allow_loopback: bool,
    /// `ATTEMPT_TIMEOUT_MS`: the most one HTTP attempt may take, connecting included.
    pub attempt_timeout_ms: u64,
    /// `RETRY_SCHEDULE_MS` (for example `[0,5000,300000]`): the delay before each attempt
    /// after a retryable failure; its length is the number of retries. Jittered by up to 20%.
    pub retry_schedule_ms: Vec<u64>,
    /// `CONCURRENCY`: attempts in flight per process.
    pub concurrency: usize,
    /// `PER_WEBHOOK_CONCURRENCY`: attempts in flight per webhook across every process.
    pub per_webhook_concurrency: i64,
    /// `BREAKER_FAILURES` and `BREAKER_WINDOW_SECONDS`: a webhook is paused (reason
    /// `failing`) after this many consecutive failed attempts spanning at least the window.
    pub breaker_failures: i64,
    pub breaker_window_seconds: u64,
    /// `ROTATION_GRACE_SECONDS`: after a rotation, deliveries are signed with the previous
    /// secret too for this long.
    pub rotation_grace_seconds: u64,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            allow_loopback: false,
            attempt_timeout_ms: 15_000,
            // Svix's schedule after the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
            retry_schedule_ms: vec![5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000],
            concurrency: 64,
            per_webhook_concurrency: 8,
            breaker_failures: 20,
            breaker_window_seconds: 86_400,
            rotation_grace_seconds: 86_400,
        }
    }
}

/// Public forms (`APP__FORMS__*`): the contract's limiters (Limits, form limits) and the
/// double opt-in link's life.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct FormSettings {
    /// `PER_IP` submissions per client address per `WINDOW_SECONDS` (contract: 10 per 60 s).
    pub per_ip: u32,
    /// `PER_FORM` submissions per form per `WINDOW_SECONDS` (contract: 120 per 60 s).
    pub per_form: u32,
    pub window_seconds: u64,
    /// `CONFIRMATIONS_PER_RECIPIENT` and `CONFIRMATIONS_PER_FORM` confirmation emails per
    /// `CONFIRMATION_WINDOW_SECONDS` (contract: 2 per recipient per form, 200 per form, per hour).
    pub confirmations_per_recipient: u32,
    pub confirmations_per_form: u32,
    pub confirmation_window_seconds: u64,
    /// `TOKEN_TTL_HOURS`: how long a confirmation link stays valid.
    pub token_ttl_hours: u64,
}

impl Default for FormSettings {
    fn default() -> Self {
        Self {
            per_ip: 10,
            per_form: 120,
            window_seconds: 60,
            confirmations_per_recipient: 2,
            confirmations_per_form: 200,
            confirmation_window_seconds: 3_600,
            token_ttl_hours: 168,
        }
    }
}

/// Broadcast runs (`APP__BROADCASTS__*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct BroadcastSettings {
    /// `RATE_PER_SECOND`: the most emails a run schedules per second (0: no limit); the
    /// recipients it skips (no consent, the allowance used up) do not count.
    pub rate_per_second: u32,
    /// `BATCH`: recipients decided and appended together.
    pub batch: usize,
    /// `HANDOFFS`: messages a run hands to the relay at once (64: a hand-off mostly waits,
    /// on its claim, the relay and its outcome's commit, so more at once is more per second).
    pub handoffs: usize,
    /// `LIVE_YIELD`: after each batch a run waits up to this many times as long as the batch
    /// took, in proportion to the requests the API servers serve (`api::live_load`; 0: never).
    pub live_yield: f64,
}

impl Default for BroadcastSettings {
    fn default() -> Self {
        Self { rate_per_second: 200, batch: 200, handoffs: 64, live_yield: 3.0 }
    }
}

/// The workflow engine (`APP__WORKFLOWS__*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkflowSettings {
    /// `LEASE_MS`: how long a run with a webhook call out is leased to the process that
    /// called; another process takes it over after this long, or sooner once the caller stops
    /// beating (`liveness::DEAD_AFTER`). At least a webhook call's timeout and a margin.
    pub lease_ms: u64,
    /// `CONCURRENCY`: runs one process advances at once. Their transitions are appended
    /// together (one log transaction for up to `APP__APPEND__BATCH_MAX` of them), so more in
    /// flight means fewer, larger batches when many runs fall due at once: 10,000 waits ending
    /// in the same second drained in 2.6 s at 64, 1.9 s at 256 and 1.5 s at 1,024
    /// (docs/benchmarks.md, issue 52). A run in flight holds its row and a task, a few KB.
    pub concurrency: usize,
}

impl Default for WorkflowSettings {
    fn default() -> Self {
        Self { lease_ms: 60_000, concurrency: 1024 }
    }
}

/// Imports (`APP__IMPORTS__*`): how long what they leave behind is kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ImportSettings {
    /// `RECEIVING_EXPIRY_SECONDS`: an import never completed that received nothing (its
    /// create, or a part) for this long is dropped as `DELETE /imports/{id}` drops one: its
    /// parts and row results; records its rows wrote stay. 86,400: a day.
    pub receiving_expiry_seconds: u64,
    /// `RETENTION_SECONDS`: a completed import is removed with its row results (and the keys
    /// of its failed rows) this long after it completed. 2,592,000: 30 days.
    pub retention_seconds: u64,
    /// `LIVE_YIELD`: while the API servers serve requests (the `live_load` signal), the
    /// imports worker waits up to this many times as long as a wave took before the next one,
    /// in proportion to the request rate (fully from 100 requests a second), so live requests
    /// keep the machine: 3 gives an import about a quarter of its own pace under steady
    /// traffic and full pace without any; 0 never yields. `projector rebuild` waits the same
    /// way after each batch.
    pub live_yield: f64,
}

impl Default for ImportSettings {
    fn default() -> Self {
        Self { receiving_expiry_seconds: 86_400, retention_seconds: 30 * 86_400, live_yield: 3.0 }
    }
}

/// Email sending (`APP__EMAIL__*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct EmailSettings {
    /// `RELAY_URL`: the SMTP relay, as lettre's connection URL: `smtp://host:port` (plain, or
    /// `?tls=required` for STARTTLS; `tls=opportunistic` is refused, as it would send in clear
    /// text to a relay that does not offer STARTTLS), `smtps://host:port` (implicit TLS), with
    /// `user:password@` for AUTH. Unset (the local default): messages are written as `.eml`
    /// files under `EML_DIR` instead, so the system works offline.
    #[serde(skip_serializing)]
    pub relay_url: Option<SecretString>,
    /// `RELAY_CA_FILE`: a PEM file of certificates to trust for the relay's TLS besides the
    /// public roots (a private relay's CA, or its self-signed certificate). The relay's
    /// certificate is always verified: one that does not verify fails the hand-off
    /// (`relay_unavailable`), and no URL may let TLS fall back to clear text.
    pub relay_ca_file: Option<String>,
    /// `EML_DIR`: where messages go when no relay is configured.
    pub eml_dir: String,
    /// `PUBLIC_BASE_URL`: the API's public base URL (with `/v1`), for the one-click
    /// unsubscribe and double opt-in links inside messages.
    pub public_base_url: String,
    /// `TRACKING_KEY`: the number of the key that signs new click and open tracking links
    /// (each number names a key derived from the master key). To rotate, raise it and keep
    /// the old number in `TRACKING_KEYS_ACCEPTED` while mail with its links may still be
    /// read; links of a number no longer accepted stop redirecting.
    pub tracking_key: u32,
    /// `TRACKING_KEYS_ACCEPTED`: older key numbers whose links are still followed.
    pub tracking_keys_accepted: Vec<u32>,
    /// `HELLO_NAME`: the name given in EHLO, and the right side of Message-IDs.
    pub hello_name: String,
    /// `PLATFORM_DOMAIN`: the DNS name of this installation's mail service, which every
    /// sending domain's records point at: its SPF record includes `_spf.<PLATFORM_DOMAIN>`
    /// (where the operator lists the addresses mail leaves from) and its return path is a
    /// CNAME to `bounces.<PLATFORM_DOMAIN>` (an MX to the host of `projector inbound`). Unset:
    /// `HELLO_NAME`, so a real installation that names itself in EHLO needs nothing more.
    pub platform_domain: Option<String>,
    /// `TIMEOUT_MS`: the most one step of an SMTP exchange may take: the envelope (MAIL,
    /// RCPT and DATA); connecting with TLS and AUTH, and the content with its reply, may
    /// take three times it.
    pub timeout_ms: u64,
    /// `POOL_SIZE`: pooled relay connections per process (32; lower it for a relay that
    /// limits connections per client).
    pub pool_size: u32,
    /// `RETRY_SCHEDULE_MS`: the outbox worker's delays between hand-offs of an email the relay
    /// refused for now (4xx) or could not be reached for; after the last, the email fails.
    pub retry_schedule_ms: Vec<u64>,
    /// `HANDOFF_DELAY_MS`: a pause between the append of a send and its hand-off. Zero in
    /// production; the crash tests use it to kill a process inside that window.
    pub handoff_delay_ms: u64,
    /// `HANDOFF_GRACE_MS`: how long the outbox worker leaves a new email to the inline
    /// hand-off of the process that appended it (a released held email, to the process that
    /// released it) before taking it over.
    pub handoff_grace_ms: u64,
    /// `OUTBOX_POLL_MS`: how often the outbox worker looks for emails to finish.
    pub outbox_poll_ms: u64,
    /// `DNS_NAMESERVER` (`host:port`): the nameserver domain verification asks, and only it.
    /// Unset: no verification; every DNS record of a domain stays `pending`.
    pub dns_nameserver: Option<String>,
    /// `DNS_CHECK_INTERVAL_SECONDS`: how often each domain's records are looked up again.
    pub dns_check_interval_seconds: u64,
}

impl EmailSettings {
    /// The DNS name every sending domain's SPF and return-path records point at.
    pub fn platform_domain(&self) -> &str {
        self.platform_domain.as_deref().filter(|domain| !domain.is_empty()).unwrap_or(&self.hello_name)
    }
}

impl Default for EmailSettings {
    fn default() -> Self {
        Self {
            relay_url: None,
            relay_ca_file: None,
            eml_dir: "data/outbox".to_owned(),
            public_base_url: "http://127.0.0.1:8080/v1".to_owned(),
            tracking_key: 1,
            tracking_keys_accepted: Vec::new(),
            hello_name: "localhost".to_owned(),
            platform_domain: None,
            timeout_ms: 10_000,
            pool_size: 32,
            // 30 s, 2 min, 10 min, 1 h, 4 h, then 12 h twice: about a day in all.
            retry_schedule_ms: vec![30_000, 120_000, 600_000, 3_600_000, 14_400_000, 43_200_000, 43_200_000],
            handoff_delay_ms: 0,
            handoff_grace_ms: 10_000,
            outbox_poll_ms: 1_000,
            dns_nameserver: None,
            dns_check_interval_seconds: 300,
        }
    }
}

/// The listener for mail coming back to return paths: bounces and complaints
/// (`APP__INBOUND__*`; `projector inbound`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct InboundSettings {
    /// `HOST` and `PORT`: where the SMTP listener binds (0: a free port). Mail exchangers of
    /// the return-path domains point here (port 25 behind a forward in production). With
    /// `PORT` unset, `projector inbound` binds 2525 and single-node mode runs no listener.
    pub host: String,
    pub port: Option<u16>,
    /// `HOSTNAME`: the name in the greeting and in replies.
    pub hostname: String,
    /// `MAX_MESSAGE_BYTES`: the largest message accepted (advertised as SIZE); larger ones
    /// are refused with 552 and not read into memory.
    pub max_message_bytes: usize,
    /// `MAX_CONNECTIONS`: sessions served at once; more wait for the accept.
    pub max_connections: usize,
    /// `IDLE_TIMEOUT_SECONDS`: a session silent this long is closed (421).
    pub idle_timeout_seconds: u64,
    /// `SOFT_BOUNCE_LIMIT` and `SOFT_BOUNCE_WINDOW_SECONDS`: soft bounces of this many
    /// different emails to one address within the window suppress it (reason `bounce`).
    pub soft_bounce_limit: i64,
    pub soft_bounce_window_seconds: u64,
    /// `PAUSE_BEFORE_REPLY_MS`: a pause between recording a report and acknowledging it.
    /// Zero in production; the crash test kills the listener inside it.
    pub pause_before_reply_ms: u64,
}

impl Default for InboundSettings {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_owned(),
            port: None,
            hostname: "localhost".to_owned(),
            max_message_bytes: 10 * 1024 * 1024,
            max_connections: 256,
            idle_timeout_seconds: 120,
            soft_bounce_limit: 3,
            soft_bounce_window_seconds: 7 * 24 * 3600,
            pause_before_reply_ms: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TelemetrySettings {
    /// `APP__TELEMETRY__FORMAT`: `text` (readable lines) or `json`.
    pub format: String,
    /// `RUST_LOG` (or `APP__TELEMETRY__FILTER`): which logs to keep; each binary has its own
    /// default.
    pub filter: Option<String>,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self { format: "text".to_owned(), filter: None }
    }
}

impl Settings {
    /// Loads the settings: defaults, then the file named by `APP_CONFIG` (if any), then the
    /// environment. The database URL and the master key are required.
    pub fn load() -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        if let Ok(path) = std::env::var("APP_CONFIG") {
            figment = figment.merge(Toml::file_exact(path));
        }
        let figment = figment
            .merge(Env::prefixed("APP__").split("__"))
            .merge(Env::raw().only(&["RUST_LOG"]).map(|_| "telemetry.filter".into()));
        let settings: Settings = figment.extract().context("the settings are invalid")?;
        settings.database_url().context("APP__DATABASE__URL is not set")?;
        settings
            .master_key()
            .context("APP__MASTER_KEY is not set (64 hex characters, for example from `openssl rand -hex 32`)")?;
        Ok(settings)
    }

    /// Settings for a database URL with every other value at its default and the test master
    /// key ([`crate::crypto::TEST_MASTER_KEY`]), for tests.
    pub fn for_database(database_url: &str) -> Self {
        Self {
            database: DatabaseSettings { url: Some(database_url.into()), ..DatabaseSettings::default() },
            master_key: Some(crate::crypto::TEST_MASTER_KEY.into()),
            http: HttpSettings { port: 0, ..HttpSettings::default() },
            ..Settings::default()
        }
    }

    pub fn database_url(&self) -> anyhow::Result<&str> {
        self.database.url.as_ref().map(ExposeSecret::expose_secret).context("no database URL is configured")
    }

    /// The standby the query service reads from, when one is configured.
    pub fn read_url(&self) -> Option<&str> {
        self.database.read_url.as_ref().map(ExposeSecret::expose_secret)
    }

    pub(crate) fn master_key(&self) -> anyhow::Result<&str> {
        self.master_key.as_ref().map(ExposeSecret::expose_secret).context("no master key is configured")
    }

    /// The keyring of the configured master key.
    pub fn keyring(&self) -> anyhow::Result<crate::crypto::Keyring> {
        crate::crypto::Keyring::from_hex(self.master_key()?).context("APP__MASTER_KEY")
    }

    /// How long a hand-off holds an email: longer than any SMTP exchange can last.
    pub fn email_lease(&self) -> Duration {
        Duration::from_millis(self.email.timeout_ms.saturating_mul(9).saturating_add(30_000))
    }

    pub fn auth_cache_ttl(&self) -> Duration {
        Duration::from_millis(self.auth.cache_millis)
    }

    pub fn consistency_wait(&self) -> Duration {
        Duration::from_millis(self.reads.consistency_wait_millis)
    }

    pub fn erasure_blocked_after(&self) -> Duration {
        Duration::from_millis(self.erasure.blocked_after_millis)
    }

    pub fn event_receipt_retention(&self) -> Duration {
        Duration::from_secs(3600 * self.events.receipt_retention_hours)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.http.shutdown_timeout_millis)
    }

    /// What an API server needs to know of its connections' lifetimes.
    pub fn server_timeouts(&self) -> ServerTimeouts {
        ServerTimeouts {
            shutdown: self.shutdown_timeout(),
            keep_alive: Duration::from_secs(self.http.keep_alive_seconds),
        }
    }
}

/// How long an API server waits for requests in flight at shutdown, and keeps an idle
/// connection open.
#[derive(Debug, Clone, Copy)]
pub struct ServerTimeouts {
    pub shutdown: std::time::Duration,
    pub keep_alive: std::time::Duration,
}

/// Requests allowed per window, per bucket (`APP__RATE_LIMITS__*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RateLimits {
    /// `READ_PER_SECOND`, `WRITE_PER_SECOND`, `AI_PER_MINUTE`: the contract's buckets.
    pub read_per_second: u32,
    pub write_per_second: u32,
    pub ai_per_minute: u32,
    /// `INGEST_PER_SECOND`: requests of one write key to the Segment-compatible ingest (each a
    /// batch of up to 500 KB of messages).
    pub ingest_per_second: u32,
    /// `TEST_SENDS_PER_MINUTE`: test sends of templates by one API key (each a real message to
    /// an address the caller gives).
    pub test_sends_per_minute: u32,
    /// `ENABLED`: off only for measuring the limiter's own cost.
    pub enabled: bool,
    /// `RESERVE_MAX`: the most tokens one reservation takes (see `ratelimit::chunk`); 1
    /// reserves per request.
    pub reserve_max: u32,
}

impl Default for RateLimits {
    /// The contract's values: read 100/s, write 25/s, ai 10 per 60 s; and ingest 200/s per
    /// write key (Segment's clients send a batch at a time).
    fn default() -> Self {
        Self {
            read_per_second: 100,
            write_per_second: 25,
            ai_per_minute: 10,
            ingest_per_second: 200,
            test_sends_per_minute: 10,
            enabled: true,
            reserve_max: 1000,
        }
    }
}

/// Which AI provider to use (`APP__AI__*`, see `platform::settings`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AiSettings {
    /// `APP__AI__PROVIDER`: `deterministic` (default) or `openai`.
    pub provider: ProviderKind,
    /// `APP__AI__ENDPOINT`: the base URL, e.g. `https://api.openai.com/v1`; the client POSTs
    /// `{endpoint}/chat/completions`. Required for `openai`.
    pub endpoint: String,
    /// `APP__AI__MODEL`: the model name. Required for `openai`.
    pub model: String,
    /// `APP__AI__API_KEY`: sent as `Authorization: Bearer ...` when set.
    #[serde(skip_serializing)]
    pub api_key: Option<SecretString>,
    /// `APP__AI__TIMEOUT_MILLIS`: the longest one provider call may take.
    pub timeout_millis: u64,
}

impl Default for AiSettings {
    fn default() -> Self {
        Self {
            provider: ProviderKind::Deterministic,
            endpoint: String::new(),
            model: String::new(),
            api_key: None,
            timeout_millis: 20_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Deterministic,
    #[serde(rename = "openai")]
    OpenAi,
}

impl AiSettings {
    pub fn deterministic() -> Self {
        Self::default()
    }

    pub fn openai(endpoint: &str, model: &str, api_key: Option<&str>, timeout: Duration) -> Self {
        Self {
            provider: ProviderKind::OpenAi,
            endpoint: endpoint.to_owned(),
            model: model.to_owned(),
            api_key: api_key.map(SecretString::from),
            timeout_millis: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[cfg(test)]
// figment's `Jail` closures return its large error type; that is its API, not ours.
#[expect(clippy::result_large_err, reason = "figment::Jail::expect_with's closure type")]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_contract_values_and_nested_environment_names_override_them() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("APP__DATABASE__URL", "host=db");
            jail.set_env("APP__MASTER_KEY", crate::crypto::TEST_MASTER_KEY);
            jail.set_env("APP__RATE_LIMITS__READ_PER_SECOND", "7");
            jail.set_env("APP__EVENTS__ADMISSION__SPACE__BURST", "3");
            jail.set_env("APP__EMAIL__DNS_NAMESERVER", "127.0.0.1:5353");
            jail.set_env("RUST_LOG", "debug");
            let settings = Settings::load().map_err(|error| format!("{error:#}"))?;
            assert_eq!(settings.database_url().map_err(|error| error.to_string())?, "host=db");
            assert_eq!(settings.rate_limits.read_per_second, 7);
            assert_eq!(settings.rate_limits.write_per_second, 25, "untouched defaults stay");
            assert_eq!(settings.events.admission.space.burst, 3.0);
            assert_eq!(settings.events.admission.space.rate, 10.0, "a sibling keeps its scope's default");
            let forms = &settings.forms;
            assert_eq!(
                (forms.per_ip, forms.per_form, forms.window_seconds),
                (10, 120, 60),
                "the contract's form limits"
            );
            let confirmations =
                (forms.confirmations_per_recipient, forms.confirmations_per_form, forms.confirmation_window_seconds);
            assert_eq!(confirmations, (2, 200, 3_600));
            assert_eq!(settings.events.admission.fleet.burst, 200.0);
            assert_eq!(settings.telemetry.filter.as_deref(), Some("debug"));
            assert_eq!(settings.identity, IdentityCapacity::default());
            assert_eq!(settings.email.dns_nameserver.as_deref(), Some("127.0.0.1:5353"));
            assert_eq!(settings.email.dns_check_interval_seconds, 300);
            Ok(())
        });
    }

    #[test]
    fn the_database_url_and_master_key_are_required_and_secrets_do_not_print() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("APP__MASTER_KEY", crate::crypto::TEST_MASTER_KEY);
            assert!(Settings::load().is_err(), "no database URL");
            jail.set_env("APP__DATABASE__URL", "host=db password=hunter2");
            let settings = Settings::load().map_err(|error| format!("{error:#}"))?;
            let printed = format!("{settings:?}");
            assert!(!printed.contains("hunter2") && !printed.contains(crate::crypto::TEST_MASTER_KEY), "{printed}");
            Ok(())
        });
    }
}
