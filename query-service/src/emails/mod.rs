//! Public recipient pages of an email: `GET /emails/{emailId}/unsubscribe`.

pub mod unsubscribe_page;
