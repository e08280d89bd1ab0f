//! A refusal as the contract answers it: the trait every decision's refusal type implements.
//! The one conversion of any of them (and of a failed append) into the envelope is
//! `platform::refusal`'s.

use crate::error::{Code, Issue};
use crate::log::AppendError;

/// A refusal as the contract answers it, whatever refused it: its code (whose status the code
/// table gives, [`Code::status`]), its message (`Display`), and what the answer carries beside
/// them. Every decision's refusal type implements it, and the one answer of `platform::refusal`
/// turns any of them into the envelope, so no service maps refusals case by case.
pub trait Refusal: std::fmt::Display {
    /// The error's code.
    fn code(&self) -> Code;

    /// The problems with the input, each naming the key it concerns.
    fn issues(&self) -> Vec<Issue> {
        Vec::new()
    }

    /// Headers of the answer (`Retry-After`, an authentication challenge).
    fn headers(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Fields of the error object beside the contract's, each documented in `ErrorDetail`.
    fn fields(&self) -> Vec<(&'static str, serde_json::Value)> {
        Vec::new()
    }

    /// A defect of ours rather than a refusal of the request: answered 500 `internal_error`,
    /// its message logged and not shown.
    fn is_defect(&self) -> bool {
        false
    }

    /// A refusal that is a failure of the write itself (an append refused or unavailable, the
    /// database away): answered as that failure is. `Err` gives the refusal back.
    fn into_failure(self) -> Result<Failure, Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

/// A failure of a write that a refusal may carry ([`Refusal::into_failure`]).
#[derive(Debug)]
pub enum Failure {
    /// The append failed: refused, unavailable, or its outcome unknown.
    Append(AppendError),
    /// The database failed a statement of the write (a driver's or a pool's error, answered
    /// as `platform::error::ApiError`'s classification of it says).
    Database(anyhow::Error),
}
