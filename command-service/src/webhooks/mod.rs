//! Outgoing webhooks: create, update, delete, rotate (see docs/design/webhooks.md). So far the
//! pure decision; the handlers and the store come with the operations.

pub mod decide;
