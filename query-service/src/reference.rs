//! The API reference page at `/docs` (outside `/v1`): Redoc rendering `/v1/openapi.json`.
//! Its bundle is embedded at build time (see `build.rs` and `reference/README.md`) and served
//! from `/docs/redoc.standalone.js`, so the page needs no other host; its Content-Security-
//! Policy allows nothing else.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

const BUNDLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/redoc.standalone.js"));
const LICENSE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/redoc.standalone.js.LICENSE.txt"));
const VERSION: &str = include_str!(concat!(env!("OUT_DIR"), "/redoc.version"));

/// Scripts and workers from this origin only (Redoc starts its search worker from a blob),
/// the inline styles Redoc writes, images from here or inline.
const POLICY: &str = "default-src 'none'; script-src 'self'; worker-src 'self' blob:; style-src 'self' 'unsafe-inline'; \
                      img-src 'self' data:; font-src 'self' data:; connect-src 'self'";

const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>API reference</title>
<style>body { margin: 0; }</style>
</head>
<body>
<redoc spec-url="/v1/openapi.json" native-scrollbars></redoc>
<script src="/docs/redoc.standalone.js"></script>
</body>
</html>
"#;

const MISSING: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>API reference</title></head>
<body>
<h1>API reference</h1>
<p>This build has no reference renderer: run <code>source scripts/reference.sh &amp;&amp;
ensure_reference_bundle</code> (it fetches Redoc from the npm registry) and build again.
The document itself is at <a href="/v1/openapi.json">/v1/openapi.json</a>.</p>
</body>
</html>
"#;

/// Registers `/docs` and its bundle (outside the `/v1` scope).
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .route("/docs", web::get().to(page))
        .route("/docs/", web::get().to(page))
        .route("/docs/redoc.standalone.js", web::get().to(bundle))
        .route("/docs/redoc.standalone.js.LICENSE.txt", web::get().to(license));
}

async fn page() -> HttpResponse {
    if BUNDLE.is_empty() {
        return HttpResponse::ServiceUnavailable().content_type("text/html; charset=utf-8").body(MISSING);
    }
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, POLICY))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(PAGE)
}

async fn bundle() -> HttpResponse {
    if BUNDLE.is_empty() {
        return HttpResponse::NotFound().finish();
    }
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        // The bundle changes only with the build: an hour's caching, revalidated by version.
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .insert_header((header::ETAG, format!("\"redoc-{}\"", VERSION.trim())))
        .body(BUNDLE)
}

async fn license() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain; charset=utf-8").body(LICENSE)
}
