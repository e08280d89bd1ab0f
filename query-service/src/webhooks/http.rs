//! `GET /webhooks` and `GET /webhooks/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use shared::error::{ApiError, Code};
use shared::http::{data_body, page_body, query_pairs};
use shared::pagination::PageRequest;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const WEBHOOKS: &str = "webhooks";

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[WEBHOOKS], |client, models| {
        let (w, space_id) = (models.schema(WEBHOOKS), space_id.clone());
        Box::pin(async move { store::page(client, &w, &space_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

pub async fn get(req: HttpRequest, path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let webhook_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[WEBHOOKS], |client, models| {
        let (w, space_id, webhook_id) = (models.schema(WEBHOOKS), space_id.clone(), webhook_id.clone());
        Box::pin(async move { store::get(client, &w, &space_id, &webhook_id).await })
    })
    .await?;
    let document = document.ok_or_else(|| {
        ApiError::not_found(Code::WebhookNotFound, format!("no webhook {webhook_id:?} in this space"))
    })?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}
