//! Every route of the query service, in one place.

use actix_web::{HttpResponse, web};

use crate::{audit, deletions, events, me, records, schemas, suppressions};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/openapi.json", web::get().to(openapi))
        .route("/me", web::get().to(me::http::get))
        .route("/schemas", web::get().to(schemas::http::list))
        .route("/schemas/{schema}", web::get().to(schemas::http::get))
        .route("/schemas/{schema}/attributes", web::get().to(schemas::http::attributes))
        .route("/schemas/{schema}/records", web::get().to(records::http::list))
        .route("/schemas/{schema}/records/{id}", web::get().to(records::http::get))
        .route("/schemas/{schema}/records/{id}/audit-trail", web::get().to(audit::http::get))
        .route("/record-deletions/{operationId}", web::get().to(deletions::http::get))
        .route("/contacts/suppressions", web::get().to(suppressions::http::list))
        .route("/events", web::get().to(events::http::list))
        .route("/events/{schema}/{id}/status", web::get().to(events::http::status));
}

/// The OpenAPI 3.1 document, kept in the repo at `docs/openapi.json`.
pub const OPENAPI: &str = include_str!("../../docs/openapi.json");

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(OPENAPI)
}
