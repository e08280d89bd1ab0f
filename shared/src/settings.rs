//! Typed settings from environment variables with the `APP__` prefix.

use std::time::Duration;

use anyhow::Context;

/// A secret that never prints.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    /// `APP__DATABASE_URL`: a libpq-style URL or key=value string.
    pub database_url: Secret,
    /// `APP__HOST` (default 127.0.0.1) and `APP__PORT` (default 8080; 0 picks a free port).
    pub host: String,
    pub port: u16,
    /// `APP__DATABASE_POOL_SIZE` (default 16).
    pub database_pool_size: usize,
    /// `APP__AUTH_CACHE_MILLIS` (default 500): how long a key lookup is cached. Revocation
    /// takes effect within this plus the catalog projection's lag.
    pub auth_cache_ttl: Duration,
    /// `APP__CONSISTENCY_WAIT_MILLIS` (default 3000): the longest a read waits for its
    /// projection to reach the caller's last write.
    pub consistency_wait: Duration,
    /// `APP__APPEND_BATCH_MAX` (default 256): most commands grouped into one log transaction.
    pub append_batch_max: usize,
    /// `APP__RATE_READ_PER_SECOND` (100), `APP__RATE_WRITE_PER_SECOND` (25),
    /// `APP__RATE_AI_PER_MINUTE` (10); `APP__RATE_LIMITS=off` disables them (for measuring);
    /// `APP__RATE_RESERVE_MAX` (1000): the most tokens one reservation from the shared window
    /// takes (1 reserves per request).
    pub rate_limits: crate::ratelimit::Limits,
    /// `APP__ERASURE_BLOCKED_AFTER_MILLIS` (default 60000): how long a record deletion may
    /// wait for a projection to pass its position before it is reported `blocked`.
    pub erasure_blocked_after: Duration,
    /// Event admission: `APP__EVENT_{FLEET,SPACE,SCHEMA}_{RATE,BURST,PENDING,RECEIPTS}`
    /// (defaults: the contract's values).
    pub event_admission: crate::admission::AdmissionLimits,
    /// `APP__EVENT_RECEIPT_RETENTION_HOURS` (default 24): how long a receipt is retained
    /// after acceptance (and after its preparation is over) before it is retired.
    pub event_receipt_retention: Duration,
    /// The AI provider (`APP__AI_PROVIDER`, `APP__AI_ENDPOINT`, `APP__AI_MODEL`,
    /// `APP__AI_API_KEY`, `APP__AI_TIMEOUT_MILLIS`; see [`crate::ai::AiSettings`]).
    pub ai: crate::ai::AiSettings,
    /// Identity binding capacity per space: `APP__IDENTITY_ALIASES_PER_SPACE` (100000) and
    /// `APP__IDENTITY_CHANGES_PER_SPACE` (1000000).
    pub identity_capacity: IdentityCapacity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

impl Settings {
    pub fn from_env() -> anyhow::Result<Self> {
        let database_url = std::env::var("APP__DATABASE_URL").context("APP__DATABASE_URL is not set")?;
        // `APP__MASTER_KEY`: 64 hex characters (`openssl rand -hex 32`); it wraps every data
        // subject's key, so losing it loses all personal data in the log.
        let master_key = std::env::var("APP__MASTER_KEY")
            .context("APP__MASTER_KEY is not set (64 hex characters, for example from `openssl rand -hex 32`)")?;
        crate::crypto::install(crate::crypto::Keyring::from_hex(&master_key).context("APP__MASTER_KEY")?);
        Ok(Self {
            database_url: Secret::new(database_url),
            host: env_or("APP__HOST", "127.0.0.1".to_owned())?,
            port: env_or("APP__PORT", 8080)?,
            database_pool_size: env_or("APP__DATABASE_POOL_SIZE", 16)?,
            auth_cache_ttl: Duration::from_millis(env_or("APP__AUTH_CACHE_MILLIS", 500)?),
            consistency_wait: Duration::from_millis(env_or("APP__CONSISTENCY_WAIT_MILLIS", 3000)?),
            append_batch_max: env_or("APP__APPEND_BATCH_MAX", 256)?,
            rate_limits: crate::ratelimit::Limits {
                read: (env_or("APP__RATE_READ_PER_SECOND", 100)?, Duration::from_secs(1)),
                write: (env_or("APP__RATE_WRITE_PER_SECOND", 25)?, Duration::from_secs(1)),
                ai: (env_or("APP__RATE_AI_PER_MINUTE", 10)?, Duration::from_secs(60)),
                enabled: std::env::var("APP__RATE_LIMITS").map_or(true, |value| value != "off"),
                reserve_max: env_or("APP__RATE_RESERVE_MAX", 1000)?,
            },
            erasure_blocked_after: Duration::from_millis(env_or("APP__ERASURE_BLOCKED_AFTER_MILLIS", 60_000)?),
            event_admission: crate::admission::AdmissionLimits::from_env()?,
            event_receipt_retention: Duration::from_secs(3600 * env_or("APP__EVENT_RECEIPT_RETENTION_HOURS", 24)?),
            ai: crate::ai::AiSettings::from_env()?,
            identity_capacity: IdentityCapacity {
                aliases: env_or("APP__IDENTITY_ALIASES_PER_SPACE", 100_000)?,
                changes: env_or("APP__IDENTITY_CHANGES_PER_SPACE", 1_000_000)?,
            },
        })
    }

    /// Settings for a database URL with every other value at its default.
    /// Installs the test master key ([`crate::crypto::TEST_MASTER_KEY`]).
    pub fn for_database(database_url: &str) -> Self {
        if let Ok(keyring) = crate::crypto::Keyring::from_hex(crate::crypto::TEST_MASTER_KEY) {
            crate::crypto::install(keyring);
        }
        Self {
            database_url: Secret::new(database_url.to_owned()),
            host: "127.0.0.1".to_owned(),
            port: 0,
            database_pool_size: 16,
            auth_cache_ttl: Duration::from_millis(500),
            consistency_wait: Duration::from_millis(3000),
            append_batch_max: 256,
            rate_limits: crate::ratelimit::Limits::default(),
            erasure_blocked_after: Duration::from_secs(60),
            event_admission: crate::admission::AdmissionLimits::default(),
            event_receipt_retention: Duration::from_secs(24 * 3600),
            ai: crate::ai::AiSettings::deterministic(),
            identity_capacity: IdentityCapacity::default(),
        }
    }
}

pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(raw) => raw.parse().map_err(|error| anyhow::anyhow!("{name}={raw:?} is invalid: {error}")),
        Err(_) => Ok(default),
    }
}
