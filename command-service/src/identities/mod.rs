//! Anonymous identity binding (`POST /event-identities`).

pub mod http;
