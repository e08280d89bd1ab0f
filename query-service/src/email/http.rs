//! `GET /domains`, `/senders`, `/topics`, `/templates`, `/forms` (offset lists, by slug) and
//! each by id.
//! Read permission; another space's resource is a 404 like a missing one.

use std::collections::BTreeMap;

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use domain::catalog::CATALOG;
use domain::email::resources::{self as email, DOMAIN, FORM, SENDER, TEMPLATE, TOPIC};
use platform::error::{ApiError, Code};
use serde_json::Value;

use super::store::{self, Row};
use crate::State;
use crate::consistency::{authorize_read, consistent_read, respond};

/// One kind of email resource as the API serves it.
#[derive(Clone, Copy)]
struct Kind {
    kind: &'static str,
    noun: &'static str,
    not_found: Code,
}

const DOMAINS: Kind = Kind { kind: DOMAIN, noun: "domain", not_found: Code::DomainNotFound };
const SENDERS: Kind = Kind { kind: SENDER, noun: "sender", not_found: Code::SenderNotFound };
const TOPICS: Kind = Kind { kind: TOPIC, noun: "topic", not_found: Code::TopicNotFound };
const TEMPLATES: Kind = Kind { kind: TEMPLATE, noun: "template", not_found: Code::TemplateNotFound };
const FORMS: Kind = Kind { kind: FORM, noun: "form", not_found: Code::FormNotFound };

/// The public document of a resource row (a definition the catalog could not read is an
/// internal error: authoring checked it).
fn document(
    state: &State,
    kind: Kind,
    row: Row,
    checks: &BTreeMap<String, BTreeMap<String, Value>>,
) -> Result<Value, ApiError> {
    let malformed =
        |error: serde_json::Error| ApiError::internal(&anyhow::anyhow!("{} {}: {error}", kind.noun, row.id));
    Ok(match kind.kind {
        DOMAIN => {
            let domain = serde_json::from_value(row.definition.clone()).map_err(malformed)?;
            let found = checks.get(&row.id).cloned().unwrap_or_default();
            email::domain_document(&row.id, &domain, state.settings.email.platform_domain(), &found)
        }
        SENDER => email::sender_document(&row.id, &serde_json::from_value(row.definition.clone()).map_err(malformed)?),
        TOPIC => email::topic_document(&row.id, &serde_json::from_value(row.definition.clone()).map_err(malformed)?),
        FORM => email::form_document(
            &row.id,
            &serde_json::from_value(row.definition.clone()).map_err(malformed)?,
            &state.settings.email.public_base_url,
        ),
        _ => email::template_document(
            &row.id,
            row.revision,
            &serde_json::from_value(row.definition.clone()).map_err(malformed)?,
        ),
    })
}

/// The verification results of the domains among `rows` (none for other kinds).
async fn checks_of(
    client: &deadpool_postgres::Client,
    kind: Kind,
    rows: &[Row],
) -> Result<BTreeMap<String, BTreeMap<String, Value>>, ApiError> {
    if kind.kind != DOMAIN {
        return Ok(BTreeMap::new());
    }
    let ids: Vec<String> = rows.iter().map(|row| row.id.clone()).collect();
    store::domain_checks(client, &ids).await
}

async fn list(req: HttpRequest, state: web::Data<State>, kind: Kind) -> Result<HttpResponse, ApiError> {
    let page = PageRequest::parse(&query_pairs(&req))?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let (limit, offset) = (page.limit(), page.offset());
    let (((total, rows), checks), consistent) =
        consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
            let (catalog, space_id) = (models.schema(CATALOG), space_id.clone());
            Box::pin(async move {
                let (total, rows) = store::page(client, &catalog, &space_id, kind.kind, (limit, offset)).await?;
                let checks = checks_of(client, kind, &rows).await?;
                Ok(((total, rows), checks))
            })
        })
        .await?;
    let items = rows.into_iter().map(|row| document(&state, kind, row, &checks)).collect::<Result<Vec<_>, _>>()?;
    let pagination = page.pagination(items.len(), total);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

async fn get(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
    kind: Kind,
) -> Result<HttpResponse, ApiError> {
    let id = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let ((row, checks), consistent) = consistent_read(&state, &caller, token, &[CATALOG], |client, models| {
        let (catalog, space_id, id) = (models.schema(CATALOG), space_id.clone(), id.clone());
        Box::pin(async move {
            let row = store::get(client, &catalog, &space_id, kind.kind, &id).await?;
            let checks = checks_of(client, kind, row.as_slice()).await?;
            Ok((row, checks))
        })
    })
    .await?;
    let row = row.ok_or_else(|| ApiError::of(kind.not_found, format!("no {} {id:?} in this space", kind.noun)))?;
    let document = document(&state, kind, row, &checks)?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

pub(crate) async fn list_domains(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    list(req, state, DOMAINS).await
}
pub(crate) async fn get_domain(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    get(req, path, state, DOMAINS).await
}
pub(crate) async fn list_senders(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    list(req, state, SENDERS).await
}
pub(crate) async fn get_sender(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    get(req, path, state, SENDERS).await
}
pub(crate) async fn list_topics(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    list(req, state, TOPICS).await
}
pub(crate) async fn get_topic(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    get(req, path, state, TOPICS).await
}
pub(crate) async fn list_templates(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    list(req, state, TEMPLATES).await
}
pub async fn get_template(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    get(req, path, state, TEMPLATES).await
}
pub(crate) async fn list_forms(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    list(req, state, FORMS).await
}
pub(crate) async fn get_form(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    get(req, path, state, FORMS).await
}
