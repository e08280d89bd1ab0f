//! The imports worker's pure steps around a wave's decision (`domain::imports::decide`): the
//! outcomes sorted into results, rows to decide again and appends; an append's answer settled
//! as a count, a retry or a failure; a row's result with the guard that inserts it; a part's
//! tally.

use std::collections::HashSet;

use domain::imports::decide::{Key, Outcome, Writes};
use domain::records::decide::{Input, Owners};
use domain::records::write::identity_values;
use platform::error::{Code, Warning};
use platform::log::{AppendError, Guard, SetValue};
use serde_json::{Map, Value, json};

/// Lost races (a concurrent write to the same record or identity) a row may have before it
/// fails with `concurrent_modification`.
pub(super) const ATTEMPTS: u8 = 5;

/// A row to decide: its number, its input and the races it has lost.
pub(super) type Row = (i32, Map<String, Value>, u8);

/// A row's result, as `import_rows` holds it.
#[derive(Debug)]
pub(super) struct RowResult {
    pub number: i32,
    pub status: &'static str,
    pub record_id: Option<String>,
    pub key: Key,
    pub code: Option<Code>,
    pub message: Option<String>,
    pub warnings: Value,
}

impl RowResult {
    pub(super) fn failed(number: i32, key: Key, code: Code, message: String) -> Self {
        Self {
            number,
            status: "failed",
            record_id: None,
            key,
            code: Some(code),
            message: Some(message),
            warnings: json!([]),
        }
    }

    pub(super) fn written(
        number: i32,
        status: &'static str,
        record_id: String,
        key: Key,
        warnings: &[Warning],
    ) -> Self {
        Self { number, status, record_id: Some(record_id), key, code: None, message: None, warnings: json!(warnings) }
    }

    pub(super) fn key(&self) -> Key {
        self.key.clone()
    }

    /// The guard that inserts the result in the row's own append (of part `part` of the
    /// space's import).
    pub(super) fn guard(&self, space_id: &str, import_id: &str, part: i32) -> Guard {
        let text = |value: Option<&str>| SetValue::Text(value.map(str::to_owned));
        let (field, value) = match &self.key {
            Some((field, value)) => (Some(*field), Some(value.as_str())),
            None => (None, None),
        };
        Guard::unique(
            "INSERT INTO import_rows (space_id, import_id, part, row_number, status, record_id, key_field, key_value,
                                      code, message, warnings)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, NULL, NULL, $9)",
            vec![
                Box::new(space_id.to_owned()),
                Box::new(import_id.to_owned()),
                Box::new(part),
                Box::new(self.number),
                Box::new(self.status.to_owned()),
                Box::new(self.record_id.clone()),
                Box::new(field.map(str::to_owned)),
                Box::new(value.map(str::to_owned)),
                Box::new(self.warnings.clone()),
            ],
            AppendError::Conflict { code: Code::OperationTaken, message: "the row has its result".to_owned() },
        )
        .with_set(
            "INSERT INTO import_rows (space_id, import_id, part, row_number, status, record_id, key_field, key_value,
                                      warnings)
             SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::int[], $5::text[], $6::text[], $7::text[],
                                  $8::text[], $9::jsonb[])",
            vec![
                text(Some(space_id)),
                text(Some(import_id)),
                SetValue::Int(part),
                SetValue::Int(self.number),
                text(Some(self.status)),
                text(self.record_id.as_deref()),
                text(field),
                text(value),
                SetValue::Json(self.warnings.clone()),
            ],
        )
    }
}

/// Rows of a part by result.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub created: i32,
    pub updated: i32,
    pub unchanged: i32,
    pub failed: i32,
}

impl Tally {
    pub(super) fn count(&mut self, status: &str) {
        self.add(status, 1);
    }

    pub(super) fn add(&mut self, status: &str, rows: i32) {
        match status {
            "created" => self.created += rows,
            "updated" => self.updated += rows,
            "unchanged" => self.unchanged += rows,
            _ => self.failed += rows,
        }
    }
}

/// What a row touches: its identity values, and the records it names (its `id`, and the holders
/// of its values as the wave read them).
#[derive(Debug, Default, Clone)]
pub(super) struct RowKeys {
    values: Vec<(&'static str, String)>,
    records: Vec<String>,
}

impl RowKeys {
    pub(super) fn of(input: &Input, owners: &Owners) -> Self {
        let values = identity_values(input);
        let records = values
            .iter()
            .filter_map(|(kind, value)| owners.get(&((*kind).to_owned(), value.clone())).cloned())
            .chain(input.id.clone())
            .collect();
        Self { values, records }
    }

    /// Also the record the row's outcome writes (a new record's id).
    pub(super) fn with_record(mut self, record_id: &str) -> Self {
        self.records.push(record_id.to_owned());
        self
    }
}

/// The identity values and records of the rows a wave still appending writes (or leaves to
/// the next wave), which the next wave, decided meanwhile, must not decide on yet.
#[derive(Debug, Default)]
pub(super) struct Busy {
    values: HashSet<(&'static str, String)>,
    records: HashSet<String>,
}

impl Busy {
    pub(super) fn add(&mut self, keys: &RowKeys) {
        self.values.extend(keys.values.iter().cloned());
        self.records.extend(keys.records.iter().cloned());
    }

    fn touches(&self, keys: &RowKeys) -> bool {
        keys.values.iter().any(|value| self.values.contains(value))
            || keys.records.iter().any(|record| self.records.contains(record))
    }
}

/// Which rows of a wave decided while `busy`'s wave is still appending wait until it is written:
/// each row that touches what it writes, and each later row that touches a waiting one (so a
/// file's rows of one contact keep their order). What a row read of a contact the wave in
/// flight does not touch cannot change by it: its writes claim only its rows' values and
/// change only its rows' records, and a value it gives up was held by one of those records.
pub(super) fn waiting(keys: &[RowKeys], busy: &Busy) -> Vec<bool> {
    let mut held = Busy::default();
    keys.iter()
        .map(|keys| {
            let waits = busy.touches(keys) || held.touches(keys);
            if waits {
                held.add(keys);
            }
            waits
        })
        .collect()
}

/// A wave's outcomes, sorted.
pub(super) struct Sorted {
    /// Rows deferred to the next wave, in order.
    pub retry: Vec<Row>,
    /// The results of rows that write nothing (unchanged, failed).
    pub results: Vec<RowResult>,
    /// The rows that write, each with its result (inserted by its append's guard) and writes.
    pub appends: Vec<(Row, RowResult, Writes)>,
}

/// Sorts the outcomes of `kept` (the wave's checked rows, in the outcomes' order).
pub(super) fn sort(kept: Vec<Row>, outcomes: Vec<Outcome>) -> Sorted {
    let mut sorted = Sorted { retry: Vec::new(), results: Vec::new(), appends: Vec::new() };
    for ((number, raw, attempts), outcome) in kept.into_iter().zip(outcomes) {
        match outcome {
            Outcome::Deferred => sorted.retry.push((number, raw, attempts)),
            Outcome::Unchanged { record_id, key, warnings } => {
                sorted.results.push(RowResult::written(number, "unchanged", record_id, key, &warnings));
            }
            Outcome::Failed { key, code, message } => {
                sorted.results.push(RowResult::failed(number, key, code, message))
            }
            Outcome::Created { record_id, key, warnings, writes } => {
                let result = RowResult::written(number, "created", record_id, key, &warnings);
                sorted.appends.push(((number, raw, attempts), result, writes));
            }
            Outcome::Updated { record_id, key, warnings, writes } => {
                let result = RowResult::written(number, "updated", record_id, key, &warnings);
                sorted.appends.push(((number, raw, attempts), result, writes));
            }
        }
    }
    sorted
}

/// What became of a written row's append.
#[derive(Debug)]
pub(super) enum Settled {
    /// Appended: its result counts under its status.
    Counted(&'static str),
    /// It lost a race: decide it again.
    Again(Row),
    /// It lost too many races: its result is `concurrent_modification`.
    Lost(RowResult),
    /// Its result exists already (another step wrote it).
    Taken,
}

/// Settles a row's append; any other failure than a lost race is the step's.
pub(super) fn settle(row: Row, result: &RowResult, appended: Result<(), AppendError>) -> Result<Settled, AppendError> {
    let (number, raw, attempts) = row;
    match appended {
        Ok(()) => Ok(Settled::Counted(result.status)),
        // Another write to the record or the identity came between: decide it again.
        Err(AppendError::WrongVersion { .. })
        | Err(AppendError::Conflict { code: Code::IdentifierConflict | Code::StreamMoved, .. }) => {
            if attempts + 1 >= ATTEMPTS {
                let message = "the record kept changing while the row was imported".to_owned();
                Ok(Settled::Lost(RowResult::failed(number, result.key(), Code::ConcurrentModification, message)))
            } else {
                Ok(Settled::Again((number, raw, attempts + 1)))
            }
        }
        // The row's result exists: another step wrote it (it cannot, under the lock).
        Err(AppendError::Conflict { code: Code::OperationTaken, .. }) => Ok(Settled::Taken),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(number: i32) -> Row {
        let mut input = Map::new();
        input.insert("email".to_owned(), json!(format!("row{number}@example.com")));
        (number, input, 0)
    }

    fn key(number: i32) -> Key {
        Some(("email", format!("row{number}@example.com")))
    }

    fn no_writes() -> Writes {
        Writes { streams: Vec::new(), guards: Vec::new() }
    }

    #[test]
    fn given_a_waves_outcomes_when_sorted_then_each_row_goes_to_its_result_its_append_or_the_next_wave() {
        let warning = Warning { code: "unknown_topic", message: "no topic news".to_owned() };
        let outcomes = vec![
            Outcome::Created { record_id: "rec_1".into(), key: key(1), warnings: vec![warning], writes: no_writes() },
            Outcome::Deferred,
            Outcome::Unchanged { record_id: "rec_3".into(), key: key(3), warnings: Vec::new() },
            Outcome::Failed { key: None, code: Code::InvalidField, message: "age is not a number".into() },
            Outcome::Updated { record_id: "rec_5".into(), key: key(5), warnings: Vec::new(), writes: no_writes() },
        ];
        let sorted = sort((1..=5).map(row).collect(), outcomes);
        assert_eq!(sorted.retry.iter().map(|(number, _, _)| *number).collect::<Vec<_>>(), [2]);
        assert_eq!(sorted.retry[0].1["email"], "row2@example.com", "a deferred row keeps its input");
        let results: Vec<(i32, &str, Option<&str>)> =
            sorted.results.iter().map(|r| (r.number, r.status, r.record_id.as_deref())).collect();
        assert_eq!(results, [(3, "unchanged", Some("rec_3")), (4, "failed", None)]);
        assert_eq!(sorted.results[1].code, Some(Code::InvalidField));
        assert_eq!(sorted.results[1].message.as_deref(), Some("age is not a number"));
        let appends: Vec<(i32, &str)> =
            sorted.appends.iter().map(|((number, _, _), r, _)| (*number, r.status)).collect();
        assert_eq!(appends, [(1, "created"), (5, "updated")]);
        assert_eq!(sorted.appends[0].1.warnings, json!([{"code": "unknown_topic", "message": "no topic news"}]));
        assert_eq!(sorted.appends[0].1.key, key(1));
    }

    #[test]
    fn given_a_rows_append_when_it_lost_a_race_then_it_is_decided_again_until_its_attempts_run_out() {
        let result = RowResult::written(7, "created", "rec_7".into(), key(7), &[]);
        let lost = || AppendError::WrongVersion { stream_id: "record/rec_7".into() };
        let again = settle(row(7), &result, Err(lost())).expect("a lost race is the row's");
        let Settled::Again((7, _, 1)) = again else { panic!("decided again with one attempt spent: {again:?}") };
        let taken = AppendError::Conflict { code: Code::IdentifierConflict, message: "taken".into() };
        let Ok(Settled::Again((7, _, 4))) = settle((7, Map::new(), 3), &result, Err(taken)) else { panic!("again") };
        let last = settle((7, Map::new(), ATTEMPTS - 1), &result, Err(lost())).expect("settled");
        let Settled::Lost(failed) = last else { panic!("the last attempt fails the row: {last:?}") };
        assert_eq!((failed.number, failed.status, failed.code), (7, "failed", Some(Code::ConcurrentModification)));
        assert_eq!(failed.key, key(7), "the failure names the identity the row was matched by");
    }

    #[test]
    fn given_a_rows_append_when_it_committed_its_result_existed_or_it_failed_otherwise_then_it_counts_is_passed_or_fails_the_step()
     {
        let result = RowResult::written(2, "updated", "rec_2".into(), key(2), &[]);
        assert!(matches!(settle(row(2), &result, Ok(())), Ok(Settled::Counted("updated"))));
        let existed = AppendError::Conflict { code: Code::OperationTaken, message: "the row has its result".into() };
        assert!(matches!(settle(row(2), &result, Err(existed)), Ok(Settled::Taken)));
        let broken = AppendError::Failed("the disk is full".into());
        assert!(matches!(settle(row(2), &result, Err(broken)), Err(AppendError::Failed(_))));
    }

    fn keys(values: &[&str], records: &[&str]) -> RowKeys {
        RowKeys {
            values: values.iter().map(|value| ("email", (*value).to_owned())).collect(),
            records: records.iter().map(|record| (*record).to_owned()).collect(),
        }
    }

    #[test]
    fn given_a_wave_in_flight_when_the_next_is_decided_then_rows_touching_it_and_their_followers_wait() {
        let mut busy = Busy::default();
        busy.add(&keys(&["a@x"], &["rec_a"]));
        busy.add(&keys(&["b@x"], &[]));
        let next = [
            keys(&["c@x"], &[]),            // independent
            keys(&["a@x"], &[]),            // claims a value the wave in flight writes
            keys(&["d@x"], &["rec_a"]),     // names a record it writes (another value of it)
            keys(&["e@x"], &["rec_e"]),     // independent
            keys(&["f@x", "c@x"], &[]),     // shares a value with an earlier row that goes ahead
            keys(&["g@x"], &["rec_d_new"]), // independent
            keys(&["d@x"], &[]),            // shares a value with a waiting row: keeps its order
            keys(&[], &["rec_e"]),          // shares a record with an earlier row that goes ahead
        ];
        assert_eq!(waiting(&next, &busy), [false, true, true, false, false, false, true, false]);
        assert_eq!(waiting(&next, &Busy::default()), [false; 8], "nothing in flight: nothing waits");
    }

    #[test]
    fn a_rows_keys_are_its_values_their_holders_and_its_id() {
        let input = Input {
            identities: vec![("email", Some("a@x".to_owned())), ("phone", None)],
            values: Map::new(),
            id: Some("rec_id".to_owned()),
        };
        let owners: Owners = [(("email".to_owned(), "a@x".to_owned()), "rec_holder".to_owned())].into();
        let keys = RowKeys::of(&input, &owners).with_record("rec_new");
        assert_eq!(keys.values, [("email", "a@x".to_owned())]);
        assert_eq!(keys.records, ["rec_holder", "rec_id", "rec_new"]);
    }

    #[test]
    fn a_tally_counts_each_result_under_its_status_and_anything_else_as_failed() {
        let mut tally = Tally::default();
        for status in ["created", "created", "updated", "unchanged", "failed", "something else"] {
            tally.count(status);
        }
        tally.add("unchanged", 10);
        assert_eq!((tally.created, tally.updated, tally.unchanged, tally.failed), (2, 1, 11, 2));
    }

    #[test]
    fn a_rows_result_is_inserted_once_by_its_appends_guard_with_a_set_form_of_the_same_row() {
        let result = RowResult::written(9, "created", "rec_9".into(), key(9), &[]);
        let guard = result.guard("spc_1", "imp_1", 3);
        assert!(guard.sql.starts_with("INSERT INTO import_rows"));
        assert_eq!(guard.params.len(), 9);
        assert_eq!(guard.expect_rows, None, "a unique insert: a second result for the row conflicts");
        assert!(matches!(guard.conflict, AppendError::Conflict { code: Code::OperationTaken, .. }));
        let set = guard.set.as_ref().expect("a set form");
        assert!(set.sql.contains("unnest"));
        assert_eq!(set.row.len(), 9, "the set form takes the same nine values");
    }
}
