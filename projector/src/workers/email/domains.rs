//! Domain verification: looks up the DNS records each sending domain must publish (SPF, DKIM,
//! DMARC, return path) with a resolver pointed at the configured nameserver only
//! (`APP__EMAIL__DNS_NAMESERVER`), every `DNS_CHECK_INTERVAL_SECONDS`, and keeps what it
//! found in `domain_checks`, which `GET /domains` compares with what should be published. One
//! process checks at a time (a transaction-scoped advisory lock, released with the connection
//! of a process that dies). A lookup that fails (rather than finding nothing) leaves the
//! previous check in place.
//!
//! The domains come from the log (the latest `ResourceDefined` of each `authoring/domain/`
//! stream), not from the catalog read model: the worker needs no projection to be current.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::Pool;
use domain::email::resources::{DOMAIN, DomainDef, dns_records};
use futures_util::future::join_all;
use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::proto::{ProtoError, ProtoErrorKind};
use hickory_resolver::{ResolveError, TokioResolver};
use platform::events::LogEvent;
use platform::settings::EmailSettings;
use serde_json::Value;

use crate::runtime::{Outcome, Worker};

/// The advisory lock of the checks (`"domain"` in ASCII): one process at a time.
const LOCK: i64 = 0x646f_6d61_696e;

/// Domains checked by one step, the longest unchecked first.
const BATCH: i64 = 16;

/// How long one question waits for an answer, and how many times it is asked.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
const LOOKUP_ATTEMPTS: usize = 2;

pub(crate) struct DomainChecks {
    pool: Pool,
    resolver: TokioResolver,
    interval: Duration,
    /// The platform's host name, which the SPF include and the return path CNAME name.
    platform_host: String,
}

impl DomainChecks {
    /// The worker, or `None` when no nameserver is configured (records stay `pending`).
    pub(crate) fn new(pool: Pool, settings: &EmailSettings) -> anyhow::Result<Option<Self>> {
        let Some(nameserver) = &settings.dns_nameserver else { return Ok(None) };
        let address: SocketAddr = nameserver.parse().with_context(|| {
            format!("APP__EMAIL__DNS_NAMESERVER must be an address and port (127.0.0.1:53); got {nameserver:?}")
        })?;
        // UDP, then TCP when an answer is truncated; NXDOMAIN from it is believed.
        let servers = NameServerConfigGroup::from_ips_clear(&[address.ip()], address.port(), true);
        let mut options = ResolverOpts::default();
        options.timeout = LOOKUP_TIMEOUT;
        options.attempts = LOOKUP_ATTEMPTS;
        // Every check asks the nameserver again, and nothing of the system's (hosts file,
        // resolv.conf) takes part.
        options.cache_size = 0;
        options.use_hosts_file = ResolveHosts::Never;
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
            platform_host: settings.platform_domain().to_owned(),
        }))
    }

    async fn run(&self) -> anyhow::Result<Outcome> {
        let mut client = self.pool.get().await?;
        let transaction = client.transaction().await?;
        let locked: bool = transaction.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&LOCK]).await?.get(0);
        if !locked {
            return Ok(Outcome::Idle);
        }
        // The lookups happen while the lock is held; the pool's idle-in-transaction limit
        // guards append transactions, which never hold it.
        transaction.batch_execute("SET LOCAL idle_in_transaction_session_timeout = 0").await?;
        let rows = transaction
            .query(
                "SELECT latest.stream_id, latest.event_type, latest.payload
                 FROM (SELECT DISTINCT ON (stream_id) stream_id, event_type, payload FROM events
                       WHERE stream_id LIKE 'authoring/domain/%'
                       ORDER BY stream_id, stream_version DESC) latest
                 LEFT JOIN (SELECT domain_id, max(checked_at) AS checked_at FROM domain_checks
                            GROUP BY domain_id) checks
                   ON checks.domain_id = substr(latest.stream_id, length('authoring/domain/') + 1)
                 WHERE checks.checked_at IS NULL OR checks.checked_at <= now() - make_interval(secs => $1)
                 ORDER BY checks.checked_at NULLS FIRST, latest.stream_id
                 LIMIT $2",
                &[&self.interval.as_secs_f64(), &BATCH],
            )
            .await?;
        let batch_full = rows.len() as i64 == BATCH;
        let prefix = format!("authoring/{DOMAIN}/");
        let mut questions = Vec::new();
        for row in &rows {
            let stream_id: &str = row.get(0);
            let Some(domain_id) = stream_id.strip_prefix(&prefix) else { continue };
            let event = LogEvent::decode(row.get(1), row.get(2)).with_context(|| format!("decoding {stream_id}"))?;
            let LogEvent::ResourceDefined(resource) = event else { continue };
            let domain: DomainDef = match serde_json::from_str(&resource.definition_json) {
                Ok(domain) => domain,
                Err(error) => {
                    tracing::warn!(%error, %domain_id, "a domain's definition does not parse; it is not checked");
                    continue;
                }
            };
            for (purpose, kind, name, _) in dns_records(&domain, &self.platform_host) {
                questions.push((domain_id.to_owned(), domain.name.clone(), purpose, kind, name));
            }
        }
        let answers = join_all(questions.iter().map(|(_, _, _, kind, name)| self.lookup(name, kind))).await;
        let mut written = 0;
        for ((domain_id, domain_name, purpose, _, name), answer) in questions.iter().zip(answers) {
            let found = match answer {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(
                        %error, domain = %domain_name, %purpose, %name,
                        "a DNS check failed; the previous result stays"
                    );
                    continue;
                }
            };
            transaction
                .execute(
                    "INSERT INTO domain_checks (domain_id, purpose, found, checked_at) VALUES ($1, $2, $3, now())
                     ON CONFLICT (domain_id, purpose) DO UPDATE SET found = EXCLUDED.found, checked_at = now()",
                    &[domain_id, purpose, &Value::from(found)],
                )
                .await?;
            written += 1;
        }
        transaction.commit().await?;
        // A full batch may have left due domains behind; a batch whose every lookup failed
        // waits for the poll interval rather than asking again at once.
        Ok(if batch_full && written > 0 { Outcome::Progressed } else { Outcome::Idle })
    }

    /// What DNS holds at `name` for `kind` (`TXT` or `CNAME`): each TXT record's
    /// character-strings joined, or each CNAME's target (lowercase, without the root dot).
    /// NXDOMAIN, or no record of that type, is an empty list; any other failure (SERVFAIL,
    /// REFUSED, no answer in time) is an error.
    async fn lookup(&self, name: &str, kind: &str) -> Result<Vec<String>, ResolveError> {
        let record_type = if kind == "CNAME" { RecordType::CNAME } else { RecordType::TXT };
        let lookup = match self.resolver.lookup(format!("{name}."), record_type).await {
            Ok(lookup) => lookup,
            Err(error) if nothing_there(&error) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        };
        // Only records of the asked type: a TXT answer may come through a CNAME chain.
        Ok(lookup
            .record_iter()
            .filter_map(|record| match (record_type, record.data()) {
                (RecordType::TXT, RData::TXT(txt)) => {
                    Some(txt.txt_data().iter().map(|part| String::from_utf8_lossy(part)).collect())
                }
                (RecordType::CNAME, RData::CNAME(cname)) => {
                    Some(cname.0.to_utf8().trim_end_matches('.').to_ascii_lowercase())
                }
                _ => None,
            })
            .collect())
    }
}

/// Whether `error` is the nameserver's answer that the name has no such record: NXDOMAIN, or
/// NOERROR without records. hickory reports SERVFAIL and REFUSED as "no records found" too,
/// with their response code, so the code decides.
fn nothing_there(error: &ResolveError) -> bool {
    matches!(
        error.proto().map(ProtoError::kind),
        Some(ProtoErrorKind::NoRecordsFound { response_code: ResponseCode::NXDomain | ResponseCode::NoError, .. })
    )
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
