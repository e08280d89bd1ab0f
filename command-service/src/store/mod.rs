//! Reads the command side needs to decide: current record states (the latest event of each
//! record's stream, which carries the whole state) and who holds each identity value.

pub mod events;
pub mod records;
pub mod suppressions;
