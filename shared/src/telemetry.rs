//! Logging: readable lines in development, JSON with `APP__LOG_FORMAT=json`; `RUST_LOG` filters.

use tracing_subscriber::EnvFilter;

pub fn init(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("APP__LOG_FORMAT").is_ok_and(|format| format == "json");
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
