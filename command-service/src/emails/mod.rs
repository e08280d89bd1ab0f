//! Public recipient actions on an email (`POST /emails/{emailId}/unsubscribe`, the one-click
//! unsubscribe, and `POST /emails/{emailId}/preferences`, the preference page's choices), and
//! the consent and subscription changes email actions make.

pub mod consent;
pub mod decide;
pub mod preferences;
pub mod unsubscribe;
