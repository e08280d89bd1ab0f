//! Records (contacts and objects): create, upsert, update, delete. `decide` holds the rules
//! (pure), `store` the reads and guards (SQL), `write` the assembly of a write that every
//! command writing records shares, `http` the handlers.

pub mod decide;
pub mod http;
pub mod store;
pub mod write;
