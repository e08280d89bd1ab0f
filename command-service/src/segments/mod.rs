//! Segments (write permission): `POST /segments` (the `ai` bucket; one AI credit) and
//! `DELETE /segments/{id}`, each under `Idempotency-Key`. Membership is the projector's
//! `segments` read model.

pub mod decide;
pub mod http;
pub mod store;
