//! The admission limits of business events, per scope (the contract's values by default); set
//! by `APP__EVENTS__ADMISSION__*` through `platform::settings`, decided on by
//! `domain::admission`.

/// The limits of one scope.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScopeLimits {
    /// Sustained admissions per second (the token bucket's refill rate).
    pub rate: f64,
    /// Admissions allowed at once (the bucket's size).
    pub burst: f64,
    /// Events pending preparation.
    pub pending: i64,
    /// Receipts retained.
    pub receipts: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AdmissionLimits {
    pub fleet: ScopeLimits,
    pub space: ScopeLimits,
    pub schema: ScopeLimits,
}

impl Default for AdmissionLimits {
    /// The contract's values.
    fn default() -> Self {
        Self {
            fleet: ScopeLimits { rate: 100.0, burst: 200.0, pending: 10_000, receipts: 1_000_000 },
            space: ScopeLimits { rate: 10.0, burst: 30.0, pending: 1_000, receipts: 50_000 },
            schema: ScopeLimits { rate: 5.0, burst: 15.0, pending: 500, receipts: 20_000 },
        }
    }
}
