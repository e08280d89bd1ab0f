//! Business events: fire and batch fire, with receipts and admission.

pub mod decide;
pub mod http;
pub mod store;
