//! Schemas and their attributes, from the catalog read model.

pub mod http;
pub mod store;
