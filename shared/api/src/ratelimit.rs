//! Per-key request buckets (the contract's RateLimits): independent fixed windows counted in
//! PostgreSQL, so every instance of a tier shares one budget. The window boundaries come
//! from the database's clock, so instances with drifting clocks still count the same window.
//!
//! # Rate-limit windows
//!
//! Each request is counted, before authentication, in its bucket (read for GET, write for other
//! methods, ai for LLM-backed operations) under its subject: the SHA-256 of the bearer
//! credential, or `ip:<address>` without one. The counter is one row per (bucket, subject,
//! window) in the UNLOGGED table `rate_windows`, advanced by one upsert whose window index is
//! computed from the database clock, so every instance of a tier (and instances with drifting
//! clocks) count the same fixed window, and two command services share one write budget.
//!
//! A process reserves tokens from that row and keeps them in a short-lived lease: one token per
//! upsert for budgets up to 1,000 per window, so the contract's read (100/s), write (25/s) and
//! AI (10/min) budgets are exact across any number of processes (N concurrent requests within
//! the budget all pass and the next does not) and every such request is one statement; larger
//! configured budgets reserve more at a time (up to `APP__RATE_LIMITS__RESERVE_MAX`). The upsert
//! adds the whole chunk and grants what still fits under the budget, so the budget is never
//! exceeded however many processes reserve; tokens a process holds unused when the window ends
//! are lost, which can only refuse a few requests early, and a reservation that comes back empty
//! still passes while this process holds unused tokens. A process that learns a window is spent
//! refuses further requests in it without a round trip.
//! The lease is a cache of a reservation, not a budget of its own: the shared row stays the
//! truth. Past the limit the answer is 429 `rate_limit_exceeded` with `Retry-After` set to the
//! window's end as an HTTP date. UNLOGGED means no WAL per request; a database crash resets the
//! current windows, which only ever lets a few extra requests through. The projector purges
//! ended windows every minute. Costs are measured in `docs/benchmarks.md`.

use platform::error::Code;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::HttpRequest;
use chrono::{TimeZone, Utc};
use deadpool_postgres::Pool;

use platform::error::ApiError;
use platform::settings::RateLimits;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Every authenticated GET.
    Read,
    /// Every other POST, PATCH, DELETE.
    Write,
    /// LLM-backed operations.
    Ai,
    /// The Segment-compatible ingest, per write key.
    Ingest,
    /// Test sends of templates (`POST /templates/{id}/test`), per API key.
    TestSend,
}

impl Bucket {
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Ai => "ai",
            Self::Ingest => "ingest",
            Self::TestSend => "test_send",
        }
    }

    /// The bucket of a request by its method (the AI bucket is chosen by the operation).
    pub fn for_request(req: &HttpRequest) -> Self {
        if req.method() == actix_web::http::Method::GET || req.method() == actix_web::http::Method::HEAD {
            Self::Read
        } else {
            Self::Write
        }
    }
}

/// How many tokens one reservation takes: 1 (exact, one statement per request) for budgets up
/// to [`EXACT_UP_TO`] per window, which covers the contract's buckets, so N requests within the
/// budget all pass and the next one does not, however many processes share the key. Larger
/// budgets (configured for load tests and big tenants) reserve up to `reserve_max` at a time:
/// tokens a process reserved but did not use when the window ends are lost, so at most
/// `chunk - 1` per process per window are refused early; the budget is never exceeded.
pub fn chunk(limits: &RateLimits, allowed: u32) -> u32 {
    if allowed <= EXACT_UP_TO { 1 } else { (allowed / 50).clamp(1, limits.reserve_max.max(1)) }
}

/// The budget and window of a bucket.
pub fn budget(limits: &RateLimits, bucket: Bucket) -> (u32, Duration) {
    match bucket {
        Bucket::Read => (limits.read_per_second, Duration::from_secs(1)),
        Bucket::Write => (limits.write_per_second, Duration::from_secs(1)),
        Bucket::Ai => (limits.ai_per_minute, Duration::from_secs(60)),
        Bucket::Ingest => (limits.ingest_per_second, Duration::from_secs(1)),
        Bucket::TestSend => (limits.test_sends_per_minute, Duration::from_secs(60)),
    }
}

/// Budgets up to this many requests per window are counted exactly (one token per request).
pub(crate) const EXACT_UP_TO: u32 = 1000;

/// A process's share of one window's budget: tokens reserved from the shared counter and not
/// yet used, or the knowledge that the window's budget is spent.
#[derive(Debug, Clone, Copy)]
struct Lease {
    window_index: i64,
    /// When the window ends, on this process's clock (measured from the database's answer).
    ends: Instant,
    remaining: u32,
    spent: bool,
}

/// Keys with a lease kept before expired ones are swept.
const LEASES_BEFORE_SWEEP: usize = 10_000;

#[derive(Clone)]
pub struct RateLimiter {
    pool: Pool,
    limits: RateLimits,
    leases: Arc<Mutex<HashMap<String, Lease>>>,
}

impl RateLimiter {
    pub fn new(pool: Pool, limits: RateLimits) -> Self {
        Self { pool, limits, leases: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// Counts one request of `subject` (a hashed credential or `ip:<address>`) in `bucket`;
    /// 429 `rate_limit_exceeded` with `Retry-After` (the window's end as an HTTP date) when
    /// the window's budget is spent. Tokens are reserved from the shared window counter in
    /// PostgreSQL, a chunk at a time for large budgets (see [`RateLimits::chunk`]); a window known to
    /// be spent is refused without a round trip until it ends.
    pub async fn check(&self, bucket: Bucket, subject: &str) -> Result<(), ApiError> {
        if !self.limits.enabled {
            return Ok(());
        }
        let (allowed, window) = budget(&self.limits, bucket);
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
        let key = format!("{}:{subject}", bucket.name());
        if let Some(answer) = self.answer_from_lease(&key, bucket, allowed, window_ms) {
            return answer;
        }
        let chunk = chunk(&self.limits, allowed);
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "WITH w AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms)
                 INSERT INTO rate_windows AS r (bucket_key, window_index, count, expires_at)
                 SELECT $1::text, w.now_ms / $2::bigint, $3::integer,
                        to_timestamp((w.now_ms / $2::bigint + 1) * $2::bigint / 1000.0) FROM w
                 ON CONFLICT (bucket_key, window_index) DO UPDATE SET count = r.count + $3::integer
                 RETURNING r.count, r.window_index,
                           (r.window_index + 1) * $2::bigint - (SELECT now_ms FROM w)",
            )
            .await?;
        let chunk_i32 = i32::try_from(chunk).unwrap_or(i32::MAX);
        let row = client.query_one(&statement, &[&key, &window_ms, &chunk_i32]).await?;
        drop(client);
        let (count, window_index, left_ms): (i32, i64, i64) = (row.get(0), row.get(1), row.get(2));
        // Tokens before this reservation, and how many of the chunk fit in the budget.
        let before = u32::try_from(count).unwrap_or(u32::MAX).saturating_sub(chunk);
        let granted = allowed.saturating_sub(before).min(chunk);
        let ends = Instant::now() + Duration::from_millis(u64::try_from(left_ms.max(0)).unwrap_or(0));
        // A grant short of the chunk means the shared window has no tokens left.
        let lease = Lease { window_index, ends, remaining: granted, spent: granted < chunk };
        if self.take_with(key, lease) { Ok(()) } else { Err(exceeded(bucket, allowed, window_ms, window_index)) }
    }

    /// Answers from this process's lease on the current window, if it has one.
    fn answer_from_lease(
        &self,
        key: &str,
        bucket: Bucket,
        allowed: u32,
        window_ms: i64,
    ) -> Option<Result<(), ApiError>> {
        let mut leases = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let lease = leases.get_mut(key).filter(|lease| lease.ends > Instant::now())?;
        if lease.remaining > 0 {
            lease.remaining -= 1;
            return Some(Ok(()));
        }
        lease.spent.then(|| Err(exceeded(bucket, allowed, window_ms, lease.window_index)))
    }

    /// Adds a fresh reservation to this process's lease and takes one token for the request
    /// that made it. Concurrent reservations in the same window add up, so a reservation that
    /// came back empty still passes while tokens an earlier one reserved remain unused here.
    fn take_with(&self, key: String, lease: Lease) -> bool {
        let mut leases = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if leases.len() >= LEASES_BEFORE_SWEEP {
            let now = Instant::now();
            leases.retain(|_, lease| lease.ends > now);
        }
        let current = match leases.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => {
                let current = entry.into_mut();
                if current.window_index == lease.window_index {
                    current.remaining = current.remaining.saturating_add(lease.remaining);
                    current.spent = current.spent || lease.spent;
                } else if current.window_index < lease.window_index {
                    *current = lease;
                }
                current
            }
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert(lease),
        };
        if current.window_index != lease.window_index {
            // A reservation for a window that already ended here: count it on its own terms.
            return lease.remaining > 0;
        }
        if current.remaining > 0 {
            current.remaining -= 1;
            true
        } else {
            false
        }
    }
}

fn exceeded(bucket: Bucket, allowed: u32, window_ms: i64, window_index: i64) -> ApiError {
    metrics::counter!("rate_limit_refusals_total", "bucket" => bucket.name()).increment(1);
    let reset = Utc.timestamp_millis_opt((window_index + 1) * window_ms).single().unwrap_or_else(Utc::now);
    ApiError::of(
        Code::RateLimitExceeded,
        format!(
            "the {} bucket allows {allowed} requests per {window_ms} ms for this key; retry after the window resets",
            bucket.name()
        ),
    )
    .with_header("Retry-After", httpdate::fmt_http_date(reset.into()))
}

/// Deletes windows that have ended (run by the projector's maintenance worker).
pub async fn purge_expired(client: &impl deadpool_postgres::GenericClient) -> anyhow::Result<u64> {
    Ok(client.execute("DELETE FROM rate_windows WHERE expires_at < now() - interval '1 minute'", &[]).await?)
}

/// Counts one request against a fixed window of `allowed` per `window` under `key`, exactly
/// (no leases: for low-volume limiters such as the public forms'). `Err` with the window's
/// end when it is used up.
pub async fn take_one(
    client: &impl deadpool_postgres::GenericClient,
    key: &str,
    allowed: u32,
    window: Duration,
) -> Result<Result<(), chrono::DateTime<Utc>>, tokio_postgres::Error> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
    let statement = client
        .prepare_cached(
            "WITH w AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms)
             INSERT INTO rate_windows AS r (bucket_key, window_index, count, expires_at)
             SELECT $1::text, w.now_ms / $2::bigint, 1, to_timestamp((w.now_ms / $2::bigint + 1) * $2::bigint / 1000.0)
             FROM w
             ON CONFLICT (bucket_key, window_index) DO UPDATE SET count = r.count + 1
             RETURNING r.count, (r.window_index + 1) * $2::bigint",
        )
        .await?;
    let row = client.query_one(&statement, &[&key, &window_ms]).await?;
    let (count, ends_ms): (i32, i64) = (row.get(0), row.get(1));
    if u32::try_from(count).unwrap_or(u32::MAX) <= allowed {
        return Ok(Ok(()));
    }
    Ok(Err(Utc.timestamp_millis_opt(ends_ms).single().unwrap_or_else(Utc::now)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_exact_for_the_contract_budgets_and_grow_with_large_ones() {
        let limits = RateLimits::default();
        assert_eq!(chunk(&limits, 10), 1);
        assert_eq!(chunk(&limits, 25), 1);
        assert_eq!(chunk(&limits, 100), 1);
        assert_eq!(chunk(&limits, EXACT_UP_TO), 1);
        assert_eq!(chunk(&limits, 100_000), 1000);
        assert_eq!(chunk(&limits, 100_000_000), 1000);
        assert_eq!(chunk(&RateLimits { reserve_max: 1, ..limits }, 100_000_000), 1);
    }

    #[test]
    fn an_empty_reservation_still_passes_while_this_process_holds_unused_tokens() {
        let pool = platform::db::pool("host=127.0.0.1 port=1 user=nobody dbname=none", 1).expect("lazy pool");
        let limiter = RateLimiter::new(pool, RateLimits::default());
        let ends = Instant::now() + Duration::from_secs(1);
        // A chunk of 3 arrived and was used by its own request: 2 left here.
        assert!(limiter.take_with("k".into(), Lease { window_index: 7, ends, remaining: 3, spent: false }));
        // Two concurrent reservations came back empty (the shared window is spent) but the
        // tokens held here serve them.
        assert!(limiter.take_with("k".into(), Lease { window_index: 7, ends, remaining: 0, spent: true }));
        assert!(limiter.take_with("k".into(), Lease { window_index: 7, ends, remaining: 0, spent: true }));
        assert!(!limiter.take_with("k".into(), Lease { window_index: 7, ends, remaining: 0, spent: true }));
        // The next window starts afresh.
        assert!(limiter.take_with("k".into(), Lease { window_index: 8, ends, remaining: 1, spent: false }));
    }
}
