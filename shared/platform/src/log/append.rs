//! A database's failure as an append's ([`AppendError`], whose type is `kernel::log`'s with
//! every other type of an append): transient, a value refused, or a defect.

pub use kernel::log::*;

/// A failure of the database, the pool or a step around them, as an append's.
pub trait Classify {
    /// The failure as an append's.
    fn append_error(self) -> AppendError;
}

impl Classify for tokio_postgres::Error {
    fn append_error(self) -> AppendError {
        match crate::db::classify(&self) {
            crate::db::Failure::Transient => AppendError::Unavailable(self.to_string()),
            crate::db::Failure::Refused => AppendError::Refused(self.to_string()),
            crate::db::Failure::Defect => AppendError::Failed(described(&self)),
        }
    }
}

/// A database error as a person can act on it: the server's code, message and detail (the
/// driver's own text is only "db error").
pub(super) fn described(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let detail = db.detail().map(|detail| format!(" ({detail})")).unwrap_or_default();
            format!("{} {}{detail}", db.code().code(), db.message())
        }
        None => format!("{error:#}"),
    }
}

impl Classify for deadpool_postgres::PoolError {
    fn append_error(self) -> AppendError {
        AppendError::Unavailable(self.to_string())
    }
}

impl Classify for anyhow::Error {
    /// Classifies a database failure inside the error; anything else is a defect.
    fn append_error(self) -> AppendError {
        match self.downcast::<tokio_postgres::Error>() {
            Ok(database) => database.append_error(),
            Err(error) => match error.downcast::<deadpool_postgres::PoolError>() {
                Ok(pool) => pool.append_error(),
                Err(error) => AppendError::Failed(format!("{error:#}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{AppendError, Classify};

    #[test]
    fn no_connection_from_the_pool_is_unavailable_even_under_context_and_any_other_failure_a_defect() {
        use deadpool_postgres::{PoolError, TimeoutType};
        assert!(matches!(PoolError::Timeout(TimeoutType::Wait).append_error(), AppendError::Unavailable(_)));
        assert!(matches!(PoolError::Closed.append_error(), AppendError::Unavailable(_)));
        let waited = anyhow::Error::new(PoolError::Timeout(TimeoutType::Wait)).context("an append");
        assert!(matches!(waited.append_error(), AppendError::Unavailable(_)));
        let defect = anyhow::anyhow!("no such column").context("staging a guard");
        match defect.append_error() {
            AppendError::Failed(message) => assert_eq!(message, "staging a guard: no such column"),
            other => panic!("a failure that is not the database's is a defect, not {other:?}"),
        }
    }
}
