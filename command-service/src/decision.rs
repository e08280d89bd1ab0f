//! What a command decides, as data: the pure half of the write path.
//!
//! A command's [`Decide::decide`] lives in its capability's `decide.rs` and is a function of
//! the loaded state, the command and what it is [`Given`]: the time, the operation's id and a
//! [`Fresh`] source of new ids, data keys and tokens. It names no HTTP, database, clock or random
//! source, so the same inputs decide the same. It answers with an outcome (the streams and
//! guards to append and the reply, as data) or a typed refusal, which says its code and
//! issues (`platform::refusal::Refusal`; the code table gives the status); the shell
//! (`pipeline::Command`, in the capability's `http.rs`) loads what the decision needs and
//! turns its outcome into the HTTP answer.

use domain::email::page_text::PageText;
use platform::error::Warning;
use platform::events::LogEvent;
use platform::fresh::Fresh;
use platform::log::{Guard, StreamAppend};
use serde_json::Value;

/// What a decision is given beside the loaded state.
pub struct Given<'a> {
    /// The time of the decision, in milliseconds since the epoch.
    pub now_ms: i64,
    /// The operation's id (`Operation-Id`).
    pub operation_id: &'a str,
    /// New ids and data keys.
    pub fresh: &'a mut dyn Fresh,
}

/// A command's decision.
pub trait Decide {
    /// The state the decision needs, loaded by the shell.
    type Loaded;
    /// What the decision decided: [`Outcome`], or a capability's own when its shell does more
    /// with it.
    type Outcome;
    /// Why the command is refused (a `thiserror` enum answered through its
    /// `platform::refusal::Refusal` impl).
    type Refusal;

    /// The decision: no IO, nothing drawn but through `given.fresh`.
    fn decide(&self, loaded: Self::Loaded, given: &mut Given<'_>) -> Result<Self::Outcome, Self::Refusal>;
}

/// The success a reply reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Created,
    Accepted,
}

/// A reply's body: what the decision answers with, which the shell (`pipeline`) renders.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    /// A resource's document and the warnings about it: the shell answers them in the
    /// contract's `{data, warnings?}` envelope.
    Data { data: Value, warnings: Vec<Warning> },
    /// A reply only the shell reads (an ingest message's result), never a client's answer.
    Json(Value),
    /// A success page for a browser (public forms and links), never recorded.
    Page(Box<Page>),
}

/// A success page as a decision says it: its title, its paragraphs, a link (its target and
/// words) and the words whose language it is in; the shell renders it.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub title: String,
    pub paragraphs: Vec<String>,
    pub link: Option<(String, String)>,
    pub words: PageText,
}

/// The reply a decision gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: Status,
    pub body: Body,
}

impl Reply {
    /// 200 with the document `data`.
    pub fn ok(data: Value) -> Self {
        Self { status: Status::Ok, body: Body::Data { data, warnings: Vec::new() } }
    }

    /// 201 with the document `data`.
    pub fn created(data: Value) -> Self {
        Self { status: Status::Created, body: Body::Data { data, warnings: Vec::new() } }
    }

    /// 202 with the document `data`.
    pub fn accepted(data: Value) -> Self {
        Self { status: Status::Accepted, body: Body::Data { data, warnings: Vec::new() } }
    }

    /// The same reply with `warnings` about its document.
    pub fn with_warnings(mut self, warnings: &[Warning]) -> Self {
        if let Body::Data { warnings: kept, .. } = &mut self.body {
            *kept = warnings.to_vec();
        }
        self
    }

    /// A reply only the shell reads.
    pub fn raw(body: Value) -> Self {
        Self { status: Status::Ok, body: Body::Json(body) }
    }

    /// 200 with a success page of `title` and `paragraphs` in the language of `words`.
    pub fn page(title: &str, paragraphs: &[&str], words: &PageText) -> Self {
        let paragraphs = paragraphs.iter().map(|paragraph| (*paragraph).to_owned()).collect();
        let page = Page { title: title.to_owned(), paragraphs, link: None, words: words.clone() };
        Self { status: Status::Ok, body: Body::Page(Box::new(page)) }
    }

    /// The same page with a link to `href` reading `text`.
    pub fn with_link(mut self, href: &str, text: &str) -> Self {
        if let Body::Page(page) = &mut self.body {
            page.link = Some((href.to_owned(), text.to_owned()));
        }
        self
    }
}

/// The streams and guards to append in one transaction, and the reply once appended.
pub struct Writes {
    pub streams: Vec<StreamAppend>,
    pub guards: Vec<Guard>,
    pub reply: Reply,
    /// The space a public command writes in (an API key's is its own).
    pub space_id: Option<String>,
}

/// What most commands decide.
pub enum Outcome {
    /// Append this, then reply.
    Append(Writes),
    /// Nothing to write: reply (an idempotent replay gets the same).
    Answer(Reply),
    /// The decision needs more than this attempt loaded (an optimistic first attempt that
    /// skipped a lookup): load and decide again.
    Again,
}

impl Outcome {
    pub fn append(streams: Vec<StreamAppend>, guards: Vec<Guard>, reply: Reply) -> Self {
        Self::Append(Writes { streams, guards, reply, space_id: None })
    }

    /// One stream change and its guards.
    pub fn one(stream: StreamAppend, guards: Vec<Guard>, reply: Reply) -> Self {
        Self::append(vec![stream], guards, reply)
    }

    /// A batch's outcome: its appends, or, when it writes nothing, its reply alone.
    pub fn batch(streams: Vec<StreamAppend>, guards: Vec<Guard>, reply: Reply) -> Self {
        if streams.is_empty() { Self::Answer(reply) } else { Self::append(streams, guards, reply) }
    }

    /// The space a public command writes in.
    pub fn in_space(self, space_id: &str) -> Self {
        match self {
            Self::Append(writes) => Self::Append(Writes { space_id: Some(space_id.to_owned()), ..writes }),
            other => other,
        }
    }

    /// The events it appends, in order.
    pub fn events(&self) -> Vec<&LogEvent> {
        match self {
            Self::Append(writes) => {
                writes.streams.iter().flat_map(|stream| &stream.events).map(|new| &new.event).collect()
            }
            Self::Answer(_) | Self::Again => Vec::new(),
        }
    }

    /// The reply, if it has one.
    pub fn reply(&self) -> Option<&Reply> {
        match self {
            Self::Append(writes) => Some(&writes.reply),
            Self::Answer(reply) => Some(reply),
            Self::Again => None,
        }
    }
}

/// A write to a schema the space does not have (of the kind the write needs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no {what} {schema_ref:?}")]
pub(crate) struct UnknownSchema {
    pub what: &'static str,
    pub schema_ref: String,
}

impl platform::refusal::Answered for UnknownSchema {}

/// A write to a schema the space does not have: 404 `schema_not_found`.
impl platform::refusal::Refusal for UnknownSchema {
    fn code(&self) -> platform::error::Code {
        platform::error::Code::SchemaNotFound
    }
}

/// A decision's tests: `given(loaded).when(&command)`, then what it decided or why it refused,
/// with the time fixed and ids counted (`<prefix>_1`, `<prefix>_2`, ...).
#[cfg(test)]
pub mod harness {
    use std::fmt::Debug;

    use platform::fresh::Counted;

    use super::{Decide, Given, Outcome, Reply};

    /// The time every scenario decides at unless told otherwise.
    pub const NOW_MS: i64 = 1_764_000_000_000;

    pub struct Scenario<L> {
        loaded: L,
        now_ms: i64,
        fresh: Counted,
    }

    /// A scenario on `loaded`.
    pub fn given<L>(loaded: L) -> Scenario<L> {
        Scenario { loaded, now_ms: NOW_MS, fresh: Counted::new().expect("the test keys") }
    }

    impl<L> Scenario<L> {
        /// Decides at `now_ms`.
        pub fn at(self, now_ms: i64) -> Self {
            Self { now_ms, ..self }
        }

        /// Decides `command` on the loaded state.
        pub fn when<C: Decide<Loaded = L>>(mut self, command: &C) -> Then<C::Outcome, C::Refusal> {
            let mut given = Given { now_ms: self.now_ms, operation_id: "op_test", fresh: &mut self.fresh };
            Then(command.decide(self.loaded, &mut given))
        }
    }

    /// What a scenario decided.
    pub struct Then<O, R>(pub Result<O, R>);

    impl<O, R: Debug> Then<O, R> {
        /// The outcome; fails the test if the command was refused.
        pub fn decided(self) -> O {
            match self.0 {
                Ok(outcome) => outcome,
                Err(refusal) => panic!("refused: {refusal:?}"),
            }
        }
    }

    impl<O, R: Debug + PartialEq> Then<O, R> {
        /// Asserts the command was refused for `expected`.
        pub fn then_refused(self, expected: R) {
            match self.0 {
                Ok(_) => panic!("decided, but {expected:?} was expected"),
                Err(refusal) => assert_eq!(refusal, expected),
            }
        }
    }

    impl<R: Debug> Then<Outcome, R> {
        /// Asserts the command appends exactly `expected` and returns its reply.
        pub fn then_events(self, expected: &[platform::events::LogEvent]) -> Reply {
            let outcome = self.decided();
            let events: Vec<_> = outcome.events().into_iter().cloned().collect();
            assert_eq!(events, expected);
            outcome.reply().cloned().expect("a reply")
        }

        /// Asserts the command writes nothing and returns its reply.
        pub fn then_answers(self) -> Reply {
            match self.decided() {
                Outcome::Answer(reply) => reply,
                Outcome::Append(_) => panic!("appended, but only an answer was expected"),
                Outcome::Again => panic!("asked to decide again, but an answer was expected"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::Reply;
    use crate::pipeline::{Answer, Rendered};

    impl Reply {
        /// The body as the client gets it, rendered as the pipeline renders it (`Null` for a
        /// page): for decisions' tests.
        pub fn json(&self) -> Value {
            match Answer::from(self.clone()).body {
                Rendered::Json(body) => body,
                Rendered::Html(_) => Value::Null,
            }
        }
    }
}
