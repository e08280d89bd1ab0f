//! Identifiers: a type prefix plus an opaque, time-ordered body (decision D2). The id types
//! and derived ids are `kernel::ids`'s, re-exported here.

use uuid::Uuid;

pub use kernel::ids::*;

/// A new time-ordered identifier such as `con_0192f3...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
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
}
