//! Anonymous identity binding (`POST /event-identities`): `decide` holds the rules (pure),
//! `store` the reads and guards (SQL), `http` the handler.

pub mod decide;
pub mod http;
pub mod store;
