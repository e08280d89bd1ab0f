//! An open-loop load generator for the benchmark: sends POSTs at a fixed rate (whatever the
//! latency), so projection lag can be measured under a steady write load.
//!
//! Usage: pace <url> <api key> <requests per second> <seconds>
//!
//! SIGINT ends the run early: no more requests are sent, and those in flight are awaited and
//! counted (so a run can last as long as something else does). `PACE_SLOW_MS=N` prints each
//! request slower than N ms to stderr with the UTC time it was sent, to set beside a log.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, key, rate, seconds] = args.as_slice() else {
        anyhow::bail!("usage: pace <url> <api key> <requests per second> <seconds>");
    };
    let rate: u64 = rate.parse()?;
    let seconds: u64 = seconds.parse()?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let errors = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let started = Instant::now();
    let interval = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let run = std::process::id();
    let slow_ms: Option<u128> = std::env::var("PACE_SLOW_MS").ok().and_then(|ms| ms.parse().ok());
    let mut tasks = Vec::new();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    for index in 0..rate * seconds {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = &mut interrupted => break,
        }
        let (client, url, key, errors, latencies) =
            (client.clone(), url.clone(), key.clone(), errors.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let sent_at = chrono::Utc::now();
            let body = serde_json::json!({"email": format!("pace-{run}-{index}@example.com")});
            match client.post(&url).bearer_auth(&key).json(&body).send().await {
                Ok(response) if response.status().is_success() => {
                    let took = sent.elapsed();
                    if slow_ms.is_some_and(|slow| took.as_millis() > slow) {
                        eprintln!(
                            "slow: sent {} took {:.1} ms",
                            sent_at.format("%H:%M:%S%.3f"),
                            took.as_secs_f64() * 1e3
                        );
                    }
                    if let Ok(mut latencies) = latencies.lock() {
                        latencies.push(took);
                    }
                }
                _ => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let sent = tasks.len();
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    latencies.sort_unstable();
    let percentile =
        |p: f64| latencies.get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1))).copied();
    println!(
        "sent={} ok={} errors={} rate={:.1}/s p50_ms={:.2} p99_ms={:.2}",
        sent,
        latencies.len(),
        errors.load(Ordering::Relaxed),
        latencies.len() as f64 / elapsed,
        percentile(0.50).unwrap_or_default().as_secs_f64() * 1000.0,
        percentile(0.99).unwrap_or_default().as_secs_f64() * 1000.0,
    );
    Ok(())
}
