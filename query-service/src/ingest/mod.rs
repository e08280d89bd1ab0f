//! The Segment-compatible ingest's failures list (`GET /ingest-failures`).

pub mod http;
