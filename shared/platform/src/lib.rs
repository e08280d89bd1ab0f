//! The platform every component stands on: the event log client and the log's event types,
//! the database pool and its migrations, keys and encryption, settings, read-model access,
//! process start-up, liveness, telemetry, ids and time. It knows no HTTP framework: an error
//! is plain data ([`error::ApiError`]) that the `api` crate answers.

pub mod batch;
pub mod crypto;
pub mod cursor;
pub mod db;
pub mod error;
pub mod events;
pub mod fresh;
pub mod ids;
pub mod liveness;
pub mod log;
pub mod process;
#[cfg(feature = "progress")]
pub mod progress;
pub mod readmodel;
pub mod refusal;
pub mod settings;
pub mod storable;
pub mod telemetry;
pub mod time;

/// Types generated from `schemas/platform/events/v1/*.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/platform.events.v1.rs"));

    /// The encoded `FileDescriptorSet` of the same schemas: every message's fields by name and
    /// type, for tools that show an event as a person reads it (`apply --dry-run`).
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/events.descriptors"));
}
