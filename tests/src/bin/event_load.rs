//! Fills the system with business events for the benchmark: POSTs batches of 500 ready
//! events (unique eventIds, occurredAt spread over the last 6 days) with a few concurrent
//! clients until `total` events are accepted, and prints the rate.
//!
//! Usage: event_load <batch url> <api key> <total events> <concurrent clients>

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const BATCH: u64 = 500;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, total, clients] = args.as_slice() else {
        anyhow::bail!("usage: event_load <batch url> <api key> <total events> <concurrent clients>");
    };
    let total: u64 = total.parse()?;
    let clients: u64 = clients.parse()?;
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let run = std::process::id();
    let started = Instant::now();
    let now = chrono::Utc::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, key, next, accepted, failed) =
            (client.clone(), url.clone(), key.clone(), next.clone(), accepted.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let batch = next.fetch_add(1, Ordering::Relaxed);
                if batch * BATCH >= total {
                    return;
                }
                let events: Vec<serde_json::Value> = (0..BATCH)
                    .map(|n| {
                        let index = batch * BATCH + n;
                        // A spread that is stable per index: 0 to 6 days back, in seconds.
                        let back = (index.wrapping_mul(2_654_435_761) % (6 * 86_400)) as i64;
                        let at = now - chrono::Duration::seconds(back);
                        serde_json::json!({
                            "eventId": format!("load-{run}-{index}"),
                            "occurredAt": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                            "amount": index % 100,
                            "category": "bench",
                        })
                    })
                    .collect();
                let body = serde_json::json!({ "events": events });
                let outcome = client.post(&url).bearer_auth(&key).json(&body).send().await;
                match outcome {
                    Ok(response) if response.status().is_success() => {
                        let body: serde_json::Value = response.json().await.unwrap_or_default();
                        let ok = body["data"]["summary"]["accepted"].as_u64().unwrap_or(0);
                        accepted.fetch_add(ok, Ordering::Relaxed);
                        failed.fetch_add(BATCH - ok, Ordering::Relaxed);
                    }
                    _ => {
                        failed.fetch_add(BATCH, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let accepted = accepted.load(Ordering::Relaxed);
    println!(
        "accepted={accepted} failed={} batches/s={:.1} events/s={:.0}",
        failed.load(Ordering::Relaxed),
        accepted as f64 / BATCH as f64 / elapsed,
        accepted as f64 / elapsed
    );
    Ok(())
}
