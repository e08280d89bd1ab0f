//! The process's side of crypto-shredding (the keys and the sealing are `kernel::crypto`'s,
//! re-exported here): the keyring is process-wide, installed from the settings when they are
//! loaded, so the log readers (projections, decisions, the audit trail) need not carry it
//! around; the stored data keys are loaded here; and the system's randomness.

use std::sync::OnceLock;

use anyhow::Context;
use deadpool_postgres::GenericClient;
use rand::RngCore;

pub use kernel::crypto::*;

static KEYRING: OnceLock<Keyring> = OnceLock::new();

/// `N` bytes from the system's randomness (a secret's, a token's).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    rand::rng().fill_bytes(&mut bytes);
    bytes
}

/// Installs the process-wide keyring (the first installation wins).
pub fn install(keyring: Keyring) {
    let _ = KEYRING.set(keyring);
}

/// The process-wide keyring.
pub fn keyring() -> anyhow::Result<&'static Keyring> {
    KEYRING.get().context("no master key is installed (APP__MASTER_KEY)")
}

/// [`Keyring::email_subject`] with the process-wide keyring.
pub fn email_subject(email: &str) -> anyhow::Result<String> {
    Ok(keyring()?.email_subject(email))
}

/// [`Keyring::digest`] with the process-wide keyring.
pub fn keyed_digest(purpose: &str, text: &str) -> anyhow::Result<String> {
    Ok(keyring()?.digest(purpose, text))
}

/// Loads and unwraps the stored data keys of `subject_ids`.
pub async fn load_keys(client: &impl GenericClient, subject_ids: &[String]) -> anyhow::Result<Keys> {
    let mut keys = Keys::default();
    if subject_ids.is_empty() {
        return Ok(keys);
    }
    let keyring = keyring()?;
    // One primary-key probe per subject. With `subject_id = ANY($1)` PostgreSQL scanned the
    // whole table for a batch's few dozen subjects whenever it misjudged the array's share of
    // the rows (a sixth of the projector's lookups under a steady create load, and the
    // costliest statement of the whole load); the fence (OFFSET 0) keeps it probing.
    let statement = client
        .prepare_cached(
            "SELECT k.subject_id, k.wrapped_key FROM unnest($1::text[]) AS q(subject_id)
             CROSS JOIN LATERAL (SELECT subject_id, wrapped_key FROM subject_keys
                                 WHERE subject_id = q.subject_id OFFSET 0) k",
        )
        .await?;
    for row in client.query(&statement, &[&subject_ids]).await? {
        let subject_id: String = row.get(0);
        let key = keyring.unwrap_key(&subject_id, row.get(1))?;
        keys.insert(subject_id, key);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_differ_each_time() {
        assert_ne!(random_bytes::<32>(), random_bytes::<32>());
    }
}
