//! Email workers: the outbox (hand-offs the inline path did not finish).

pub mod outbox;
