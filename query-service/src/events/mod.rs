//! Business events: the cursor list of ready events and an event's readiness status.

pub mod http;
pub mod store;
pub mod window;
