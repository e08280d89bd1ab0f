//! The reads of stored state that more than one tier makes, so that `domain` holds rules
//! only: the catalog (keys, schemas, write contexts, authored resources), records' latest
//! states and identity holders, a business event's acceptance, a contact's subscriptions and
//! suppression, an import's status, and a webhook's state. Each function is one statement
//! (or a few) over the log or a read model, and hands `domain`'s types to the caller.

pub mod business_events;
pub mod catalog;
pub mod email;
pub mod experiments;
pub mod imports;
pub mod ingest;
pub mod records;
pub mod webhooks;
