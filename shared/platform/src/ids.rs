//! Identifiers: a type prefix plus an opaque, time-ordered body (decision D2).

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// A new time-ordered identifier such as `con_0192f3...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
}

/// A stable identifier derived from names, so re-applying an authored resource keeps its id.
pub fn derived_id(prefix: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0x1f]);
    }
    let digest = hasher.finalize();
    format!("{prefix}_{}", hex::encode(&digest[..16]))
}

/// SHA-256 of a string as lowercase hex.
pub fn sha256_hex(input: &str) -> String {
    hex::encode(Sha256::digest(input.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_carry_prefix_and_sort_by_time() {
        let first = new_id("con");
        let second = new_id("con");
        assert!(first.starts_with("con_"));
        assert_eq!(first.len(), 4 + 32);
        assert!(first < second);
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        assert_eq!(derived_id("sch", &["a", "b"]), derived_id("sch", &["a", "b"]));
        assert_ne!(derived_id("sch", &["a", "b"]), derived_id("sch", &["ab", ""]));
    }
}
