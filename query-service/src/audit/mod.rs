//! A contact's audit trail, answered from the log.

pub mod http;
pub mod store;
pub mod trail;
