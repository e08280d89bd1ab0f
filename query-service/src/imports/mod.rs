//! An import's progress and its rows' results, read from the import tables the command
//! service and the `imports` worker write (as record deletions are).

pub mod http;
