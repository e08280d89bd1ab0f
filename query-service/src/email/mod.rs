//! Reads of the authored email resources: `GET /domains`, `/senders`, `/topics`,
//! `/templates` and each by id, from the catalog read model.

pub mod http;
mod store;
