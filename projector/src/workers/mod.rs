//! Side-effect workers on the runtime: AI preparation, the eraser, periodic maintenance, and
//! webhook delivery, the email outbox, broadcast runs, the workflow engine, and the opens and
//! clicks taken in by the tracking endpoints.

pub mod broadcasts;
pub mod email;
pub mod engagement;
pub mod eraser;
pub mod imports;
pub mod maintenance;
pub(crate) mod outbound;
pub mod preparation;
pub mod segments;
pub mod webhooks;
pub mod workflows;
