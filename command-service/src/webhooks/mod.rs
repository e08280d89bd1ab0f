//! Outgoing webhooks: create, update, delete, rotate-secret, replay a delivery, send a test.
//! `decide` validates and decides (pure), `store` loads a webhook from its stream and makes the
//! guards, `http` loads what the decisions need and runs the operations.

pub mod decide;
pub mod http;
pub mod store;
