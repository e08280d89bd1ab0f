//! The one error of reading a filter, below every module that reads one.

/// Why a text or a JSON expression is not a filter; the message says what was expected and
/// where (a character position in plain words, a path such as `filter.all[1].op` in JSON).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FilterError {
    message: String,
}

impl FilterError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}
