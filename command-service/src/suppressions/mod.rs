//! The email suppression list: create, batch create, batch remove, delete.

pub mod decide;
pub mod http;
pub mod store;

use platform::proto;

/// The subject a suppression's log events are about: its email address, as a keyed digest
/// under the master key (`platform::crypto::email_subject`), so a contact's audit trail finds
/// them. The shell computes it: a decision draws nothing from the keyring.
pub(crate) fn subject_of(added: &proto::SuppressionAdded) -> anyhow::Result<Option<String>> {
    let personal: Option<proto::SuppressionPersonal> =
        platform::events::open(added.personal.as_ref(), &platform::crypto::Keys::default())?;
    personal.map(|personal| platform::crypto::email_subject(&personal.identifier)).transpose()
}

/// A suppression to add: an email address and `manual` or `legal` (or, authored, any reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewSuppression {
    pub identifier: String,
    pub reason: String,
}
