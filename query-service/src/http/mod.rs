//! The HTTP surface of the query service.

pub mod me;
pub mod records;
pub mod routes;
pub mod schemas;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use serde_json::Value;
use shared::auth::{Caller, Permission};
use shared::error::ApiError;
use shared::pagination::Warning;
use shared::readmodel::Consistent;

use crate::State;

/// The header a writer may pass to read its write with another key.
pub const CONSISTENCY_TOKEN: &str = "consistency-token";

/// Authorises a read and waits until the read models it uses include the caller's last
/// write (by this key, or named by a `Consistency-Token` header).
pub async fn begin_read(state: &State, req: &HttpRequest, models: &[&str]) -> Result<(Caller, Consistent), ApiError> {
    let caller = state.authenticator.authorize(req, Permission::Read).await?;
    let required = required_position(state, req, caller.key_id()).await?;
    let consistent = state.read_models.wait_for(models, required, state.settings.consistency_wait).await?;
    Ok((caller, consistent))
}

async fn required_position(state: &State, req: &HttpRequest, key_id: &str) -> Result<i64, ApiError> {
    let token = match req.headers().get(CONSISTENCY_TOKEN) {
        None => 0,
        Some(value) => value.to_str().ok().and_then(|text| text.trim().parse::<i64>().ok()).ok_or_else(|| {
            ApiError::bad_request("invalid_consistency_token", "Consistency-Token must be a log position (an integer)")
        })?,
    };
    let client = state.pool.get().await?;
    let row = client.query_opt("SELECT position FROM key_positions WHERE key_id = $1", &[&key_id]).await?;
    Ok(row.map_or(0, |row| row.get::<_, i64>(0)).max(token))
}

/// A 200 with `Projection-Position`, and a warning when the read models had not caught up.
pub fn respond(
    consistent: &Consistent,
    mut warnings: Vec<Warning>,
    body: impl FnOnce(&[Warning]) -> Value,
) -> HttpResponse {
    if !consistent.reached {
        warnings.push(Warning {
            code: "stale_read",
            message: format!(
                "the read model is at position {} and has not reached your last write at {}; retry to see it",
                consistent.position(),
                consistent.required
            ),
        });
    }
    HttpResponse::build(StatusCode::OK)
        .insert_header(("Projection-Position", consistent.position().to_string()))
        .json(body(&warnings))
}
