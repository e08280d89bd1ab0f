//! The event log client: appends through a per-process batcher, and reads in position order.
//!
//! Positions come from the single `log_head` counter row, updated as the last statement but
//! one before COMMIT (the event rows follow it in one INSERT). Its row lock is held until the
//! commit is visible, so positions become visible in order and without gaps, and a follower
//! that reads `position > checkpoint` can never miss a late commit. The COMMIT is sent right
//! behind that statement, before its answer (`commit::finish_batch`), so the lock is never held
//! while a busy appender gets round to reading answers. A batch sends its `BEGIN` with its
//! first statements (`db::BEGIN_KEYED`), so a set-wise append is two round trips: the staging
//! statements, then the positions with the COMMIT. To win back the group
//! commit that the lock costs, one task per process groups concurrent commands into one
//! transaction, each inside its own savepoint, so one command's lost race fails only itself.
//!
//! # The event log
//!
//! Table `events`: `position` (global, gapless), `event_id`, `stream_id` and `stream_version`
//! (unique together), `event_type` (`RecordCreated.v1`), `payload` (protobuf), and metadata
//! columns: `space_id`, `actor_key_id`, `actor_user_id`, `request_id`, `idempotency_key`,
//! `subject_id` (the data subject), `occurred_at`, `recorded_at`.
//!
//! **Ordering.** Followers read `position > checkpoint`. A `bigserial` would lose events: a
//! transaction that took position 10 can commit after one that took 11, and a follower that
//! already passed 11 never sees 10. We use the single counter row (`log_head`): each append
//! transaction updates it as its last statement but one (the event INSERT follows, then
//! COMMIT). The row lock is held until the commit is visible, so positions become visible in
//! order, with no gaps, and a rollback gives its positions back. The price is that commits
//! queue on that lock and their fsyncs cannot be grouped (the measurement in the issue:
//! 16,200 single-row inserts/s plain, 1,800/s with the counter, on this machine kind). We win
//! it back with a **per-process append batcher**: concurrent commands are queued to one task,
//! which puts up to `APP__APPEND__BATCH_MAX` of them in one transaction, and no more than
//! `BATCH_BYTES` (256 KB) of their events (a larger command goes alone: the head row stays
//! locked until the commit is flushed, and a batch of rendered emails would keep every other
//! process's appends waiting for megabytes of log). A batch is written in one of three ways:
//!
//! - **Set-wise** (the fast path): when no stream appears twice in the batch and every guard
//!   has a *set form* (`Guard::with_set`: the same claim as one row of a multi-row statement),
//!   the batch costs one statement per kind of change, whatever its size: the new streams, the
//!   advanced streams, the streams at any version, each set form's guards (identity claims,
//!   subject keys, idempotent completions, the catalog revision, a fire's receipts, subject
//!   check and admission), then the events and key positions. The admission set form sums the
//!   batch's admissions per scope and takes them at once under the tightest limits any command
//!   gives the scope (`Guard::with_set_counting`: one row per command whose every scope was
//!   taken); taking the sum at once never admits what taking each in turn would refuse. Only guards that insert or check have set forms; a guard that releases (an
//!   identity given up) or reads what another command may write keeps the batch on the next
//!   path, so no command sees another's effect out of order.
//! - **Pipelined**: every command's own statements at once, without savepoints.
//! - **Isolated**: if either path is refused (a lost race, a unique violation, a guard
//!   affecting fewer rows than it must, a value the database refuses, a defect of its own),
//!   the transaction is rolled back and the batch is written again with each command in its
//!   own SAVEPOINT, so exactly the commands that would fail alone fail.
//!
//! Only a transient failure (connection, resources) fails the whole batch, as 503. One fsync
//! then commits many commands.
//!
//! We chose this over the `xid8` visibility filter (stamp `pg_current_xact_id()`, read only
//! below `pg_snapshot_xmin`) because gapless integer positions keep everything downstream
//! simple and checkable: every position up to the head is committed, so a follower reads the
//! span from its checkpoint to the head it saw and knows it missed nothing there; consistency tokens and checkpoints are single integers, and one long-running or idle
//! transaction anywhere in the database cannot stall every follower. The measured cost is in
//! `docs/benchmarks.md`.
//!
//! **Optimistic concurrency.** Table `streams` holds each stream's version. A command appends
//! with an expected version (`NoStream`, `Exactly(n)`, `Any`), checked inside its savepoint
//! (`INSERT` for a new stream, `UPDATE ... WHERE version = n` otherwise); a lost race becomes
//! the contract's 409, never a 500. `UNIQUE (stream_id, stream_version)` on `events` is the
//! backstop.
//!
//! **Guards.** Write-side uniqueness that decisions depend on (a record identity within its
//! schema: `record_identities`) is claimed inside the same savepoint, so the claim and the
//! events commit or vanish together. These tables are derived from the log and could be
//! rebuilt from it.
//!
//! **Plans.** Every statement of an append finds its rows by key, so an append transaction first
//! sends `platform::db::KEYED_PLANS` (generic plans, planned once per connection in every
//! process; sequential scans, hash and merge joins off; pipelined with its statements): a plan
//! made while a table was small (stale statistics, or a connection's cached generic plan)
//! cannot become a scan of the whole `streams` table once it has grown.
//!
//! **Notifications.** The batcher sends `NOTIFY log_appended` after COMMIT, once per batch,
//! never inside the append transaction (that would take a global lock at commit).
//!
//! **Personal data.** Every personal field lives in a `Sealed` sub-message (record identity
//! and values, user name and email, a suppression's address), keyed to a data subject. A
//! record's seal is encrypted (see Erasure); seals of subjects the API cannot erase (users
//! authored in the workspace file, suppression entries) are kept in the clear.
//!
//! **Subjects.** `events.subject_id` names what an event is about, indexed with the position:
//! a record id for record events, and for suppressions `email:<digest>`, a digest of the
//! address keyed by the master key, so a contact's history can be found by its addresses
//! without the log holding them.

mod append;
mod batcher;
mod commit;
mod read;
mod set_form;

pub use append::{
    AppendError, AppendRequest, Appended, Classify, ExpectedVersion, Guard, Metadata, NewEvent, Param, SetForm,
    SetValue, StreamAppend,
};
pub use batcher::{BATCH_BYTES, EventLog, LOG_CHANNEL};
pub use read::{
    EVENT_COLUMNS, Followed, StoredEvent, head, read_streams, read_streams_after, read_wanted, read_wanted_after,
};
