//! Side-effect workers on the runtime: AI preparation, the eraser, periodic maintenance.

pub mod eraser;
pub mod maintenance;
pub mod preparation;
