//! `POST /templates/{templateId}/send`: the context records written, the recipient checked,
//! the template rendered, the send appended with its outbox row, and the message handed to
//! the relay inline (see the `mail` crate, "Email").

pub mod decide;
pub mod hand_off;
pub mod http;
pub mod preview;
pub mod test_send;
