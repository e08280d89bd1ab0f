//! What every write handler shares at the HTTP edge: the log metadata of a request and the
//! token of what it wrote. (How a refusal or a failed append is answered is `platform::error`'s:
//! each refusal type says its code and issues, the code table gives the status.)

use actix_web::HttpRequest;
use api::auth::Caller;
use platform::log::Metadata;

/// The log metadata of a write by `caller`.
pub fn metadata(req: &HttpRequest, caller: &Caller, idempotency_key: Option<String>) -> Metadata {
    Metadata {
        space_id: Some(caller.space_id().to_owned()),
        actor_key_id: Some(caller.key_id().to_owned()),
        actor_user_id: Some(caller.identity.user_id.clone()),
        request_id: Some(api::http::request_id(req)),
        idempotency_key,
    }
}

/// Adds `Consistency-Token` (the last position written) when something was appended.
pub fn consistency_token(response: &mut actix_web::HttpResponseBuilder, appended: Option<platform::log::Appended>) {
    if let Some(appended) = appended.filter(|a| a.last_position > 0) {
        response.insert_header(("Consistency-Token", appended.last_position.to_string()));
    }
}
