//! `GET /record-deletions/{operationId}`: the status of a record deletion operation.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::data_body;
use platform::error::ApiError;
use platform::error::Code;
use serde_json::Value;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const DELETIONS: &str = "deletions";

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let operation_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (row, consistent) = consistent_read(&state, &caller, token, &[DELETIONS], |client, models| {
        let d = models.schema(DELETIONS);
        let (operation_id, space_id) = (operation_id.clone(), space_id.clone());
        Box::pin(async move { store::get(client, &d, &operation_id, &space_id).await })
    })
    .await?;
    let document: Value = row.ok_or_else(|| {
        ApiError::of(Code::RecordDeletionNotFound, format!("no record deletion {operation_id:?} in this space"))
    })?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
