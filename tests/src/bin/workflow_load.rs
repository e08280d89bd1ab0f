//! Triggers workflow runs for the benchmark: POSTs `total` triggers to a workflow's reference
//! id with a few concurrent clients, each with its own contact when asked, and prints the rate.
//!
//! Usage: workflow_load <trigger url> <api key> <total runs> <concurrent clients> [contacts]
//! (`contacts`: each run names a new contact, `load-<n>@example.com`, and an order for the
//! receipt template).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (url, key, total, clients, contacts) = match args.as_slice() {
        [_, url, key, total, clients] => (url, key, total, clients, false),
        [_, url, key, total, clients, mode] if mode == "contacts" => (url, key, total, clients, true),
        _ => anyhow::bail!("usage: workflow_load <trigger url> <api key> <total runs> <clients> [contacts]"),
    };
    let total: u64 = total.parse()?;
    let clients: u64 = clients.parse()?;
    let client = reqwest::Client::new();
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let run = std::process::id();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, key, next, accepted, failed) =
            (client.clone(), url.clone(), key.clone(), next.clone(), accepted.clone(), failed.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= total {
                    return;
                }
                let body = match contacts {
                    true => serde_json::json!({"n": index, "contact": {
                        "email": format!("load-{run}-{index}@example.com"), "firstName": "Load"},
                        "order": {"externalId": format!("o-{run}-{index}"), "total": 42.5}}),
                    false => serde_json::json!({"n": index}),
                };
                let outcome = client.post(&url).bearer_auth(&key).json(&body).send().await;
                let counter = match outcome {
                    Ok(response) if response.status().as_u16() == 202 => &accepted,
                    _ => &failed,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let accepted = accepted.load(Ordering::Relaxed);
    println!("accepted={accepted} failed={} runs/s={:.0}", failed.load(Ordering::Relaxed), accepted as f64 / elapsed);
    Ok(())
}
