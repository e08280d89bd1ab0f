//! Public recipient actions on an email (`POST /emails/{emailId}/unsubscribe`), and the
//! consent and subscription changes email actions make.

pub mod consent;
pub mod unsubscribe;
