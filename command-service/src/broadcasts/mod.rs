//! Broadcasts (write permission): `PATCH /broadcasts/{id}` (name, audience, schedule) and
//! `POST /broadcasts/{id}/send` (a run, now or at the schedule), each under
//! `Idempotency-Key`. Runs are carried out by the projector's broadcast engine.

pub mod decide;
pub mod http;
pub mod store;
