//! The email suppression list: create, batch create, batch remove, delete.

pub mod decide;
pub mod http;
pub mod store;
