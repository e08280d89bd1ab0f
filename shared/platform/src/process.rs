//! What every binary does first, in one visible place: load the settings, start logging and
//! install the master key (which the write path and the readers of personal data need).

use crate::settings::Settings;

/// Loads the settings, starts logging (`default_log_filter` unless `RUST_LOG` says otherwise)
/// and installs the keyring of the configured master key.
pub fn start(default_log_filter: &str) -> anyhow::Result<Settings> {
    return_large_allocations_when_freed();
    let settings = Settings::load()?;
    crate::telemetry::init(&settings.telemetry, default_log_filter);
    crate::crypto::install(settings.keyring()?);
    Ok(settings)
}

/// Allocations of this size or more are mapped on their own, and unmapped when freed.
const MAPPED_FROM_BYTES: i32 = 128 * 1024;

/// Has glibc map every allocation of [`MAPPED_FROM_BYTES`] or more on its own, so freeing it
/// returns the memory to the system. Left alone, glibc raises that size to the largest block
/// freed so far (up to 32 MB), and what a thread frees after that stays in its arena: one
/// 10 MB request body after an import took the single-node process from 64 MB to 92, a second
/// to 110, where it now stays at 87 (docs/benchmarks.md, issue 51).
fn return_large_allocations_when_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets an allocator tunable, which glibc allows at any time and
        // from any thread; it reads no memory of ours. The one `unsafe` of the tree
        // (tests/tests/api/layering.rs holds it to this function).
        #[allow(unsafe_code)]
        let set = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MAPPED_FROM_BYTES) };
        if set != 1 {
            eprintln!("glibc refused to map allocations of {MAPPED_FROM_BYTES} bytes or more on their own");
        }
    }
}
