//! `GET /schemas/{schema}/records` and `GET /schemas/{schema}/records/{id}`.

use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{query_pairs, raw_array};
use api::pagination::PageRequest;
use domain::catalog::CATALOG;
use platform::db::RawJson;
use platform::error::ApiError;
use platform::error::Code;
use serde_json::json;

use super::store;
use crate::State;
use crate::consistency::{authorize_read, consistent_row, consistent_rows, respond_raw};
use crate::schemas::http::schema_not_found;
use platform::readmodel::{CHECK_WIDTH, Consistent};

const RECORDS: &str = "records";

/// Records live in contact and object schemas; an event schema has none. `schema_type` is
/// the type of the schema named, `None` when there is none.
fn record_schema(schema_type: Option<&str>, id_or_slug: &str) -> Result<(), ApiError> {
    match schema_type {
        Some("event") => Err(ApiError::of(
            Code::SchemaNotFound,
            format!("{id_or_slug:?} is an event schema; records live in contact and object schemas"),
        )),
        Some(_) => Ok(()),
        None => Err(schema_not_found(id_or_slug)),
    }
}

/// One statement: the consistency check, the schema, the total and the page. Paged by offset
/// (the contract's) or, past where offsets stop, by the `cursor` each page hands on.
pub async fn list(
    req: HttpRequest,
    path: web::Path<String>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let identity = identity_filter(&query);
    // A malformed cursor is refused whatever else is given; a well-formed one is ignored
    // beside an identity filter (its answer is one record at most).
    let after = api::pagination::given_cursor(&query).map(parse_cursor).transpose()?.filter(|_| identity.is_none());
    // With a cursor the offset is ignored.
    let page = match &after {
        Some(_) => PageRequest::parse(&without_offset(&query)),
        None => PageRequest::parse(&query),
    }
    .map_err(|error| match error.code() {
        Some(Code::OffsetTooLarge) => ApiError::of(
            Code::OffsetTooLarge,
            format!("{}; page further with `cursor`, passing each page's pagination.nextCursor", error.message()),
        ),
        _ => error,
    })?;
    let (caller, token) = authorize_read(&state, &req).await?;
    let schema_ref = path.into_inner();
    let (limit, offset) = (page.limit(), page.offset());
    let (rows, consistent) = match (&identity, &after) {
        (None, None) => {
            let sql = |models: &Consistent| store::page_sql(&models.schema(CATALOG), &models.schema(RECORDS));
            consistent_rows(&state, &caller, token, &[CATALOG, RECORDS], sql, &[&schema_ref, &limit, &offset]).await?
        }
        (None, Some((at, id))) => {
            // One row past the page says whether there is more.
            let sql = |models: &Consistent| store::after_sql(&models.schema(CATALOG), &models.schema(RECORDS));
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&schema_ref, &(limit + 1), at, id];
            consistent_rows(&state, &caller, token, &[CATALOG, RECORDS], sql, &params).await?
        }
        (Some((kinds, values)), _) => {
            let sql = |models: &Consistent| store::by_identity_sql(&models.schema(CATALOG), &models.schema(RECORDS));
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&schema_ref, kinds, values];
            consistent_rows(&state, &caller, token, &[CATALOG, RECORDS], sql, &params).await?
        }
    };
    let first = rows.first().ok_or_else(|| ApiError::unavailable("the page query returned no row"))?;
    record_schema(first.get(CHECK_WIDTH), &schema_ref)?;
    let total = first.get::<_, Option<i64>>(CHECK_WIDTH + 1).unwrap_or(0);
    let mut items: Vec<(RawJson, Option<String>)> = rows
        .iter()
        .filter_map(|row| {
            let document = row.get::<_, Option<RawJson>>(CHECK_WIDTH + 2)?;
            Some((document, identity.is_none().then(|| cursor_of(row)).flatten()))
        })
        // A record found by identity is the only one: on page 1.
        .filter(|_| identity.is_none() || offset == 0)
        .collect();
    let pagination = if after.is_some() {
        let more = i64::try_from(items.len()).unwrap_or(i64::MAX) > limit;
        items.truncate(usize::try_from(limit).unwrap_or(0));
        let next = if more { items.last().and_then(|(_, cursor)| cursor.clone()) } else { None };
        json!({"limit": limit, "totalCount": total, "hasMore": more, "nextCursor": next})
    } else {
        let mut pagination = page.pagination(items.len(), total);
        let rest = offset + i64::try_from(items.len()).unwrap_or(i64::MAX) < total;
        let next = if rest { items.last().and_then(|(_, cursor)| cursor.clone()) } else { None };
        pagination["nextCursor"] = json!(next);
        pagination
    };
    let data = raw_array(items.iter().map(|(document, _)| document.0.as_str()));
    Ok(respond_raw(&consistent, page.warnings.clone(), &data, Some(&pagination)))
}

fn without_offset(query: &[(String, String)]) -> Vec<(String, String)> {
    query.iter().filter(|(key, _)| key != "offset").cloned().collect()
}

/// Where the page after a row starts: its creation time (microseconds since the epoch) and id.
fn cursor_of(row: &tokio_postgres::Row) -> Option<String> {
    let at = row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(CHECK_WIDTH + 3)?;
    let id = row.get::<_, Option<String>>(CHECK_WIDTH + 4)?;
    Some(platform::cursor::encode(at.timestamp_micros(), &id))
}

/// A cursor read back, or 400 `invalid_cursor`.
fn parse_cursor(raw: &str) -> Result<(chrono::DateTime<chrono::Utc>, String), ApiError> {
    let (at, id) = platform::cursor::decode(raw)?;
    let at = chrono::DateTime::from_timestamp_micros(at).ok_or_else(platform::cursor::malformed)?;
    Ok((at, id))
}

/// The identities a list is narrowed to (`email`, `userId`, `phone`, `externalId`; all given
/// must be the one record's), as the identity index holds them: trimmed, and an email
/// lowercase. `None` without any.
fn identity_filter(query: &[(String, String)]) -> Option<(Vec<String>, Vec<String>)> {
    let (kinds, values): (Vec<String>, Vec<String>) = ["email", "userId", "phone", "externalId"]
        .into_iter()
        .filter_map(|key| api::query::query_value(query, key).map(|value| (key, value)))
        .map(|(key, value)| {
            let value = if key == "email" { value.trim().to_lowercase() } else { value.trim().to_owned() };
            (key.to_owned(), value)
        })
        .unzip();
    (!kinds.is_empty()).then_some((kinds, values))
}

/// One statement: the consistency check, the schema and the record.
pub async fn get(
    req: HttpRequest,
    path: web::Path<(String, String)>,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let (schema_ref, record_id) = path.into_inner();
    let (caller, token) = authorize_read(&state, &req).await?;
    let columns = |models: &Consistent| store::record_columns(&models.schema(CATALOG), &models.schema(RECORDS));
    let (row, consistent) =
        consistent_row(&state, &caller, token, &[CATALOG, RECORDS], columns, &[&schema_ref, &record_id]).await?;
    record_schema(row.get(CHECK_WIDTH), &schema_ref)?;
    let document = row
        .get::<_, Option<RawJson>>(CHECK_WIDTH + 1)
        .ok_or_else(|| ApiError::of(Code::RecordNotFound, format!("no record {record_id:?} in this schema")))?;
    Ok(respond_raw(&consistent, Vec::new(), &document.0, None))
}
