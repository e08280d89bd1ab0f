//! Integration tests against a real PostgreSQL started by `scripts/test`.

mod ai;
mod audit;
mod auth;
mod authoring;
mod consistency;
mod deployment;
mod erasure;
mod errors;
mod events;
mod fake_ai;
mod hardening;
mod helpers;
mod idempotency;
mod identities;
mod log;
mod operations;
mod poison;
mod projector;
mod properties;
mod ratelimit;
mod records;
mod runtime;
mod schemas;
mod suppressions;
mod upsert;
