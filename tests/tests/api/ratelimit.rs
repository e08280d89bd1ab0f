//! Request buckets: per key, fixed windows, shared by every instance, 429 with an HTTP date.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::helpers::*;

fn limits(read: u32, write: u32) -> platform::settings::RateLimits {
    platform::settings::RateLimits { read_per_second: read, write_per_second: write, ..Default::default() }
}

/// Sleeps until just after a second boundary, so a quick burst falls in one window.
async fn start_of_a_window() {
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() % 1000;
    tokio::time::sleep(Duration::from_millis((1000 - millis + 20) as u64)).await;
}

#[tokio::test]
async fn the_read_bucket_limits_each_key_per_second_with_an_http_date_to_retry() {
    let app = TestApp::spawn_with(Options { limits: Some(limits(5, 25)), ..Options::default() }).await;
    start_of_a_window().await;
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..8 {
        let response = app.get("/me", ALPHA_MEMBER).await;
        if response.status == 429 {
            limited = Some(response);
        } else {
            assert!(response.header("retry-after").is_none());
            assert!(response.headers.keys().all(|name| !name.as_str().contains("ratelimit")), "no remaining counters");
            statuses.push(response.status);
        }
    }
    assert_eq!(statuses, vec![200; 5], "five requests fit the window");
    let limited = limited.expect("the sixth request is limited");
    let origin = app.query_url.trim_end_matches("/v1").to_owned();
    let metrics = app.http.get(format!("{origin}/metrics")).send().await.expect("sent").text().await.expect("text");
    assert!(metrics.contains("rate_limit_refusals_total{bucket=\"read\"}"), "refusals are counted:\n{metrics}");
    assert_eq!(limited.code(), "rate_limit_exceeded");
    let retry_after = limited.header("retry-after").expect("Retry-After");
    let reset = chrono::DateTime::parse_from_rfc2822(retry_after).expect("an HTTP date");
    let wait = reset.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    assert!((-1000..=1000).contains(&wait), "the window resets within a second: {retry_after}");
    // Another key has its own budget.
    assert_eq!(app.get("/me", ALPHA_ADMIN).await.status, 200);
    // The next window opens the bucket again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(app.get("/me", ALPHA_MEMBER).await.status, 200);
}

#[tokio::test]
async fn reads_and_writes_are_independent_buckets() {
    let app = TestApp::spawn_with(Options { limits: Some(limits(3, 2)), ..Options::default() }).await;
    start_of_a_window().await;
    let empty = json!({});
    let writes: Vec<u16> =
        futures_util::future::join_all((0..3).map(|_| app.post("/schemas/contacts/records", ALPHA_ADMIN, &empty)))
            .await
            .into_iter()
            .map(|r| r.status)
            .collect();
    assert_eq!(writes.iter().filter(|s| **s == 201).count(), 2, "{writes:?}");
    assert_eq!(writes.iter().filter(|s| **s == 429).count(), 1, "{writes:?}");
    // The write bucket is spent; the read bucket is not.
    assert_eq!(app.get("/schemas", ALPHA_ADMIN).await.status, 200);
    // Requests without a key are counted by client IP: four in one window, the fourth over the
    // budget of three. (Sent together at the start of a window: one sent after the others had
    // been answered could fall in the next window in a loaded run, and find the bucket open.)
    start_of_a_window().await;
    let anonymous: Vec<u16> =
        futures_util::future::join_all((0..4).map(|_| app.send(app.request(reqwest::Method::GET, "/me", None))))
            .await
            .into_iter()
            .map(|r| r.status)
            .collect();
    assert_eq!(anonymous.iter().filter(|s| **s == 401).count(), 3, "{anonymous:?}");
    assert_eq!(anonymous.iter().filter(|s| **s == 429).count(), 1, "{anonymous:?}");
}

#[tokio::test]
async fn two_command_service_processes_share_one_write_budget() {
    let app = TestApp::spawn().await;
    let (_processes, urls) =
        spawn_servers(&app, "command-service", &["serve"], 2, &[("APP__RATE_LIMITS__WRITE_PER_SECOND", "4".into())])
            .await;
    start_of_a_window().await;
    let statuses: Vec<u16> = futures_util::future::join_all((0..8).map(|index| {
        let url = format!("{}/schemas/contacts/records", urls[index % 2]);
        let request = app.http.post(url).bearer_auth(ALPHA_ADMIN).json(&json!({}));
        async move { request.send().await.expect("sent").status().as_u16() }
    }))
    .await;
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 4, "one budget for both instances: {statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 4, "{statuses:?}");
}

#[tokio::test]
async fn reserved_chunks_never_exceed_the_shared_budget() {
    let app = TestApp::spawn_with(Options::without_projector()).await;
    // Two limiters stand for two processes; the AI bucket's 60 s window keeps the test clear of
    // boundaries. Only budgets above the exact range are reserved in chunks.
    let budget = 5000;
    let limits = platform::settings::RateLimits { ai_per_minute: budget, ..Default::default() };
    let chunk = api::ratelimit::chunk(&limits, budget);
    assert!(chunk > 1, "this budget is reserved in chunks");
    let limiters = [
        api::ratelimit::RateLimiter::new(app.pool.clone(), limits),
        api::ratelimit::RateLimiter::new(app.pool.clone(), limits),
    ];
    let mut admitted = 0;
    for index in 0..budget * 3 / 2 {
        if limiters[index as usize % 2].check(api::ratelimit::Bucket::Ai, "chunked").await.is_ok() {
            admitted += 1;
        }
    }
    assert!(admitted <= budget, "the budget is never exceeded: {admitted}");
    assert!(admitted >= budget - 2 * (chunk - 1), "at most a chunk per process is stranded: {admitted}");
    // Each reservation adds a whole chunk: a statement per request would have counted
    // 7500 chunks.
    let counted = app.query_i64("SELECT sum(count)::bigint FROM rate_windows WHERE bucket_key = 'ai:chunked'").await;
    assert!(counted <= i64::from(budget) + 2 * i64::from(chunk), "{counted}");
}
