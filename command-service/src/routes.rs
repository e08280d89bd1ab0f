//! Every route of the command service, in one place.

use actix_web::web;

use crate::{events, identities, records, suppressions};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/schemas/{schema}/records", web::post().to(records::http::create))
        .route("/schemas/{schema}/records/upsert", web::post().to(records::http::upsert))
        .route("/schemas/{schema}/records/{id}", web::patch().to(records::http::update))
        .route("/schemas/{schema}/records/{id}", web::delete().to(records::http::delete))
        .route("/contacts/suppressions", web::post().to(suppressions::http::create))
        .route("/contacts/suppressions/batch", web::post().to(suppressions::http::batch_create))
        .route("/contacts/suppressions/batch-remove", web::post().to(suppressions::http::batch_remove))
        .route("/contacts/suppressions/{id}", web::delete().to(suppressions::http::delete))
        .route("/events/{schema}", web::post().to(events::http::fire))
        .route("/events/{schema}/batch", web::post().to(events::http::batch))
        .route("/event-identities", web::post().to(identities::http::change));
}
