//! Records (contacts and objects): create, upsert, update, delete. `decide` holds the
//! commands' decisions and the rules (pure), `write` the assembly of a write that every
//! command writing records shares (pure), `load` what those commands read through the
//! pipeline, `store` the reads and guards (SQL), `http` the handlers.

pub mod decide;
pub mod http;
pub mod load;
pub mod store;
pub mod topics;
pub mod write;
