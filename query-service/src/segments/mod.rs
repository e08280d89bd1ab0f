//! Segments (read permission): the list of the caller's space, newest first, one by id with
//! its member count, and its contacts. The filter a segment was made into is never shown; its
//! description is.

pub mod http;
pub mod store;
