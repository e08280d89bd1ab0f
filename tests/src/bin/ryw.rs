//! Read-your-writes under load, for the benchmark: `clients` loops that each create a record
//! (command service) and read it back at once with the same key (query service), for
//! `seconds`. Prints the read's latency (p50, p99: what waiting for the caller's write costs)
//! and how many reads answered with a `stale_read` warning.
//!
//! Usage: ryw <command base url> <query base url> <api key> <clients> <seconds>

use std::time::{Duration, Instant};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, command, query, key, clients, seconds] = args.as_slice() else {
        anyhow::bail!("usage: ryw <command base url> <query base url> <api key> <clients> <seconds>");
    };
    let (clients, seconds): (usize, u64) = (clients.parse()?, seconds.parse()?);
    let client = reqwest::Client::builder().pool_max_idle_per_host(256).build()?;
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let run = std::process::id();
    let mut tasks = Vec::new();
    for worker in 0..clients {
        let (client, command, query, key) = (client.clone(), command.clone(), query.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut stale, mut errors) = (Vec::new(), 0u64, 0u64);
            let mut index = 0u64;
            while Instant::now() < deadline {
                index += 1;
                let body = serde_json::json!({"email": format!("ryw-{run}-{worker}-{index}@example.com")});
                let created = client.post(format!("{command}/schemas/contacts/records")).bearer_auth(&key).json(&body);
                let Ok(created) = created.send().await else {
                    errors += 1;
                    continue;
                };
                let Ok(created) = created.json::<serde_json::Value>().await else {
                    errors += 1;
                    continue;
                };
                let Some(id) = created["data"]["id"].as_str() else {
                    errors += 1;
                    continue;
                };
                let sent = Instant::now();
                let read = client.get(format!("{query}/schemas/contacts/records/{id}")).bearer_auth(&key).send().await;
                let read = match read {
                    Ok(response) if response.status().is_success() => response.json::<serde_json::Value>().await.ok(),
                    _ => None,
                };
                match read {
                    Some(body) => {
                        latencies.push(sent.elapsed());
                        if body.get("warnings").is_some() {
                            stale += 1;
                        }
                    }
                    None => errors += 1,
                }
            }
            (latencies, stale, errors)
        }));
    }
    let (mut latencies, mut stale, mut errors) = (Vec::new(), 0, 0);
    for task in tasks {
        let (mine, my_stale, my_errors) = task.await?;
        latencies.extend(mine);
        stale += my_stale;
        errors += my_errors;
    }
    latencies.sort_unstable();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |latency| latency.as_secs_f64() * 1000.0)
    };
    println!(
        "reads={} stale={stale} errors={errors} p50_ms={:.2} p99_ms={:.2}",
        latencies.len(),
        percentile(0.50),
        percentile(0.99)
    );
    Ok(())
}
