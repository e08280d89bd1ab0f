//! The HTTP edge of the API, and the only crate that knows actix: the error envelope as an
//! answer, reading and checking bodies and query strings, the route table, authentication,
//! rate limits, pagination, the pages a person sees, and the operations endpoints (health,
//! readiness, metrics).

pub mod auth;
mod envelope;
pub mod http;
pub mod live_load;
pub mod ops;
pub mod pages;
pub mod pagination;
pub mod query;
pub mod ratelimit;
pub mod routes;
