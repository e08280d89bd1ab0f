//! Operations endpoints, served by every process outside `/v1`: `/health/live` (the process
//! answers), `/health/ready` (the database is reachable and migrated, plus whatever the
//! process adds: the projector reports each worker's lag and health), and `/metrics` in
//! Prometheus text format. Also the request metrics middleware.
//!
//! # Operations endpoints and shutdown
//!
//! Every process serves, outside `/v1`: `/health/live` (it answers), `/health/ready` (the
//! database is reachable and has every migration; the projector and single node also report
//! each worker's health and the open dead letters, and are not ready while a worker has been
//! failing for more than 30 s) and `/metrics` (Prometheus text: requests by operation and
//! status with latency histograms, append batch sizes, latency and failures, rate-limit
//! refusals by bucket, every refusal by its code (`refusals_total`, admission's included),
//! worker steps, failures and lag, due timers, open erasures and dead letters). The projector serves them on `APP__PROJECTOR__PORT`.
//!
//! `projector status` (or `platform status`) is the operator's view of a running system in one
//! command (`projector/src/status.rs`), read from the database: the log head and the age of its last
//! event; every read-model version and checkpointed worker with its position, lag and health
//! (`ok`, `catching_up`, `stalled` when it has not moved for 30 s while behind an event recorded
//! 30 s ago or more, so a rested follower is not stalled the moment an event arrives, `halted`; the
//! eraser and maintenance keep no log position, so they have no lag); open dead letters by read
//! model; the email outbox by state; pending webhook deliveries by webhook with the oldest's
//! age; timers and how many are due; broadcast runs in progress with their recipients by state;
//! workflow runs in progress by status; record deletions not completed, by state; the
//! database's size and its largest tables. `--process <origin>` adds what each named projector process reports on
//! `/health/ready` (every worker of that process, with steps, failures and lag). `--json` prints
//! the same for scripts, and the exit status is 1 when something needs attention (a stalled or
//! halted follower, a dead letter, a blocked record deletion, a process not ready).
//!
//! On SIGTERM or SIGINT a service stops accepting connections and gives requests in flight up
//! to `APP__HTTP__SHUTDOWN_TIMEOUT_MILLIS` to finish; a request's append is awaited by its
//! handler, so the append batcher holds nothing unacknowledged when the server has drained.
//! The projector (and single node) then stops its workers, whose leases end with their
//! transactions.
//!
//! Idle client connections are kept `APP__HTTP__KEEP_ALIVE_SECONDS` (75 s), longer than nginx
//! keeps its upstream connections (60 s) and than common client pools keep theirs, so the
//! service is never the side that closes a connection a client has just chosen to reuse (a POST
//! sent on a connection the server is closing gets no answer, and the client cannot tell whether
//! it was applied).

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, web};
use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use serde_json::{Value, json};

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's metrics recorder (installed once, on first use) and its renderer.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets(&[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let handle = match builder.install_recorder() {
            Ok(handle) => handle,
            // Another recorder is installed (only in tests that build their own): render an
            // empty one rather than fail.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        // Histogram samples wait in buckets until upkeep folds them in: without it they pile
        // up for as long as nobody scrapes `/metrics`.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(%error, "could not start the metrics upkeep thread; histograms fold in at each scrape only");
        }
        handle
    })
}

/// A process's own readiness: whether it is ready, and what it reports.
pub trait Readiness: Send + Sync + 'static {
    fn check(&self) -> BoxFuture<'_, (bool, Value)>;
}

/// What the operations endpoints need.
#[derive(Clone)]
pub struct Ops {
    pool: Pool,
    readiness: Option<Arc<dyn Readiness>>,
}

impl Ops {
    pub fn new(pool: Pool, readiness: Option<Arc<dyn Readiness>>) -> Self {
        metrics_handle();
        Self { pool, readiness }
    }

    /// Registers `/health/live`, `/health/ready` and `/metrics`.
    pub fn configure(self, config: &mut web::ServiceConfig) {
        let ops = web::Data::new(self);
        config
            .app_data(ops)
            .route("/health/live", web::get().to(live))
            .route("/health/ready", web::get().to(ready))
            .route("/metrics", web::get().to(render_metrics));
    }
}

async fn live() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "live" }))
}

async fn ready(ops: web::Data<Ops>) -> HttpResponse {
    let database = async {
        let client = tokio::time::timeout(Duration::from_secs(2), ops.pool.get()).await??;
        anyhow::Ok(platform::db::is_migrated(&client).await?)
    }
    .await;
    let (database_ok, database) = match database {
        Ok(true) => (true, json!({ "reachable": true, "migrated": true })),
        Ok(false) => (false, json!({ "reachable": true, "migrated": false })),
        Err(error) => (false, json!({ "reachable": false, "error": format!("{error:#}") })),
    };
    let (own_ok, own) = match &ops.readiness {
        Some(readiness) => readiness.check().await,
        None => (true, Value::Null),
    };
    let ready = database_ok && own_ok;
    let mut body = json!({ "status": if ready { "ready" } else { "not_ready" }, "database": database });
    if !own.is_null() {
        body["process"] = own;
    }
    if ready { HttpResponse::Ok().json(body) } else { HttpResponse::ServiceUnavailable().json(body) }
}

async fn render_metrics() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(metrics_handle().render())
}

/// Middleware: counts every API request by operation (the route table's operation id, or
/// `unknown`) and status, with its latency.
pub(crate) async fn request_metrics_middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let operation = crate::routes::addressed(&req).map_or("unknown", |operation| operation.id);
    let started = Instant::now();
    let response = next.call(req).await?;
    if operation != "unknown" {
        crate::live_load::served();
    }
    let status = response.status().as_u16().to_string();
    metrics::counter!("http_requests_total", "operation" => operation, "status" => status).increment(1);
    metrics::histogram!("http_request_duration_seconds", "operation" => operation)
        .record(started.elapsed().as_secs_f64());
    Ok(response)
}
