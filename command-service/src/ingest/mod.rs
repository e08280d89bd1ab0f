//! The Segment-compatible ingest: the Segment HTTP Tracking API's paths, authenticated by the
//! write keys of the workspace file. `keys` finds a request's write key, `http` reads the
//! request, `run` applies its messages through the command pipeline, `decide` holds what each
//! message writes (pure).
//!
//! # Ingest
//!
//! The Segment HTTP Tracking API (`POST /v1/batch` and the single-message paths) is a door to
//! the same commands, not a pipeline of its own. `ingest/http.rs` counts the request in the write
//! key's bucket, reads the body (gzip decoded with a bound), finds the write key
//! (`ingest/keys.rs`: by hash among the catalog's `write_key` resources, cached a moment), checks
//! the envelope and reads each message (`domain::ingest`). `ingest/run.rs` splits the messages
//! into clusters that share an id and applies each cluster in order, the clusters side by side,
//! each message through `pipeline::run` as the write key (`Actor::WriteKey`: its appends carry
//! the write key as their actor): `Resolve` (the contact by userId, alias or email, created when
//! unknown, the alias bound; an identify's traits; what no attribute holds, kept as
//! `IngestMessageKept`), then the events' own `FireEvent` for a track, page or screen (`eventId`
//! is the `messageId`, so the receipts make a message sent again a duplicate), or `JoinGroup`.
//! Their appends share log transactions with everything else through the append batcher (group
//! commit). What could not be applied is one `RecordRefusals` append: `IngestMessagesRefused` and
//! the messages as sent in `ingest_failures`, which `GET /v1/ingest-failures` reads and
//! `platform status` counts. Nothing is acknowledged before its append: a killed service answers
//! no 200, and the client's retry records each message once.

pub mod decide;
pub mod http;
pub mod keys;
pub mod run;
pub mod write_key;
