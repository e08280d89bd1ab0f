//! The webhook delivery engine: `enqueue` follows the log and fills the outbox, `deliver`
//! attempts due deliveries, signs them, retries them and keeps each webhook's counters.

mod decide;
pub mod deliver;
pub mod enqueue;
