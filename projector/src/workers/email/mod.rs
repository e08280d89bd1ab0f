//! Email workers: the outbox (hand-offs the inline path did not finish), held sends (decided
//! again at their time) and the DNS checks of sending domains.

pub mod domains;
pub mod held;
pub mod outbox;
pub(crate) mod recipients;
