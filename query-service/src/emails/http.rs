//! `GET /emails/{emailId}`: the story of one email of the caller's space; `GET
//! /emails?contactId=`: a contact's emails, newest first (read permission).

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

const EMAILS: &str = "emails";

pub(crate) async fn get(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let email_id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (document, consistent) = consistent_read(&state, &caller, token, &[EMAILS], |client, models| {
        let (m, space_id, email_id) = (models.schema(EMAILS), space_id.clone(), email_id.clone());
        Box::pin(async move { store::email(client, &m, &space_id, &email_id).await })
    })
    .await?;
    let document = document
        .ok_or_else(|| ApiError::not_found(Code::EmailNotFound, format!("no email {email_id:?} in this space")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// A contact's emails of the caller's space, newest first, without their timelines.
pub(crate) async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    let contact_id = match api::query::query_value(&query, "contactId").map(str::trim) {
        Some(contact_id) if !contact_id.is_empty() => contact_id.to_owned(),
        _ => {
            return Err(ApiError::bad_request(
                Code::InvalidQueryParameter,
                "contactId is required: the contact whose emails to list",
            ));
        }
    };
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[EMAILS], |client, models| {
        let (m, space_id, contact_id) = (models.schema(EMAILS), space_id.clone(), contact_id.clone());
        Box::pin(async move { store::of_contact(client, &m, &space_id, &contact_id, (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
