//! Email workers: the outbox (hand-offs the inline path did not finish) and the DNS checks
//! of sending domains.

pub mod domains;
pub mod outbox;
