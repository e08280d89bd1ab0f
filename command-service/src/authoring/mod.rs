//! Authoring (decision D3): the declarative workspace file and applying it through the log.
//! The format is documented in `docs/workspace-file.md`.

mod apply;
mod email;
mod format;
mod workflows;

pub use apply::{ApplyReport, Change, Planned, apply, commit, describe, plan, resource_stream, wait_for_catalog};
pub use format::{Workspace, parse};
