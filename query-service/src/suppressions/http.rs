//! `GET /contacts/suppressions` (admin): newest first, the caller's space and global ones.

use actix_web::{HttpRequest, HttpResponse, web};
use api::auth::Permission;
use api::http::{page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::ApiError;
use platform::error::Code;

use super::store;
use crate::State;
use crate::consistency::{consistent_read, respond};

const SUPPRESSIONS: &str = "suppressions";

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    // A filter that is given must be an email address: an empty or malformed one is refused
    // rather than ignored (which would list everything) or matched (which finds nothing).
    let identifier = api::http::query_value(&query, "identifier")
        .map(|value| {
            domain::attributes::normalize_email(value).map_err(|_| {
                ApiError::of(
                    Code::InvalidQueryParameter,
                    format!("identifier must be an email address; got {:?}", platform::storable::escaped(value)),
                )
            })
        })
        .transpose()?;
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let token = crate::consistency::consistency_token(&req)?;
    let scopes = vec![caller.space_id().to_owned(), "global".to_owned()];
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[SUPPRESSIONS], |client, models| {
        let (s, scopes, identifier) = (models.schema(SUPPRESSIONS), scopes.clone(), identifier.clone());
        Box::pin(async move { store::page(client, &s, &scopes, identifier.as_deref(), (limit, offset)).await })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
