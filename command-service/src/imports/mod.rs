//! Bulk imports: the intake of an import and its parts (`http`), and the operator's
//! `import` command (`cli`). The rules live in
//! `domain::imports`; the rows are decided by the projector's `imports` worker.

pub mod cli;
pub mod http;
mod store;
