//! Public recipient pages of an email: `GET /emails/{emailId}/unsubscribe`.

pub(crate) mod unsubscribe_page;
