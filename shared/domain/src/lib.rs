//! The rules of the product that more than one service needs: the catalog (schemas,
//! attributes, roles), records and their keys, suppressions, event admission, workflow
//! definitions, AI auto-fill and AI-defined filters, webhook rules, state and signing, and the
//! authored email resources. Above the platform and the filter language; no HTTP framework,
//! no mail stack.

pub mod admission;
pub mod ai;
pub mod attributes;
pub mod business_events;
pub mod catalog;
pub mod email;
pub mod engagement;
pub mod imports;
pub mod records;
pub mod roles;
pub mod suppressions;
pub mod webhooks;
pub mod workflows;
