//! The kernel: what a decision may use, and nothing that reaches out. The log's events and
//! their sealing, the appends a decision builds (streams, events and guards as data), the
//! error codes with their statuses and the [`refusal::Refusal`] trait, keys, what a decision
//! draws ([`fresh::Fresh`]), ids and time formats.
//!
//! It links no runtime, database client, pool, HTTP framework or random number generator, so
//! `domain`, which stands on it alone, cannot read the clock through a helper, open a
//! connection or draw a value a test cannot give. `platform` adds the IO on top (the log's
//! client, the pool, the process's keyring, [`fresh::Fresh`]'s drawn source, the clock) and
//! re-exports these modules under the same names.

pub mod crypto;
pub mod error;
pub mod events;
pub mod fresh;
pub mod ids;
pub mod limits;
pub mod log;
pub mod refusal;
pub mod storable;
pub mod time;

/// Types generated from `schemas/platform/events/v1/*.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/platform.events.v1.rs"));

    /// The encoded `FileDescriptorSet` of the same schemas: every message's fields by name and
    /// type, for tools that show an event as a person reads it (`apply --dry-run`).
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/events.descriptors"));
}
