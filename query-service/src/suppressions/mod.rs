//! The suppression list: the caller's space and global suppressions, newest first.

pub mod http;
pub mod store;
