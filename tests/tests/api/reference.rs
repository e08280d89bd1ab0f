//! The API reference page (`/docs`), opened in headless Chromium (Debian's, installed by
//! scripts/test): every operation of the document is rendered, nothing is loaded from another
//! host, and a screenshot of it is not blank.

use serde_json::{Value, json};

use crate::browser::browse;
use crate::helpers::*;

const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

#[tokio::test]
async fn the_reference_page_renders_every_operation_from_our_own_origin() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    let origin = app.query_url.trim_end_matches("/v1").to_owned();
    let page = app.http.get(format!("{origin}/docs")).send().await.expect("sent");
    assert_eq!(page.status(), 200, "the query service serves /docs (scripts/reference.sh installs its renderer)");
    let policy = page.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or("");
    assert!(policy.contains("script-src 'self'"), "scripts from our own origin only: {policy}");
    let bundle = app.http.get(format!("{origin}/docs/redoc.standalone.js")).send().await.expect("sent");
    assert_eq!(bundle.status(), 200);
    assert!(bundle.bytes().await.expect("bundle").len() > 100_000, "the renderer's bundle is served by the service");

    let document: Value = serde_json::from_str(DOCUMENT).expect("the document is JSON");
    let mut operations = Vec::new();
    for item in document["paths"].as_object().expect("paths").values() {
        for operation in item.as_object().expect("a path item").values() {
            if let Some(id) = operation.get("operationId").and_then(Value::as_str) {
                operations.push(id.to_owned());
            }
        }
    }
    assert_eq!(operations.len(), api::routes::OPERATIONS.len());

    // Redoc renders after the page has loaded: wait until it has drawn every operation. Its
    // scripts keep the browser busy for seconds on a quiet machine, and for tens of seconds
    // beside a full test run on two cores, so each step has minutes.
    let rendered = format!("document.querySelectorAll('[id^=\"operation/\"]').length >= {}", operations.len());
    let captures = browse(json!([
        {"goto": format!("{origin}/docs"), "seconds": 180},
        {"wait": rendered, "seconds": 180},
        {"capture": "docs", "html": true, "seconds": 180},
    ]))
    .await;
    let capture = &captures[0];
    let dom = capture["html"].as_str().expect("the DOM");
    let missing: Vec<&String> =
        operations.iter().filter(|id| !dom.contains(&format!("id=\"operation/{id}\""))).collect();
    assert!(missing.is_empty(), "operations not rendered: {missing:?} (page of {} bytes)", dom.len());
    // What the page asked for: our origin only. Redoc's footer asks for its logo from its CDN;
    // the page's policy (img-src 'self') refuses it, so it never leaves the browser.
    let requests = capture["requests"].as_array().expect("requests");
    let url = |request: &Value| request["url"].as_str().unwrap_or_default().to_owned();
    assert!(
        requests.iter().any(|r| url(r).ends_with("/docs/redoc.standalone.js")),
        "the renderer was loaded: {requests:?}"
    );
    let ours = |address: &str| {
        [format!("{origin}/"), format!("blob:{origin}/")].iter().any(|prefix| address.starts_with(prefix.as_str()))
            || address.starts_with("data:")
    };
    let external: Vec<&Value> = requests.iter().filter(|r| !ours(&url(r)) && r["blocked"].is_null()).collect();
    assert!(external.is_empty(), "the page loads from another host: {external:?}");

    let stats = &capture["stats"];
    let colours = stats["colours"].as_u64().unwrap_or(0);
    let drawn = stats["notBackground"].as_f64().unwrap_or(0.0);
    assert!(colours > 50 && drawn > 0.1, "the screenshot is close to blank: {stats}");
}
