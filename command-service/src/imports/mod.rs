//! Bulk imports: the intake of an import and its parts (`http`, its request checks and
//! refusals in `decide`), and the operator's `import` command (`cli`, which checks its file
//! whole in `file` before storing any of it). The rules live in
//! `domain::imports`; the rows are decided by the projector's `imports` worker.

pub mod cli;
pub(crate) mod decide;
mod file;
pub mod http;
pub(crate) mod store;
