//! The API reference page (`/docs`), opened in headless Chromium (Debian's, installed by
//! scripts/test): every operation of the document is rendered, nothing is loaded from another
//! host, and a screenshot of it is not blank.

use std::process::Command;

use serde_json::Value;

use crate::helpers::*;

const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

/// Runs headless Chromium on `url` with `args` (`--dump-dom`, `--screenshot=...`): its stdout.
fn chromium(url: &str, args: &[&str]) -> String {
    let binary = std::env::var("TEST_CHROMIUM").unwrap_or_else(|_| "chromium".to_owned());
    let profile = scratch_dir("chromium-profile");
    let output = Command::new(&binary)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .arg(format!("--user-data-dir={}", profile.display()))
        // Virtual time runs the page's scripts and timers to quiescence, up to this budget.
        .arg("--virtual-time-budget=30000")
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|error| panic!("starting {binary} (scripts/test installs Debian's chromium): {error}"));
    assert!(output.status.success(), "{binary} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

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

    let dom = tokio::task::spawn_blocking({
        let url = format!("{origin}/docs");
        move || chromium(&url, &["--dump-dom"])
    })
    .await
    .expect("chromium ran");
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
    let missing: Vec<&String> =
        operations.iter().filter(|id| !dom.contains(&format!("id=\"operation/{id}\""))).collect();
    assert!(missing.is_empty(), "operations not rendered: {missing:?} (page of {} bytes)", dom.len());
    let external: Vec<&str> = dom
        .match_indices("src=\"http")
        .map(|(at, _)| &dom[at..dom.len().min(at + 80)])
        .filter(|source| !source.starts_with(&format!("src=\"{origin}")))
        .collect();
    assert!(external.is_empty(), "the page loads from another host: {external:?}");

    let shot = scratch_dir("reference-screenshot").join("docs.png");
    tokio::task::spawn_blocking({
        let (url, argument) = (format!("{origin}/docs"), format!("--screenshot={}", shot.display()));
        move || chromium(&url, &["--hide-scrollbars", "--window-size=1280,900", &argument])
    })
    .await
    .expect("chromium ran");
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let stats = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/reference/png_stats.py"))
        .arg(&shot)
        .output()
        .expect("png_stats ran");
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    let stats: Value = serde_json::from_slice(&stats.stdout).expect("stats are JSON");
    assert_eq!((stats["width"].as_u64(), stats["height"].as_u64()), (Some(1280), Some(900)), "{stats}");
    let colours = stats["colours"].as_u64().unwrap_or(0);
    let drawn = stats["notBackground"].as_f64().unwrap_or(0.0);
    assert!(colours > 50 && drawn > 0.1, "the screenshot is close to blank: {stats}");
}
