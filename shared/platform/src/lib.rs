//! The platform every component stands on: the event log's client, the database pool and its
//! migrations, the process's keyring and randomness, settings, read-model access, process
//! start-up, liveness, telemetry and the clock, over the `kernel` (the log's event types, the
//! codes, keys and sealing, ids, time formats), whose modules it re-exports under the same
//! names. It knows no HTTP framework: an error is plain data ([`error::ApiError`]) that the
//! `api` crate answers.

pub mod batch;
pub mod crypto;
pub mod cursor;
pub mod db;
pub mod error;
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

pub use kernel::{events, proto};
