//! Headless Chromium (Debian's, installed by scripts/test) driven as a person would use it, over
//! the DevTools protocol by tests/pages/browser.py: its steps and what each capture showed.

use std::process::Command;

use serde_json::{Value, json};

use crate::helpers::scratch_dir;

/// Runs the browser steps (see tests/pages/browser.py); the captures, in order, each with
/// `stats`, what its screenshot shows ([`png_stats`]). Every screenshot taken is checked not
/// to be blank.
pub(crate) async fn browse(steps: Value) -> Vec<Value> {
    let shots = scratch_dir("page-shots");
    let file = shots.join("steps.json");
    let script = json!({"shots": shots.display().to_string(), "steps": steps});
    std::fs::write(&file, script.to_string()).expect("the steps");
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/pages/browser.py"))
            .arg(&file)
            .output()
            .expect("the browser driver ran")
    })
    .await
    .expect("joined");
    assert!(
        output.status.success(),
        "the browser failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).expect("the driver prints JSON");
    let mut captures = result["captures"].as_array().expect("captures").clone();
    for capture in &mut captures {
        let stats = png_stats(capture["screenshot"].as_str().expect("a screenshot"));
        let colours = stats["colours"].as_u64().unwrap_or(0);
        let drawn = stats["notBackground"].as_f64().unwrap_or(0.0);
        assert!(colours > 10 && drawn > 0.005, "{} is close to blank: {stats}", capture["screenshot"]);
        capture["stats"] = stats;
    }
    captures
}

/// What a screenshot shows: its width and height, its number of colours and the share of it
/// that is not background (tests/reference/png_stats.py).
fn png_stats(path: &str) -> Value {
    let python = std::env::var("TEST_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let stats = Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/reference/png_stats.py"))
        .arg(path)
        .output()
        .expect("png_stats ran");
    assert!(stats.status.success(), "{}", String::from_utf8_lossy(&stats.stderr));
    serde_json::from_slice(&stats.stdout).expect("stats are JSON")
}

/// The visible text of a capture.
pub(crate) fn text(capture: &Value) -> &str {
    capture["text"].as_str().unwrap_or_default()
}
