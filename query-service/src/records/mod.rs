//! Records (contacts and objects): a page of a schema's records, and one record.

pub mod http;
pub mod store;
