//! Operations endpoints, served by every process outside `/v1`: `/health/live` (the process
//! answers), `/health/ready` (the database is reachable and migrated, plus whatever the
//! process adds: the projector reports each worker's lag and health), and `/metrics` in
//! Prometheus text format. Also the request metrics middleware.

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
