//! What one outbound HTTP attempt came to, as webhook delivery and a journey's webhook step
//! read it (the transport that makes the attempt, and the classification of its answer, are
//! the projector's: `workers/outbound.rs`).

use std::time::Duration;

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult {
    Delivered {
        status: u16,
    },
    /// A failure worth retrying (network, timeout, 408, 429, 5xx), after at least
    /// `retry_after` when the receiver asked.
    Retryable {
        status: Option<u16>,
        error: String,
        retry_after: Option<Duration>,
    },
    /// 410 Gone: the webhook is paused.
    Gone,
    /// Any other answer: failed without retry.
    Rejected {
        status: Option<u16>,
        error: String,
    },
}
