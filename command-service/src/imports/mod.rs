//! Bulk imports: the intake of an import and its parts (`http`). The rules live in
//! `domain::imports`; the rows are decided by the projector's `imports` worker.

pub mod http;
