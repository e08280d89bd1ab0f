//! `GET /me`: the calling key's identity. Resolves no membership and needs no permission.

use actix_web::{HttpRequest, HttpResponse, web};
use platform::error::ApiError;
use platform::time::format_timestamp;
use serde_json::{Value, json};

use crate::State;

pub async fn get(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let identity = state.authenticator.identify(&req).await?;
    // `/me` reads no read model, but a malformed `Consistency-Token` is refused here as on
    // every other GET: one rule everywhere.
    crate::consistency::consistency_token(&req)?;
    let space = identity.bound_space.as_ref().map(|(id, slug, name)| json!({"id": id, "slug": slug, "name": name}));
    let role = identity.bound_space_id.as_ref().and_then(|space_id| {
        identity.memberships.iter().find(|membership| &membership.space_id == space_id).map(|membership| {
            json!({
                "name": membership.role.name(),
                "label": membership.role.label(),
                "description": membership.role.description(),
            })
        })
    });
    let data = json!({
        "apiKey": {
            "id": identity.key_id,
            "name": identity.name,
            "keyDisplay": identity.key_display,
            "createdAt": format_timestamp(identity.created_at),
        },
        "user": { "id": identity.user_id, "name": identity.user_name, "email": identity.user_email },
        "space": space.unwrap_or(Value::Null),
        "role": role.unwrap_or(Value::Null),
    });
    Ok(HttpResponse::Ok().json(json!({ "data": data })))
}
