//! Workflows (write permission): `POST /workflows/{referenceId}` (a run), `POST
//! /workflows/{id}/pause` and `/unpause`, each under `Idempotency-Key`. Runs are carried out by
//! the projector's workflow engine.

pub mod decide;
pub mod http;
pub mod store;
