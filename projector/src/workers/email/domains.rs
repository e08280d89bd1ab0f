//! Domain verification: looks up the DNS records each sending domain must publish (SPF, DKIM,
//! DMARC, return path) with a resolver pointed at the configured nameserver only
//! (`APP__EMAIL__DNS_NAMESERVER`), every `DNS_CHECK_INTERVAL_SECONDS`, and keeps what it
//! found in `domain_checks`, which `GET /domains` reads. One process checks at a time (a
//! transaction-scoped advisory lock). A lookup that fails (rather than finding nothing)
//! leaves the previous check in place.

use std::net::SocketAddr;
use std::time::Duration;

use deadpool_postgres::Pool;
use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{ResolveError, TokioResolver};
use serde_json::Value;
use shared::email::resources::{DOMAIN, DomainDef, dns_records};
use shared::events::LogEvent;

use crate::runtime::{Outcome, Worker};

/// The advisory lock of the check: one process at a time.
const LOCK: i64 = 0x646f_6d61_696e;

pub struct DomainChecks {
    pool: Pool,
    resolver: TokioResolver,
    interval: Duration,
    platform_host: String,
}

impl DomainChecks {
    /// The worker, or `None` when no nameserver is configured (records stay `pending`).
    pub fn new(pool: Pool, settings: &shared::settings::EmailSettings) -> anyhow::Result<Option<Self>> {
        let Some(nameserver) = &settings.dns_nameserver else { return Ok(None) };
        let address: SocketAddr = nameserver
            .parse()
            .map_err(|error| anyhow::anyhow!("APP__EMAIL__DNS_NAMESERVER {nameserver:?} is not host:port: {error}"))?;
        let servers = NameServerConfigGroup::from_ips_clear(&[address.ip()], address.port(), true);
        let mut options = ResolverOpts::default();
        options.timeout = Duration::from_secs(2);
        options.attempts = 2;
        // Every check asks the nameserver again.
        options.cache_size = 0;
        let resolver = TokioResolver::builder_with_config(
            ResolverConfig::from_parts(None, Vec::new(), servers),
            TokioConnectionProvider::default(),
        )
        .with_options(options)
        .build();
        Ok(Some(Self {
            pool,
            resolver,
            interval: Duration::from_secs(settings.dns_check_interval_seconds.max(1)),
            platform_host: settings.hello_name.clone(),
        }))
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        let locked: bool = transaction.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&LOCK]).await?.get(0);
        if !locked {
            return Ok(Outcome::Idle);
        }
        let interval = self.interval.as_secs_f64();
        let rows = transaction
            .query(
                "SELECT DISTINCT ON (e.stream_id) e.stream_id, e.event_type, e.payload FROM events e
                 WHERE e.stream_id LIKE 'authoring/domain/%'
                   AND NOT EXISTS (SELECT 1 FROM domain_checks c
                                   WHERE c.domain_id = substr(e.stream_id, 18)
                                     AND c.checked_at > now() - make_interval(secs => $1))
                 ORDER BY e.stream_id, e.stream_version DESC",
                &[&interval],
            )
            .await?;
        let mut checked = 0;
        for row in rows {
            let stream_id: String = row.get(0);
            let Some(domain_id) = stream_id.strip_prefix(&format!("authoring/{DOMAIN}/")) else { continue };
            let LogEvent::ResourceDefined(resource) = LogEvent::decode(row.get(1), row.get(2))? else { continue };
            let Ok(domain) = serde_json::from_str::<DomainDef>(&resource.definition_json) else { continue };
            for (purpose, kind, name, _) in dns_records(&domain, &self.platform_host) {
                let found = match self.lookup(&name, kind).await {
                    Ok(found) => found,
                    Err(error) => {
                        tracing::warn!(%error, domain = %domain.name, %name, "a DNS check failed; the previous result stays");
                        continue;
                    }
                };
                transaction
                    .execute(
                        "INSERT INTO domain_checks (domain_id, purpose, found, checked_at) VALUES ($1, $2, $3, now())
                         ON CONFLICT (domain_id, purpose) DO UPDATE SET found = EXCLUDED.found, checked_at = now()",
                        &[&domain_id, &purpose, &Value::from(found)],
                    )
                    .await?;
            }
            checked += 1;
        }
        transaction.commit().await?;
        Ok(if checked > 0 { Outcome::Progressed } else { Outcome::Idle })
    }

    /// What DNS holds at `name` for `kind`: each TXT record's strings joined, or each CNAME's
    /// target (lowercase, without the root dot). Nothing there is an empty list.
    async fn lookup(&self, name: &str, kind: &str) -> Result<Vec<String>, ResolveError> {
        let record_type = if kind == "CNAME" { RecordType::CNAME } else { RecordType::TXT };
        let lookup = match self.resolver.lookup(format!("{name}."), record_type).await {
            Ok(lookup) => lookup,
            Err(error) if error.is_no_records_found() || error.is_nx_domain() => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        Ok(lookup
            .record_iter()
            .filter_map(|record| match record.data() {
                RData::TXT(txt) => {
                    Some(txt.txt_data().iter().map(|part| String::from_utf8_lossy(part).into_owned()).collect())
                }
                RData::CNAME(cname) => Some(cname.0.to_utf8().trim_end_matches('.').to_ascii_lowercase()),
                _ => None,
            })
            .collect())
    }
}

impl Worker for DomainChecks {
    fn name(&self) -> String {
        "domain_checks".to_owned()
    }

    fn channels(&self) -> &'static [&'static str] {
        &[]
    }

    fn poll_interval(&self) -> Duration {
        self.interval.min(Duration::from_secs(30))
    }

    fn step(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Outcome>> {
        Box::pin(self.run())
    }

    fn lag(&self) -> futures_util::future::BoxFuture<'_, anyhow::Result<Option<i64>>> {
        Box::pin(async { Ok(None) })
    }
}
