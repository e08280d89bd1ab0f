//! Side-effect workers on the runtime: AI preparation, the eraser, periodic maintenance, and
//! webhook delivery, the email outbox.

pub mod broadcasts;
pub mod email;
pub mod eraser;
pub mod maintenance;
pub mod preparation;
pub mod segments;
pub mod webhooks;
