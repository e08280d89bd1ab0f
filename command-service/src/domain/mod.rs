//! Decisions: pure functions from state and command to events or a refusal. No IO here.

pub mod events;
pub mod records;
pub mod suppressions;
