//! What the command service, the query service and the projector share: the log event
//! types and the log client, the error envelope, authentication, pagination, settings,
//! the database pool and the read-model access helpers.

pub mod admission;
pub mod ai;
pub mod attributes;
pub mod auth;
pub mod batch;
pub mod canonical;
pub mod catalog;
pub mod crypto;
pub mod db;
pub mod echo;
pub mod email;
pub mod error;
pub mod events;
pub mod filter;
pub mod http;
pub mod ids;
pub mod liveness;
pub mod log;
pub mod ops;
pub mod pages;
pub mod pagination;
pub mod process;
pub mod progress;
pub mod query;
pub mod ratelimit;
pub mod readmodel;
pub mod records;
pub mod roles;
pub mod routes;
pub mod settings;
pub mod storable;
pub mod suppressions;
pub mod telemetry;
pub mod time;
pub mod webhooks;
pub mod workflows;

/// Types generated from `schemas/platform/events/v1/*.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/platform.events.v1.rs"));
}
