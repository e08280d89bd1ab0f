//! `GET /emails/{emailId}`: the story of one email of the caller's space; `GET /emails`: the
//! delivery log (read permission).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use api::http::{data_body, page_body, query_pairs};
use api::pagination::PageRequest;
use platform::error::{ApiError, Code};
use serde_json::Value;

use super::log::{self, Cursor, Request};
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
    let document =
        document.ok_or_else(|| ApiError::of(Code::EmailNotFound, format!("no email {email_id:?} in this space")))?;
    Ok(respond(&consistent, Vec::new(), |warnings| data_body(document, warnings)))
}

/// The delivery log: the space's emails, narrowed to a contact, a broadcast run, a workflow or
/// a step and filtered by status, newest first; a page of JSON, or every row streamed as CSV
/// or NDJSON when `Accept` asks for it.
pub(crate) async fn list(req: HttpRequest, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let query = query_pairs(&req);
    let request = Request::parse(&query)?;
    let cursor = api::pagination::given_cursor(&query).map(|raw| Cursor::decode(raw, &request)).transpose()?;
    let page = PageRequest::parse(&query)?;
    let format = Format::accepted(&req);
    let (caller, token) = authorize_read(&state, &req).await?;
    let space_id = caller.space_id().to_owned();
    let after = cursor.as_ref().and_then(Cursor::position);
    if format != Format::Json {
        let ((), consistent) =
            consistent_read(&state, &caller, token, &[EMAILS], |_, _| Box::pin(async { Ok(()) })).await?;
        let export = Export {
            pool: state.pool.clone(),
            m: consistent.schema(EMAILS),
            space_id,
            request,
            after,
            format,
            header: format == Format::Csv,
            done: false,
        };
        return Ok(export.respond(&consistent));
    }
    let limit = page.limit();
    // A cursor says where the page starts; an offset counts from the start (at most 10,000).
    let offset = if after.is_some() { 0 } else { page.offset() };
    let ((total, rows), consistent) = consistent_read(&state, &caller, token, &[EMAILS], |client, models| {
        let (m, space_id, request, after) = (models.schema(EMAILS), space_id.clone(), request.clone(), after.clone());
        Box::pin(async move {
            let rows = store::log_page(client, &m, &space_id, &request, after.as_ref(), (limit + 1, offset)).await?;
            let total = match request.contact_only() {
                Some(contact_id) => Some(store::contact_total(client, &m, &space_id, contact_id).await?),
                None => None,
            };
            Ok((total, rows))
        })
    })
    .await?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    let rows: Vec<_> = rows.into_iter().take(usize::try_from(limit).unwrap_or(usize::MAX)).collect();
    let next =
        if more { rows.last().map(|(_, at, id)| Cursor::after(&request, (*at, id), limit).encode()) } else { None };
    let items: Vec<Value> = rows.into_iter().map(|(row, _, _)| row).collect();
    let pagination = log::pagination(limit, offset, total, next);
    Ok(respond(&consistent, page.warnings.clone(), |warnings| page_body(items, pagination, warnings)))
}

/// What the delivery log answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Csv,
    Ndjson,
}

impl Format {
    /// The first of `text/csv` and `application/x-ndjson` that `Accept` names; JSON otherwise.
    fn accepted(req: &HttpRequest) -> Self {
        let accept = req.headers().get(header::ACCEPT).and_then(|value| value.to_str().ok()).unwrap_or_default();
        for range in accept.split(',') {
            match range.split(';').next().map(str::trim).map(str::to_ascii_lowercase).as_deref() {
                Some("text/csv") => return Format::Csv,
                Some("application/x-ndjson") => return Format::Ndjson,
                Some("application/json") => return Format::Json,
                _ => {}
            }
        }
        Format::Json
    }
}

/// Rows read per statement while streaming an export.
const EXPORT_PAGE: i64 = 1_000;

/// An export being streamed: each chunk is the next page of rows, read by keyset from where
/// the last ended, on a connection taken for that page only. The answer is as long as the log
/// and the memory it takes is one page's.
struct Export {
    pool: deadpool_postgres::Pool,
    m: String,
    space_id: String,
    request: Request,
    after: Option<(chrono::DateTime<chrono::Utc>, String)>,
    format: Format,
    /// The CSV header is still to be written.
    header: bool,
    done: bool,
}

impl Export {
    fn respond(self, consistent: &platform::readmodel::Consistent) -> HttpResponse {
        let (content_type, file) = match self.format {
            Format::Csv => ("text/csv; charset=utf-8", "emails.csv"),
            _ => ("application/x-ndjson", "emails.ndjson"),
        };
        let stream = futures_util::stream::unfold(self, |mut export| async move {
            if export.done {
                return None;
            }
            match export.next_chunk().await {
                Ok(chunk) => Some((Ok::<_, actix_web::Error>(chunk), export)),
                Err(error) => {
                    // The status is sent: the answer is cut short, which a reader sees.
                    tracing::warn!(error = %format!("{error:#}"), "a delivery log export stopped");
                    export.done = true;
                    Some((Err(actix_web::error::ErrorInternalServerError("the export stopped")), export))
                }
            }
        });
        HttpResponse::Ok()
            .insert_header(("Projection-Position", consistent.position().to_string()))
            .insert_header((header::CONTENT_DISPOSITION, format!("attachment; filename=\"{file}\"")))
            .content_type(content_type)
            .streaming(stream)
    }

    async fn next_chunk(&mut self) -> anyhow::Result<web::Bytes> {
        let client = self.pool.get().await?;
        let rows =
            store::log_page(&client, &self.m, &self.space_id, &self.request, self.after.as_ref(), (EXPORT_PAGE, 0))
                .await
                .map_err(|error| anyhow::anyhow!("{}", error.message()))?;
        drop(client);
        if i64::try_from(rows.len()).unwrap_or(i64::MAX) < EXPORT_PAGE {
            self.done = true;
        }
        let mut out = Vec::with_capacity(rows.len() * 256);
        match self.format {
            Format::Csv => {
                if std::mem::take(&mut self.header) {
                    log::write_csv_record(&mut out, log::CSV_HEADER);
                }
                for (row, _, _) in &rows {
                    log::write_csv_record(&mut out, log::csv_record(row));
                }
            }
            _ => {
                for (row, _, _) in &rows {
                    serde_json::to_writer(&mut out, row)?;
                    out.push(b'\n');
                }
            }
        }
        if let Some((_, at, id)) = rows.last() {
            self.after = Some((*at, id.clone()));
        }
        Ok(web::Bytes::from(out))
    }
}
