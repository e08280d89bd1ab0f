//! The Segment-compatible ingest: the Segment HTTP Tracking API's paths, authenticated by the
//! write keys of the workspace file. `keys` finds a request's write key, `http` reads the
//! request, `run` applies its messages through the command pipeline, `decide` holds what each
//! message writes (pure).

pub mod decide;
pub mod http;
pub mod keys;
pub mod run;
pub mod write_key;
