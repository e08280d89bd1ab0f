//! `GET /workflows`, `GET /workflows/{id}`, `GET /workflows/{id}/stats`, `GET
//! /workflows/{id}/revisions`, `GET /workflows/{id}/runs` and `GET /workflows/{id}/runs/{runId}`
//! (with its step-history window), from the `workflows` read model (and the `emails` one for a
//! send step's emails).

pub mod http;
mod revisions;
mod stats;
pub mod store;
pub mod window;
