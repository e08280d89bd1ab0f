//! What PostgreSQL refuses to store, answered: the rules are `kernel::storable`'s,
//! re-exported here.

pub use kernel::storable::*;

use crate::error::{ApiError, Issue};

/// 400 `invalid_character` listing `issues`, or `Ok` when there are none.
pub fn reject(issues: Vec<Issue>) -> Result<(), ApiError> {
    let Some(first) = issues.first() else { return Ok(()) };
    Err(ApiError::of(INVALID_CHARACTER, first.message.clone()).with_issues(issues))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_is_refused_as_invalid_character_in_a_storable_body() {
        let rejected = reject(parameter_issues("query", [("q\u{0}", "v")])).expect_err("refused");
        assert_eq!(rejected.code(), Some(INVALID_CHARACTER));
        // The error body itself must be storable (it may be recorded as an idempotent outcome).
        assert!(json_issues(&rejected.body()).is_empty());
        assert!(reject(parameter_issues("query", [("limit", "5")])).is_ok());
    }
}
