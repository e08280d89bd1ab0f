//! Measures the event log alone: concurrent one-event appends through the batcher, with no
//! HTTP in front. Compared with pgbench's single-row INSERT ceiling in the benchmark.
//!
//! Usage: append_bench <concurrent appenders> <seconds>   (APP__DATABASE__URL must be set)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use platform::events::LogEvent;
use platform::log::{AppendRequest, EventLog, ExpectedVersion, Metadata, NewEvent, StreamAppend};
use platform::proto;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, concurrency, seconds] = args.as_slice() else {
        anyhow::bail!("usage: append_bench <concurrent appenders> <seconds>");
    };
    let (concurrency, seconds): (usize, u64) = (concurrency.parse()?, seconds.parse()?);
    let url = std::env::var("APP__DATABASE__URL")?;
    let pool = platform::db::pool(&url, 8)?;
    let event_log = EventLog::start(pool, 256);
    let appended = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (event_log, appended) = (event_log.clone(), appended.clone());
        tasks.push(tokio::spawn(async move {
            let mut index = 0_u64;
            while Instant::now() < deadline {
                index += 1;
                let request = AppendRequest {
                    metadata: Metadata { actor_key_id: Some(format!("bench-{worker}")), ..Metadata::default() },
                    streams: vec![StreamAppend {
                        stream_id: format!("bench/{}/{worker}/{index}", std::process::id()),
                        expected: ExpectedVersion::NoStream,
                        events: vec![NewEvent {
                            event: LogEvent::AiCreditsSet(proto::AiCreditsSet {
                                space_id: "spc_bench".into(),
                                balance: 1,
                            }),
                            subject_id: None,
                            occurred_at: chrono::Utc::now(),
                        }],
                    }],
                    guards: Vec::new(),
                };
                if event_log.append(request).await.is_ok() {
                    appended.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let count = appended.load(Ordering::Relaxed);
    println!("appended={count} rate={:.0}/s", count as f64 / started.elapsed().as_secs_f64());
    Ok(())
}
