//! The calling key's identity.

pub mod http;
