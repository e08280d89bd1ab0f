//! The write assembly of record writes, shared by every command that writes records (the
//! record endpoints, template sends, forms, emails, workflows): turning a decision into the
//! streams and guards to append, with the subject's data key and its personal data sealed
//! (the domain's, shared with the import worker). Pure: new keys come from the decision's
//! `Fresh`.

pub(crate) use domain::records::write::{Write, create_write, identity_values, update_write};
