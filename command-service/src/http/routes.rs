//! Every route of the command service, in one place.

use actix_web::web;

use super::records;

pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/schemas/{schema}/records", web::post().to(records::create))
        .route("/schemas/{schema}/records/upsert", web::post().to(records::upsert))
        .route("/schemas/{schema}/records/{id}", web::patch().to(records::update));
}
