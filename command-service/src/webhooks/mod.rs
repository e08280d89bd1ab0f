//! Outgoing webhooks: create, update, delete, rotate-secret. `decide` validates (pure),
//! `store` loads a webhook from its stream and makes the guards, `http` runs the operations.

pub mod decide;
pub mod http;
pub mod store;
