//! Webhooks (read permission): the list of the caller's space, newest first, and one by id,
//! each with the delivery engine's counters. The secret is never shown here.

pub mod http;
pub mod store;
