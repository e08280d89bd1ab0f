//! What every binary does first, in one visible place: load the settings, start logging and
//! install the master key (which the write path and the readers of personal data need).

use crate::settings::Settings;

/// Loads the settings, starts logging (`default_log_filter` unless `RUST_LOG` says otherwise)
/// and installs the keyring of the configured master key.
pub fn start(default_log_filter: &str) -> anyhow::Result<Settings> {
    let settings = Settings::load()?;
    crate::telemetry::init(&settings.telemetry, default_log_filter);
    crate::crypto::install(settings.keyring()?);
    Ok(settings)
}
