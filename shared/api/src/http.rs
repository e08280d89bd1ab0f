//! The HTTP edge every service shares: reading and checking JSON bodies, query strings,
//! success bodies, the 404/405 fallback and request ids.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use platform::error::Code;
use serde_json::{Map, Value, json};

use crate::pagination::Warning;
use crate::routes;
use platform::error::ApiError;

/// The largest request body accepted (the contract's 10 MB).
pub(crate) const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// The request id, taken from `X-Request-Id` or generated, stored in request extensions.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub String);

pub fn request_id(req: &HttpRequest) -> String {
    req.extensions().get::<RequestId>().map(|id| id.0.clone()).unwrap_or_default()
}

/// Middleware: gives every request an id and echoes it in `X-Request-Id`.
pub(crate) async fn request_id_middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let incoming = req
        .headers()
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty() && value.len() <= 128)
        .map(str::to_owned);
    let id = incoming.unwrap_or_else(|| platform::ids::new_id("req"));
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id, method = %req.method(), path = %req.path());
    // The span covers the whole request, across its awaits, without being entered on a thread
    // that may run other tasks meanwhile.
    let started = std::time::Instant::now();
    let mut response = tracing::Instrument::instrument(next.call(req), span.clone()).await?;
    span.in_scope(|| {
        tracing::debug!(status = response.status().as_u16(), took_ms = started.elapsed().as_millis(), "answered");
    });
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HeaderName::from_static("x-request-id"), value);
    }
    Ok(response)
}

/// An [`ApiError`] as actix answers it (what a handler's `Err` becomes, see [`answering`]).
#[derive(Debug)]
pub struct Failure(pub ApiError);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl actix_web::ResponseError for Failure {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }

    fn error_response(&self) -> HttpResponse {
        crate::envelope::error_response(&self.0)
    }
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Self(error)
    }
}

/// A handler answering `Result<_, ApiError>`, as one actix registers: an `Err` is answered
/// in the contract's envelope.
pub fn answering<F>(handler: F) -> Answering<F> {
    Answering(handler)
}

/// See [`answering`].
#[derive(Clone)]
pub struct Answering<F>(F);

impl<F, Args, R> actix_web::Handler<Args> for Answering<F>
where
    F: actix_web::Handler<Args, Output = Result<R, ApiError>>,
{
    type Output = Result<R, Failure>;
    type Future = futures_util::future::Map<
        futures_util::future::CatchUnwind<std::panic::AssertUnwindSafe<F::Future>>,
        fn(std::thread::Result<Result<R, ApiError>>) -> Result<R, Failure>,
    >;

    fn call(&self, args: Args) -> Self::Future {
        use futures_util::FutureExt;
        std::panic::AssertUnwindSafe(self.0.call(args)).catch_unwind().map(answered)
    }
}

/// A handler's answer; a handler that panicked answers 500 in the contract's envelope, with
/// the panic logged (inside the request's span: its id, method and path), instead of leaving
/// the connection to be dropped unanswered. Every panic on a request path is a bug; this makes
/// each one visible to the caller and in the log.
fn answered<R>(outcome: std::thread::Result<Result<R, ApiError>>) -> Result<R, Failure> {
    match outcome {
        Ok(answer) => answer.map_err(Failure),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(Failure(ApiError::internal(&anyhow::anyhow!("the handler panicked: {message}"))))
        }
    }
}

/// Fallback for every request no route took: 405 with `Allow` for a known path, 404
/// otherwise.
/// A browser (`Accept: text/html`) that opens a cut or malformed address under `/forms/` or
/// `/emails/` (links in mail) gets a page.
pub async fn fallback(req: HttpRequest) -> HttpResponse {
    let error = match routes::allowed_methods(req.path()) {
        Some(methods) => ApiError::method_not_allowed().with_header("Allow", methods.join(", ")),
        None => ApiError::route_not_found(),
    };
    let browser = under_public_pages(req.path()) && crate::pages::wants_html(&req, false);
    crate::pages::answer(browser, Err(error))
}

/// Whether `path` (with the `/v1` prefix) is below `/forms/` or `/emails/`, where people
/// open links from mail.
fn under_public_pages(path: &str) -> bool {
    ["/forms/", "/emails/"].iter().any(|prefix| {
        path.strip_prefix(routes::API_PREFIX)
            .and_then(|rest| rest.strip_prefix(prefix))
            .is_some_and(|rest| !rest.is_empty())
    })
}

/// The operations people reach from mail or a web page, which answer a browser with pages.
const PUBLIC_PAGES: &[&str] = &[
    "unsubscribeEmail",
    "getUnsubscribePage",
    "updateEmailPreferences",
    "followEmailLink",
    "fetchEmailOpenPixel",
    "submitForm",
    "confirmFormSubmission",
];

/// Middleware: refuses, before any handler runs, a request whose path parameters or query
/// string hold what the store cannot hold (see [`platform::storable`]): 400 `invalid_character`
/// naming each parameter. Bodies are checked where they are read ([`read_json`]).
pub(crate) async fn storable_input_middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<actix_web::body::EitherBody<impl MessageBody>>, actix_web::Error> {
    // A request no route will take is answered 404 or 405 without touching storage.
    let Some(operation) = routes::addressed(&req).filter(|operation| routes::serves(operation)) else {
        return Ok(next.call(req).await?.map_into_left_body());
    };
    let path_parameters = routes::parameters_of(operation.path, req.path());
    let decoded: Vec<(&str, std::borrow::Cow<'_, str>)> = path_parameters
        .iter()
        .map(|(name, raw)| (*name, percent_encoding::percent_decode_str(raw).decode_utf8_lossy()))
        .collect();
    let query: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes()).into_owned().collect();
    let mut issues =
        platform::storable::parameter_issues("path", decoded.iter().map(|(name, value)| (*name, &**value)));
    issues.extend(platform::storable::parameter_issues(
        "query",
        query.iter().map(|(name, value)| (name.as_str(), value.as_str())),
    ));
    if let Err(error) = platform::storable::reject(issues) {
        let public = PUBLIC_PAGES.contains(&operation.id);
        let browser = public && crate::pages::wants_html(req.request(), false);
        let response = crate::pages::answer(browser, Err(error));
        return Ok(req.into_response(response).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

/// Reads the body as a JSON object, enforcing size, content type, charset and encoding.
pub async fn read_json_object(req: &HttpRequest, payload: web::Payload) -> Result<Map<String, Value>, ApiError> {
    json_object(read_json_accepting(req, payload, JSON).await?)
}

fn json_object(value: Value) -> Result<Map<String, Value>, ApiError> {
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(ApiError::of(Code::InvalidBody, "the request body must be a JSON object")),
    }
}

/// What a 415 tells the caller to send: JSON, or (a public form) either kind of body.
const JSON: &str = "application/json";
const FORM_OR_JSON: &str = "application/x-www-form-urlencoded (an HTML form) or application/json";

/// Whether the request's body is `application/x-www-form-urlencoded` (what an HTML form posts).
pub fn is_urlencoded(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|value| value.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
}

/// Reads a public form's body: `application/x-www-form-urlencoded` (what an HTML form posts;
/// every value a string, a repeated name keeping its last value) or a JSON object. The flag
/// says which it was.
pub async fn read_form_or_json(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<(Map<String, Value>, bool), ApiError> {
    if !is_urlencoded(req) {
        // Both are accepted, so a refused content type names both.
        return Ok((json_object(read_json_accepting(req, payload, FORM_OR_JSON).await?)?, false));
    }
    let bytes = read_body(req, payload).await?;
    let mut fields = Map::new();
    for (name, value) in form_urlencoded::parse(&bytes) {
        fields.insert(name.into_owned(), Value::String(value.into_owned()));
    }
    platform::storable::reject(platform::storable::json_issues(&Value::Object(fields.clone())))?;
    Ok((fields, true))
}

/// Reads the body as bytes (a file's part), enforcing its size and encoding; the caller
/// checks its content type.
pub async fn read_bytes(req: &HttpRequest, payload: web::Payload) -> Result<Vec<u8>, ApiError> {
    if let Some(encoding) = req.headers().get(header::CONTENT_ENCODING) {
        let encoding = encoding.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if !encoding.is_empty() && encoding != "identity" {
            return Err(unsupported(format!(
                "content encoding {encoding:?} is not supported; send the body uncompressed"
            )));
        }
    }
    read_body(req, payload).await
}

/// Reads the body as JSON, enforcing size, content type, charset and encoding.
pub async fn read_json(req: &HttpRequest, payload: web::Payload) -> Result<Value, ApiError> {
    read_json_accepting(req, payload, JSON).await
}

/// [`read_json`], whose 415 for a missing or other content type says to send `accepted`.
async fn read_json_accepting(req: &HttpRequest, payload: web::Payload, accepted: &str) -> Result<Value, ApiError> {
    check_content_headers(req, accepted)?;
    let bytes = read_body(req, payload).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::of(Code::MalformedJson, "the request body is empty; send a JSON object"));
    }
    // Bounded before it is built: a 10 MB body of a million tiny values would take a gigabyte
    // as a tree.
    if json_values(&bytes) > MAX_JSON_VALUES {
        return Err(ApiError::of(
            Code::BodyTooLarge,
            format!("the request body holds more than {MAX_JSON_VALUES} JSON values; send fewer at once"),
        ));
    }
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|error| ApiError::of(Code::MalformedJson, format!("the request body is not valid JSON: {error}")))?;
    drop(bytes);
    platform::storable::reject(platform::storable::json_issues(&value))?;
    Ok(value)
}

/// The most values (objects, arrays, members and elements) a JSON body may hold: above any
/// request's need (a full batch of 500 events still has about 500 values for each), and
/// about 30 MB as a tree.
pub(crate) const MAX_JSON_VALUES: usize = 250_000;

/// About how many values a JSON text holds, counted without parsing it: its containers and
/// the separators between their items, outside strings. Exact for valid JSON up to the
/// values of empty containers; an overcount of at most one per container otherwise.
fn json_values(bytes: &[u8]) -> usize {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &byte in bytes {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' | b',' => count += 1,
            _ => {}
        }
    }
    count
}

fn check_content_headers(req: &HttpRequest, accepted: &str) -> Result<(), ApiError> {
    if let Some(encoding) = req.headers().get(header::CONTENT_ENCODING) {
        let encoding = encoding.to_str().unwrap_or("").trim().to_ascii_lowercase();
        if !encoding.is_empty() && encoding != "identity" {
            return Err(unsupported(format!(
                "content encoding {encoding:?} is not supported; send the body uncompressed"
            )));
        }
    }
    let Some(content_type) = req.headers().get(header::CONTENT_TYPE) else {
        return Err(unsupported(format!("the Content-Type header is missing; send {accepted}")));
    };
    let content_type = content_type.to_str().unwrap_or("").to_ascii_lowercase();
    let mut parts = content_type.split(';').map(str::trim);
    let media_type = parts.next().unwrap_or("");
    let is_json =
        media_type == "application/json" || (media_type.starts_with("application/") && media_type.ends_with("+json"));
    if !is_json {
        return Err(unsupported(format!("content type {media_type:?} is not supported; send {accepted}")));
    }
    for parameter in parts {
        if let Some(charset) = parameter.strip_prefix("charset=") {
            let charset = charset.trim_matches('"');
            if charset != "utf-8" && charset != "utf8" {
                return Err(unsupported(format!("charset {charset:?} is not supported; send UTF-8")));
            }
        }
    }
    Ok(())
}

fn unsupported(message: String) -> ApiError {
    ApiError::of(Code::UnsupportedMediaType, message)
}

fn too_large() -> ApiError {
    ApiError::of(Code::BodyTooLarge, "the request body is larger than 10 MB")
}

/// Reads a body of at most [`MAX_BODY_BYTES`]. The buffer grows by doubling, never past the
/// length the request declared nor the limit, so a 10 MB body holds 10 MB (a buffer doubled
/// past it would hold 16, and 24 while it is copied).
async fn read_body(req: &HttpRequest, mut payload: web::Payload) -> Result<Vec<u8>, ApiError> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES) {
        return Err(too_large());
    }
    let ceiling = declared.unwrap_or(MAX_BODY_BYTES);
    let mut body = Vec::with_capacity(ceiling.min(64 * 1024));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|error| ApiError::of(Code::InvalidBody, format!("the request body could not be read: {error}")))?;
        let length = body.len() + chunk.len();
        if length > MAX_BODY_BYTES {
            return Err(too_large());
        }
        if length > body.capacity() {
            let wanted = grown(body.capacity(), length, ceiling);
            body.reserve_exact(wanted - body.len());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The capacity a body buffer of `capacity` grows to when it must hold `needed` bytes: twice
/// as much, at most `ceiling` (the declared length, or the limit), and never less than needed.
fn grown(capacity: usize, needed: usize, ceiling: usize) -> usize {
    capacity.saturating_mul(2).min(ceiling).max(needed)
}

pub use crate::query::{query_pairs, query_value};

/// `{data}` plus `warnings` when there are any.
pub fn data_body(data: Value, warnings: &[Warning]) -> Value {
    let mut body = json!({ "data": data });
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    body
}

/// `{data: [...], pagination}` plus `warnings` when there are any.
pub fn page_body(items: Vec<Value>, pagination: Value, warnings: &[Warning]) -> Value {
    let mut body = json!({ "data": items, "pagination": pagination });
    if !warnings.is_empty() {
        body["warnings"] = json!(warnings);
    }
    body
}

/// [`data_body`] (with `pagination`: [`page_body`]) around JSON text that is sent as it is,
/// never parsed: a stored document, or a page of them ([`raw_array`]).
pub fn raw_body(data: &str, pagination: Option<&Value>, warnings: &[Warning]) -> String {
    let mut body = String::with_capacity(data.len() + 128);
    body.push_str("{\"data\":");
    body.push_str(data);
    if let Some(pagination) = pagination {
        body.push_str(",\"pagination\":");
        body.push_str(&pagination.to_string());
    }
    if !warnings.is_empty() {
        body.push_str(",\"warnings\":");
        body.push_str(&json!(warnings).to_string());
    }
    body.push('}');
    body
}

/// JSON texts as one JSON array, for [`raw_body`].
pub fn raw_array<'a>(documents: impl IntoIterator<Item = &'a str>) -> String {
    let mut array = String::from("[");
    for (index, document) in documents.into_iter().enumerate() {
        if index > 0 {
            array.push(',');
        }
        array.push_str(document);
    }
    array.push(']');
    array
}

/// The bearer credential of a request, if any.
pub(crate) fn bearer_token(req: &HttpRequest) -> Credential<'_> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Credential::Missing;
    };
    let value = value.to_str().map(str::trim).unwrap_or_default();
    if value.is_empty() {
        return Credential::Missing;
    }
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty() => {
            Credential::Bearer(token.trim())
        }
        _ => Credential::Malformed,
    }
}

/// What a request's `Authorization` header carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Credential<'a> {
    /// No header (or an empty one).
    Missing,
    /// A header that is not `Bearer <key>` (a bare key, another scheme, no key after `Bearer`).
    Malformed,
    Bearer(&'a str),
}

/// Registers every operation of `tier` (from the route table) with its handler; an operation
/// without one is logged (each service's route test fails on it) and left to the fallback.
pub fn register(config: &mut web::ServiceConfig, tier: routes::Tier, handler: fn(&str) -> Option<actix_web::Route>) {
    for operation in routes::of_tier(tier) {
        match handler(operation.id) {
            Some(route) => {
                config.route(operation.path, route);
            }
            None => tracing::error!(operation = operation.id, "an operation of the route table has no handler"),
        }
    }
}

/// An HTTP server with the API's middleware, `/v1` scope and 404/405 fallback, plus the
/// operations endpoints outside `/v1`. Each service (and single-node mode) passes what to
/// register in the scope, its state included, and what else it serves outside it (`site`:
/// the query service's reference page). On SIGTERM (or SIGINT) it stops accepting and
/// gives requests in flight up to `shutdown_timeout` to finish.
pub struct ApiServer {
    port: u16,
    server: actix_web::dev::Server,
}

impl ApiServer {
    pub fn bind<F>(
        (host, port): (&str, u16),
        timeouts: platform::settings::ServerTimeouts,
        ops: crate::ops::Ops,
        site: fn(&mut web::ServiceConfig),
        configure: F,
    ) -> anyhow::Result<Self>
    where
        F: Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
    {
        use anyhow::Context;
        let listener = std::net::TcpListener::bind((host, port)).context("binding the listener")?;
        let port = listener.local_addr()?.port();
        let server = actix_web::HttpServer::new(move || {
            let ops = ops.clone();
            actix_web::App::new()
                .wrap(actix_web::middleware::from_fn(storable_input_middleware))
                .wrap(actix_web::middleware::from_fn(crate::ops::request_metrics_middleware))
                .wrap(actix_web::middleware::from_fn(request_id_middleware))
                .configure(|config| ops.configure(config))
                .configure(site)
                .service(web::scope(routes::API_PREFIX).configure(configure.clone()))
                .default_service(web::to(fallback))
        })
        .shutdown_timeout(timeouts.shutdown.as_secs().max(1))
        .keep_alive(timeouts.keep_alive)
        .listen(listener)?
        .run();
        Ok(Self { port, server })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A handle to stop the server gracefully from elsewhere (tests, single-node mode).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_raw_body_is_the_envelope_data_body_and_page_body_build() {
        use super::{Warning, data_body, page_body, raw_array, raw_body};
        use serde_json::{Value, json};
        let warnings = [Warning { code: "stale_read", message: "behind".to_owned() }];
        let parsed = |text: String| serde_json::from_str::<Value>(&text).expect("JSON");
        let document = r#"{"id": "con_1", "name": "Zoë \"Q\""}"#;
        let value: Value = serde_json::from_str(document).expect("a document");
        for warnings in [&warnings[..], &[]] {
            assert_eq!(parsed(raw_body(document, None, warnings)), data_body(value.clone(), warnings));
            let pagination = json!({"limit": 2, "hasMore": false});
            let page = raw_array([document, document]);
            assert_eq!(
                parsed(raw_body(&page, Some(&pagination), warnings)),
                page_body(vec![value.clone(), value.clone()], pagination, warnings)
            );
        }
        assert_eq!(raw_array([]), "[]");
    }

    #[test]
    fn a_bodys_values_are_counted_outside_strings() {
        assert_eq!(super::json_values(br#"{"a": 1, "b": [1, 2, 3]}"#), 6);
        assert_eq!(super::json_values(br#"{"a": "x,y,{[", "b": "\\", "c": "\\\"]"}"#), 4);
        let many = format!("{{{}}}", (0..300_000).map(|n| format!("\"k{n}\":1")).collect::<Vec<_>>().join(","));
        assert!(super::json_values(many.as_bytes()) > super::MAX_JSON_VALUES);
    }

    #[test]
    fn a_body_buffer_doubles_up_to_the_declared_length_and_never_past_it() {
        let ten = 10 * 1024 * 1024;
        assert_eq!(super::grown(64 * 1024, 70 * 1024, ten), 128 * 1024, "doubles");
        assert_eq!(super::grown(8 * 1024 * 1024, 8 * 1024 * 1024 + 1, ten), ten, "stops at the declared length");
        assert_eq!(super::grown(1024, 5000, ten), 5000, "a chunk larger than the double");
        assert_eq!(super::grown(4096, 5000, 4500), 5000, "a body longer than declared still fits");
    }

    #[actix_web::test]
    async fn a_handler_that_panics_answers_500_in_the_envelope_and_the_server_goes_on() {
        use actix_web::{App, test, web};
        let app = test::init_service(
            App::new()
                .route(
                    "/boom",
                    web::get().to(super::answering(|| async { if true { panic!("boom") } else { Ok("no") } })),
                )
                .route("/fine", web::get().to(|| async { "fine" })),
        )
        .await;
        let failed = test::call_service(&app, test::TestRequest::get().uri("/boom").to_request()).await;
        assert_eq!(failed.status(), actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
        let body: serde_json::Value = test::read_body_json(failed).await;
        assert_eq!(body["error"]["code"], "internal_error", "{body}");
        let fine = test::call_service(&app, test::TestRequest::get().uri("/fine").to_request()).await;
        assert_eq!(fine.status(), actix_web::http::StatusCode::OK);
    }
}
