//! The JSON envelope of an error answer, which the API's handlers and the pages' answers to
//! API clients share.

use actix_web::HttpResponse;
use platform::error::ApiError;

/// The answer to an error: its status, its headers (`Retry-After`, `Allow`) and the
/// contract's envelope.
pub(crate) fn error_response(error: &ApiError) -> HttpResponse {
    let mut response = HttpResponse::build(error.status());
    for (name, value) in error.headers() {
        response.insert_header((*name, value.as_str()));
    }
    response.json(error.body())
}
