//! Side-effect workers on the runtime: AI preparation, the eraser, periodic maintenance, and
//! webhook delivery, the email outbox, broadcast runs and the workflow engine.

pub mod broadcasts;
pub mod email;
pub mod eraser;
pub mod maintenance;
pub(crate) mod outbound;
pub mod preparation;
pub mod segments;
pub mod webhooks;
pub mod workflows;
