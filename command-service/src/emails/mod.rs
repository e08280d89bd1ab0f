//! Public recipient actions on an email: `POST /emails/{emailId}/unsubscribe`.

pub mod unsubscribe;
