//! The record rules (pure) live in `domain::records::decide`, shared with the import worker.

pub use domain::records::decide::*;
