//! The event log client: appends through a per-process batcher, and reads in position order.
//!
//! Positions come from the single `log_head` counter row, updated as the last statement but
//! one before COMMIT (the event rows follow it in one INSERT). Its row lock is held until the
//! commit is visible, so positions become visible in order and without gaps, and a follower
//! that reads `position > checkpoint` can never miss a late commit. To win back the group
//! commit that the lock costs, one task per process groups concurrent commands into one
//! transaction, each inside its own savepoint, so one command's lost race fails only itself.

mod append;
mod batcher;
mod commit;
mod read;
mod set_form;

pub use append::{
    AppendError, AppendRequest, Appended, ExpectedVersion, Guard, Metadata, NewEvent, Param, SetForm, SetValue,
    StreamAppend,
};
pub use batcher::{BATCH_BYTES, EventLog, LOG_CHANNEL};
pub use read::{EVENT_COLUMNS, Followed, StoredEvent, head, read_streams, read_streams_after, read_wanted};
