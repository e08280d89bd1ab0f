//! The clock; the timestamps' formats are `kernel::time`'s, re-exported here.

pub use kernel::time::*;

use chrono::Utc;

/// Now, truncated to milliseconds so that what is stored equals what is shown.
pub fn now_millis() -> i64 {
    Utc::now().timestamp_millis()
}
