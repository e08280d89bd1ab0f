//! Broadcasts (read permission): the list of the caller's space and one by id, from the
//! `broadcasts` read model; a broadcast's runs, newest first, and one run, with its counts,
//! from the run engine's own tables (`broadcast_runs`, `broadcast_recipients` and the email
//! outbox), which no replay of the log could rebuild.

pub mod http;
pub mod store;
