//! Per-key request buckets (the contract's Limits): independent fixed windows counted in
//! PostgreSQL, so every instance of a tier shares one budget. The window boundaries come
//! from the database's clock, so instances with drifting clocks still count the same window.

use std::time::Duration;

use actix_web::HttpRequest;
use actix_web::http::StatusCode;
use chrono::{TimeZone, Utc};
use deadpool_postgres::Pool;

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// Every authenticated GET.
    Read,
    /// Every other POST, PATCH, DELETE.
    Write,
    /// LLM-backed operations.
    Ai,
}

impl Bucket {
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Ai => "ai",
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

/// Requests allowed per window, per bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub read: (u32, Duration),
    pub write: (u32, Duration),
    pub ai: (u32, Duration),
    /// Off only for measuring the limiter's own cost.
    pub enabled: bool,
}

impl Default for Limits {
    /// The contract's values: read 100/s, write 25/s, ai 10 per 60 s.
    fn default() -> Self {
        Self {
            read: (100, Duration::from_secs(1)),
            write: (25, Duration::from_secs(1)),
            ai: (10, Duration::from_secs(60)),
            enabled: true,
        }
    }
}

impl Limits {
    fn of(&self, bucket: Bucket) -> (u32, Duration) {
        match bucket {
            Bucket::Read => self.read,
            Bucket::Write => self.write,
            Bucket::Ai => self.ai,
        }
    }
}

#[derive(Clone)]
pub struct RateLimiter {
    pool: Pool,
    limits: Limits,
}

impl RateLimiter {
    pub fn new(pool: Pool, limits: Limits) -> Self {
        Self { pool, limits }
    }

    /// Counts one request of `subject` (a hashed credential or `ip:<address>`) in `bucket`;
    /// 429 `rate_limit_exceeded` with `Retry-After` (the window's end as an HTTP date) when
    /// the window's budget is spent.
    pub async fn check(&self, bucket: Bucket, subject: &str) -> Result<(), ApiError> {
        if !self.limits.enabled {
            return Ok(());
        }
        let (allowed, window) = self.limits.of(bucket);
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1);
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "WITH w AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000 / $2::bigint)::bigint AS idx)
                 INSERT INTO rate_windows (bucket_key, window_index, count, expires_at)
                 SELECT $1::text, w.idx, 1, to_timestamp((w.idx + 1) * $2::bigint / 1000.0) FROM w
                 ON CONFLICT (bucket_key, window_index) DO UPDATE SET count = rate_windows.count + 1
                 RETURNING count, window_index",
            )
            .await?;
        let key = format!("{}:{subject}", bucket.name());
        let row = client.query_one(&statement, &[&key, &window_ms]).await?;
        let (count, window_index): (i32, i64) = (row.get(0), row.get(1));
        if u32::try_from(count).unwrap_or(u32::MAX) <= allowed {
            return Ok(());
        }
        let reset = Utc.timestamp_millis_opt((window_index + 1) * window_ms).single().unwrap_or_else(Utc::now);
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            Some("rate_limit_exceeded"),
            format!(
                "the {} bucket allows {allowed} requests per {} ms for this key; retry after the window resets",
                bucket.name(),
                window_ms
            ),
        )
        .with_header("Retry-After", reset.format("%a, %d %b %Y %H:%M:%S GMT").to_string()))
    }
}

/// Deletes windows that have ended (run periodically by the projector).
pub async fn purge_expired(pool: &Pool) -> anyhow::Result<u64> {
    let client = pool.get().await?;
    Ok(client.execute("DELETE FROM rate_windows WHERE expires_at < now() - interval '1 minute'", &[]).await?)
}
