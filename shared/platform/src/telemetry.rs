//! Logging: readable lines by default, JSON with `APP__TELEMETRY__FORMAT=json`; the filter
//! comes from the settings (`RUST_LOG`), else the binary's default.

use tracing_subscriber::EnvFilter;

use crate::settings::TelemetrySettings;

pub fn init(settings: &TelemetrySettings, default_filter: &str) {
    let filter = settings
        .filter
        .as_deref()
        .and_then(|filter| EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if settings.format == "json" { builder.json().try_init() } else { builder.try_init() };
}
