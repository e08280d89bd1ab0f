//! `GET /emails/{emailId}`: the story of one email of the caller's space (read permission).

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::data_body;
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
