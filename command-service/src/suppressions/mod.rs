//! The email suppression list: create, batch create, batch remove, delete.

pub mod decide;
pub mod http;
pub mod store;

/// A suppression to add: an email address and `manual` or `legal` (or, authored, any reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSuppression {
    pub identifier: String,
    pub reason: String,
}
