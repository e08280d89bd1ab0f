//! An email: `GET /emails/{emailId}` (its story, from the `emails` read model) and the public
//! recipient page `GET /emails/{emailId}/unsubscribe`.

pub(crate) mod http;
pub(crate) mod log;
pub(crate) mod store;
pub(crate) mod unsubscribe_page;
