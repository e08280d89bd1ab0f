//! Records (contacts and objects): create, upsert, update, delete. `decide` holds the rules
//! (pure), `store` the reads and guards (SQL), `http` the handlers.

pub mod decide;
pub mod http;
pub mod store;
