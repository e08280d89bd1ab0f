//! Authoring (decision D3): the declarative workspace file and applying it through the log.
//! The format is documented in `docs/workspace-file.md`.

mod apply;
mod content;
mod email;
mod format;
mod ingest;
mod workflows;

pub use apply::{
    ApplyReport, Change, PlannedWorkflow, Rules, Touched, apply, commit, describe_change, plan, wait_for_catalog,
};
pub(crate) use apply::{Planned, resource_stream};
pub use format::parse;
