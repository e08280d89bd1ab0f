//! Integration tests against a real PostgreSQL started by `scripts/test`.

mod auth;
mod authoring;
mod consistency;
mod deployment;
mod errors;
mod helpers;
mod idempotency;
mod log;
mod projector;
mod ratelimit;
mod records;
mod schemas;
mod suppressions;
mod upsert;
