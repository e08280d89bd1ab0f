//! The rules of the product that more than one service needs: the catalog (schemas,
//! attributes, roles), records and their keys, suppressions, event admission, workflow
//! definitions, webhook rules, state and signing, the authored email resources, engagement
//! and the send decision. Above the kernel and the filter language; rules only: no runtime,
//! database, HTTP client, file format or mail stack (what feeds them is `reads`', the AI
//! provider `ai-provider`'s, an import file's reading `import-file`'s).

pub mod admission;
pub mod attributes;
pub mod business_events;
pub mod catalog;
pub mod email;
pub mod engagement;
pub mod imports;
pub mod ingest;
pub mod records;
pub mod roles;
pub mod suppressions;
pub mod webhooks;
pub mod workflows;
