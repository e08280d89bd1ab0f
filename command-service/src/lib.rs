//! The command service: every mutation of the public API. Authenticate, resolve the space,
//! check the permission, parse and validate, decide, append to the event log.

pub mod authoring;
pub mod broadcasts;
pub mod canonical;
pub mod cli;
pub mod decision;
pub mod echo;
pub mod edge;
pub mod emails;
pub mod engagement;
pub mod events;
pub mod forms;
pub mod idempotency;
pub mod identities;
pub mod imports;
pub mod ingest;
pub mod pipeline;
pub mod records;
pub mod routes;
pub mod segments;
pub mod suppressions;
pub mod templates;
pub mod webhooks;
pub mod workflows;
pub(crate) mod write_contexts;

use actix_web::web;
use api::auth::Authenticator;
use api::http::ApiServer;
use deadpool_postgres::Pool;
use platform::log::EventLog;
use platform::readmodel::ReadModels;
use platform::settings::Settings;

/// What every handler of this service needs.
pub struct State {
    pub pool: Pool,
    pub event_log: EventLog,
    pub authenticator: Authenticator,
    pub read_models: ReadModels,
    pub settings: Settings,
    /// The AI provider (custom-filter webhook conditions).
    pub ai: ai_provider::AiProvider,
    /// Where sends are handed off: the SMTP relay, or `.eml` files.
    pub mailer: mail::mailer::Mailer,
    /// Where sends' links point, and the keys that sign and check tracking links.
    pub site: mail::send::Site,
    /// Hand-off claims, made together with those of concurrent sends.
    pub claims: mail::outbox::Claims,
    /// Clicks and opens taken in, together with those of concurrent requests.
    pub engagement: engagement::store::Inbox,
    /// Event admission scopes whose rows this process knows exist.
    admission_scopes: std::sync::Mutex<std::collections::HashSet<String>>,
    /// What record creates read from the catalog, kept until the catalog changes.
    pub write_contexts: domain::catalog::WriteContexts,
    /// What single event fires read from the catalog, kept until the catalog changes.
    pub event_contexts: domain::catalog::WriteContexts,
    /// What workflow triggers read from the catalog, kept until the catalog changes.
    pub workflows: workflows::store::Kept,
    /// What template sends read from the catalog (the template, its sender and domain, the
    /// space's allowance), kept until the catalog changes.
    pub templates: domain::catalog::Kept<mail::send::Authored>,
    /// This instance's heartbeat; its idempotency claims name it.
    pub beat: platform::liveness::Beat,
    /// The ingest's write keys, looked up by hash and kept for a moment.
    pub write_keys: ingest::keys::WriteKeys,
}

impl State {
    pub fn new(settings: Settings, pool: Pool, read_models: ReadModels) -> anyhow::Result<web::Data<Self>> {
        let ai = ai_provider::AiProvider::new(&settings.ai)?;
        let mailer = mail::mailer::Mailer::from_settings(&settings.email)?;
        let site = mail::send::Site::from_settings(&settings.email)?;
        let event_log = EventLog::start_own(
            settings.database_url()?,
            true,
            (settings.append.batch_max, settings.append.batch_bytes),
        )?;
        let authenticator =
            Authenticator::new(pool.clone(), read_models.clone(), settings.auth_cache_ttl(), settings.rate_limits);
        let claims = mail::outbox::Claims::start(pool.clone());
        let engagement = engagement::store::Inbox::start(pool.clone());
        let beat = platform::liveness::Beat::start(settings.database_url()?.to_owned(), "command-service");
        Ok(web::Data::new(Self {
            pool,
            event_log,
            authenticator,
            read_models,
            settings,
            ai,
            mailer,
            site,
            claims,
            engagement,
            admission_scopes: Default::default(),
            write_contexts: Default::default(),
            event_contexts: Default::default(),
            workflows: Default::default(),
            templates: Default::default(),
            beat,
            write_keys: Default::default(),
        }))
    }

    /// Everything this process keeps per catalog revision: the pipeline prunes it all when a
    /// command finds the catalog moved on.
    pub fn kept(&self) -> [&dyn domain::catalog::KeptByRevision; 4] {
        [&self.write_contexts, &self.event_contexts, &self.workflows, &self.templates]
    }

    /// Whether some of `scopes` may lack their admission row (not yet seen by this process);
    /// marks them seen.
    pub(crate) fn new_admission_scopes(&self, scopes: &[(String, platform::settings::ScopeLimits)]) -> bool {
        let Ok(mut seen) = self.admission_scopes.lock() else { return true };
        let mut new = false;
        for (scope, _) in scopes {
            new |= seen.insert(scope.clone());
        }
        new
    }
}

/// Registers this service's routes (inside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    routes::configure(config);
}

/// The service as a server: `build`, then `port()` and `run_until_stopped()`.
pub struct Application {
    server: ApiServer,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let pool = platform::db::generic_plan_pool(settings.database_url()?, settings.database.pool_size)?;
        let read_models = ReadModels::start(pool.clone(), settings.database_url()?.to_owned());
        let state = State::new(settings.clone(), pool.clone(), read_models)?;
        api::live_load::publish(pool.clone());
        let ops = api::ops::Ops::new(pool, None);
        let address = (settings.http.host.as_str(), settings.http.port);
        let served = state.clone();
        let server = ApiServer::bind(
            address,
            settings.server_timeouts(),
            ops,
            |_| {},
            move |config| {
                config.app_data(served.clone());
                configure(config);
            },
        )?;
        // The listener is this process's: no earlier process in its slot is alive.
        let instance = settings.instance.as_deref();
        state.beat.fills(platform::liveness::slot(instance, "command-service", settings.http.port, server.port()));
        Ok(Self { server })
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.run_until_stopped().await
    }
}

#[cfg(test)]
mod tests {
    /// Every `.rs` file under `folder`, recursively.
    fn sources(folder: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(folder).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                found.extend(sources(&path));
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                found.push(path);
            }
        }
        found
    }

    /// Deciding on fresh state is the pipeline's: no other module reads a read model (only the
    /// catalog, through `pipeline::Ctx`, whose revision guards the append; or at the edge,
    /// before a claim), and no handler appends or claims on its own.
    #[test]
    fn only_the_pipeline_reads_read_models_appends_and_claims() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        for path in sources(&source) {
            let name = path.strip_prefix(&source).expect("under src").to_string_lossy().replace('\\', "/");
            if ["pipeline.rs", "lib.rs"].contains(&name.as_str()) || name.starts_with("authoring/") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            assert!(!text.contains("read_models."), "{name} reads a read model outside the pipeline");
            assert!(!text.contains("idempotency::admit"), "{name} claims outside the pipeline");
            // The exceptions: event batches, whose items are commands of their own (see
            // events/http.rs), and tracking links and pixels (engagement/http.rs: public, with
            // no key, claim or catalog, and answered with a redirect or an image; they decide
            // on the email's stream read fresh and append at its version, again when they
            // lose the race). Everything else appends through `pipeline::execute`.
            if !["events/http.rs", "engagement/http.rs"].contains(&name.as_str()) {
                assert!(!text.contains("event_log.append"), "{name} appends outside the pipeline");
            }
        }
    }

    /// Capabilities without a decision of their own, and why.
    const NO_DECISION: &[(&str, &str)] = &[(
        "authoring",
        "the operator's workspace apply, not an API command: its plan is computed against the log it reads",
    )];

    /// Every capability has a decision, and stores know no HTTP (what a decision may not name
    /// is the workspace's purity check, `tests/tests/api/purity.rs`, which also reads every
    /// file of a `decide/` folder).
    #[test]
    fn every_capability_has_a_decision_and_stores_know_no_http() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let folders = std::fs::read_dir(&source).expect("the source folder").filter_map(|entry| {
            let path = entry.expect("an entry").path();
            path.is_dir().then_some(path)
        });
        let mut checked = 0;
        for folder in folders {
            let capability = folder.file_name().unwrap_or_default().to_string_lossy().into_owned();
            let exempt = NO_DECISION.iter().any(|(name, _)| *name == capability);
            let decided = folder.join("decide.rs").is_file() || folder.join("decide").is_dir();
            assert!(exempt || decided, "{capability}/ has no decide.rs (nor decide/)");
            checked += usize::from(decided);
            if let Ok(store) = std::fs::read_to_string(folder.join("store.rs")) {
                assert!(!store.contains("actix"), "{capability}/store.rs mentions actix");
            }
        }
        assert!(checked >= 12, "only {checked} capabilities with a decision were found");
    }
}
