//! Every route of the command service, in one place.

use actix_web::web;

use super::{events, identities, records, suppressions};

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/schemas/{schema}/records", web::post().to(records::create))
        .route("/schemas/{schema}/records/upsert", web::post().to(records::upsert))
        .route("/schemas/{schema}/records/{id}", web::patch().to(records::update))
        .route("/schemas/{schema}/records/{id}", web::delete().to(records::delete))
        .route("/contacts/suppressions", web::post().to(suppressions::create))
        .route("/contacts/suppressions/batch", web::post().to(suppressions::batch_create))
        .route("/contacts/suppressions/batch-remove", web::post().to(suppressions::batch_remove))
        .route("/contacts/suppressions/{id}", web::delete().to(suppressions::delete))
        .route("/events/{schema}", web::post().to(events::fire))
        .route("/events/{schema}/batch", web::post().to(events::batch))
        .route("/event-identities", web::post().to(identities::change));
}
