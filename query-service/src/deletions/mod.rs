//! The status of a record deletion operation.

pub mod http;
pub mod store;
