//! `GET /emails/{emailId}/unsubscribe`: what a person sees when they open the unsubscribe link
//! in a mail client. A minimal page with one button that POSTs the one-click body to the same
//! URL; the GET itself changes nothing, so link scanners that fetch every link never
//! unsubscribe anyone (the lesson behind D7). Public, like the POST; 404 `email_not_found`
//! for an unknown email.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use shared::error::{ApiError, Code};

use crate::State;

const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex"><title>Unsubscribe</title></head>
<body style="font-family: sans-serif; max-width: 32rem; margin: 4rem auto; padding: 0 1rem">
<h1>Unsubscribe</h1>
<p>Stop receiving emails like this one?</p>
<form method="post">
<input type="hidden" name="List-Unsubscribe" value="One-Click">
<button type="submit">Unsubscribe</button>
</form>
</body>
</html>
"#;

pub async fn get(path: web::Path<String>, state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let email_id = path.into_inner();
    let not_found = || ApiError::not_found(Code::EmailNotFound, format!("no email {email_id:?}"));
    if !email_id.starts_with("em_") || !shared::storable::is_storable(&email_id) {
        return Err(not_found());
    }
    let client = state.pool.get().await?;
    let statement = client.prepare_cached("SELECT EXISTS (SELECT 1 FROM streams WHERE stream_id = $1)").await?;
    let exists: bool = client.query_one(&statement, &[&shared::email::stream_id(&email_id)]).await?.get(0);
    if !exists {
        return Err(not_found());
    }
    Ok(HttpResponse::build(StatusCode::OK)
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .body(PAGE))
}
