//! `GET /workflows`, `GET /workflows/{id}`, `GET /workflows/{id}/runs` and `GET
//! /workflows/{id}/runs/{runId}` (with its step-history window), from the `workflows` read
//! model.

pub mod http;
pub mod store;
pub mod window;
