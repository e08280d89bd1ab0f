//! `GET /record-deletions/{operationId}`: the status of a record deletion operation.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::{Value, json};
use shared::error::ApiError;
use shared::error::Code;
use shared::http::data_body;
use shared::time::format_timestamp;

use super::{authorize_read, consistent_read, respond};
use crate::State;

const DELETIONS: &str = "deletions";

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let operation_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (row, consistent) = consistent_read(&state, &caller, token, &[DELETIONS], |client, models| {
        let d = models.schema(DELETIONS);
        let (operation_id, space_id) = (operation_id.clone(), space_id.clone());
        Box::pin(async move {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT operation_id, status, message, record_id, schema_id, requested_at, completed_at
                     FROM {d}.deletions WHERE operation_id = $1 AND space_id = $2"
                ))
                .await?;
            let row = client.query_opt(&statement, &[&operation_id, &space_id]).await?;
            Ok(row.map(|row| {
                json!({
                    "operationId": row.get::<_, String>(0),
                    "status": row.get::<_, String>(1),
                    "message": row.get::<_, String>(2),
                    "recordId": row.get::<_, String>(3),
                    "schemaId": row.get::<_, String>(4),
                    "requestedAt": format_timestamp(row.get(5)),
                    "completedAt": row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(6).map(format_timestamp),
                })
            }))
        })
    })
    .await?;
    let document: Value = row.ok_or_else(|| {
        ApiError::not_found(Code::RecordDeletionNotFound, format!("no record deletion {operation_id:?} in this space"))
    })?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
