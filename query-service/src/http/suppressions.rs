//! `GET /contacts/suppressions` (admin): newest first, the caller's space and global ones.

use actix_web::{HttpRequest, HttpResponse, web};
use shared::auth::Permission;
use shared::error::ApiError;
use shared::error::Code;
use shared::http::{page_body, query_pairs};
use shared::pagination::PageRequest;
use tokio_postgres::types::ToSql;

use super::{consistent_read, page_of_docs, respond};
use crate::State;

const SUPPRESSIONS: &str = "suppressions";

pub async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let page = PageRequest::parse(&query)?;
    // A filter that is given must be an email address: an empty or malformed one is refused
    // rather than ignored (which would list everything) or matched (which finds nothing).
    let identifier = shared::http::query_value(&query, "identifier")
        .map(|value| {
            shared::attributes::normalize_email(value).map_err(|_| {
                ApiError::bad_request(
                    Code::InvalidQueryParameter,
                    format!("identifier must be an email address; got {:?}", shared::storable::escaped(value)),
                )
            })
        })
        .transpose()?;
    let caller = state.authenticator.authorize(&req, Permission::Admin).await?;
    let token = super::consistency_token(&req)?;
    let scopes = vec![caller.space_id().to_owned(), "global".to_owned()];
    let (limit, offset) = (page.limit(), page.offset());
    let ((total, items), consistent) = consistent_read(&state, &caller, token, &[SUPPRESSIONS], |client, models| {
        let (s, scopes, identifier) = (models.schema(SUPPRESSIONS), scopes.clone(), identifier.clone());
        Box::pin(async move {
            let (count_sql, rows_sql) = match identifier {
                // One identifier has a handful of rows: counting them is cheap.
                Some(_) => (
                    format!("SELECT count(*) FROM {s}.suppressions WHERE scope = ANY($1) AND identifier = $2"),
                    format!(
                        "SELECT doc FROM {s}.suppressions WHERE scope = ANY($1) AND identifier = $2
                         ORDER BY created_at DESC, suppression_id DESC LIMIT $3 OFFSET $4"
                    ),
                ),
                None => (
                    format!(
                        "SELECT COALESCE(sum(total), 0)::bigint FROM {s}.suppression_counts
                         WHERE scope = ANY($1) AND $2::text IS NULL"
                    ),
                    format!(
                        "SELECT doc FROM {s}.suppressions WHERE scope = ANY($1) AND $2::text IS NULL
                         ORDER BY created_at DESC, suppression_id DESC LIMIT $3 OFFSET $4"
                    ),
                ),
            };
            let params: [&(dyn ToSql + Sync); 2] = [&scopes, &identifier];
            page_of_docs(client, &count_sql, &rows_sql, &params, (limit, offset)).await
        })
    })
    .await?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}
