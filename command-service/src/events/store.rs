//! The write side of business events: receipts (the eventId index), the subjects events
//! name, and admission state; plus the guards an acceptance appends with.

use platform::error::Code;
use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use domain::records::Loaded;
use platform::log::{AppendError, Guard, SetValue};
use platform::settings::ScopeLimits;
use serde_json::{Value, json};

/// A scope's admission state as the database holds it, refilled to now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ScopeState {
    pub limits: ScopeLimits,
    /// Tokens available now (after refill, capped at the burst).
    pub tokens: f64,
    pub pending: i64,
    pub receipts: i64,
}

/// A receipt already held under an eventId.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub id: String,
    /// `None` once the subject was erased.
    pub input_digest: Option<String>,
    /// The receipt as first answered (`isDuplicate: false`).
    pub receipt: Value,
    /// The subject record is deleted or being deleted.
    pub subject_erased: bool,
}

/// The receipts held under `event_ids` in the event schema, by eventId.
pub(crate) async fn find_receipts(
    client: &impl GenericClient,
    space_id: &str,
    schema_id: &str,
    event_ids: &[String],
) -> Result<HashMap<String, Receipt>, tokio_postgres::Error> {
    if event_ids.is_empty() {
        return Ok(HashMap::new());
    }
    // One primary-key probe per eventId. The subquery is fenced (OFFSET 0) so that the
    // planner cannot pull it up and probe on (space, schema) alone, filtering eventIds: it
    // does that whenever the table has no statistics yet (it starts empty and grows under
    // load until the first analyse), at 1.3 ms a fire at a few thousand receipts.
    let statement = client
        .prepare_cached(
            "SELECT r.event_id, r.id, r.input_digest, r.receipt, d.record_id IS NOT NULL
             FROM unnest($3::text[]) AS q(event_id)
             CROSS JOIN LATERAL (SELECT * FROM event_receipts r
                                 WHERE r.space_id = $1 AND r.schema_id = $2 AND r.event_id = q.event_id OFFSET 0) r
             LEFT JOIN record_deletions d ON d.record_id = r.subject_id",
        )
        .await?;
    let rows = client.query(&statement, &[&space_id, &schema_id, &event_ids]).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let receipt =
                Receipt { id: row.get(1), input_digest: row.get(2), receipt: row.get(3), subject_erased: row.get(4) };
            (row.get(0), receipt)
        })
        .collect())
}

/// The records `record_ids` that events (or aliases) name, as their streams leave them.
pub(crate) async fn load_subjects(
    client: &impl GenericClient,
    record_ids: &[String],
) -> anyhow::Result<HashMap<String, Loaded>> {
    let loaded = reads::records::load_records(client, record_ids).await?;
    Ok(loaded.into_iter().map(|(record_id, _, record)| (record_id, record)).collect())
}

/// One new occurrence's write-side row.
#[derive(Debug, Clone)]
pub(crate) struct NewReceipt {
    pub event_id: String,
    pub id: String,
    pub input_digest: String,
    pub subject_id: Option<String>,
    pub receipt: Value,
    pub pending: bool,
}

/// The code of the guard conflict when another fire took one of the eventIds first.
pub(crate) const EVENT_ID_TAKEN: Code = Code::EventIdTaken;
/// The code of the guard conflict when admission refuses.
pub(crate) const ADMISSION_REFUSED: Code = Code::EventAdmissionRefused;
/// The code of the guard conflict when a subject's deletion started.
pub(crate) const SUBJECT_DELETING: Code = Code::RecordDeletionPending;

/// Inserts the receipts; a taken eventId fails the command (it is then decided again and
/// finds the receipt that won). Set-wise, a command's receipts travel as one JSON array.
pub(crate) fn receipts_guard(space_id: &str, schema_id: &str, receipts: &[NewReceipt]) -> Guard {
    let set_row = vec![
        SetValue::Text(Some(space_id.to_owned())),
        SetValue::Text(Some(schema_id.to_owned())),
        SetValue::Json(Value::Array(
            receipts
                .iter()
                .map(|r| {
                    json!({"event_id": r.event_id, "id": r.id, "input_digest": r.input_digest,
                           "subject_id": r.subject_id, "receipt": r.receipt, "pending": r.pending})
                })
                .collect(),
        )),
    ];
    let event_ids: Vec<String> = receipts.iter().map(|r| r.event_id.clone()).collect();
    let ids: Vec<String> = receipts.iter().map(|r| r.id.clone()).collect();
    let digests: Vec<String> = receipts.iter().map(|r| r.input_digest.clone()).collect();
    let subjects: Vec<Option<String>> = receipts.iter().map(|r| r.subject_id.clone()).collect();
    let bodies: Vec<Value> = receipts.iter().map(|r| r.receipt.clone()).collect();
    let pending: Vec<bool> = receipts.iter().map(|r| r.pending).collect();
    Guard::unique(
        "INSERT INTO event_receipts (space_id, schema_id, event_id, id, input_digest, subject_id, receipt, pending)
         SELECT $1, $2, r.event_id, r.id, r.input_digest, r.subject_id, r.receipt, r.pending
         FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::bool[])
             AS r(event_id, id, input_digest, subject_id, receipt, pending)",
        vec![
            Box::new(space_id.to_owned()),
            Box::new(schema_id.to_owned()),
            Box::new(event_ids),
            Box::new(ids),
            Box::new(digests),
            Box::new(subjects),
            Box::new(bodies),
            Box::new(pending),
        ],
        AppendError::Conflict { code: EVENT_ID_TAKEN, message: String::new() },
    )
    .with_set(
        "INSERT INTO event_receipts (space_id, schema_id, event_id, id, input_digest, subject_id, receipt, pending)
         SELECT g.space_id, g.schema_id, r.event_id, r.id, r.input_digest, r.subject_id, r.receipt, r.pending
         FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS g(space_id, schema_id, receipts),
              jsonb_to_recordset(g.receipts)
                  AS r(event_id text, id text, input_digest text, subject_id text, receipt jsonb, pending bool)",
        set_row,
    )
}

/// Refuses the command if the deletion of any of `subjects` has started (closing the race
/// between reading a subject and appending an event about it).
pub(crate) fn subjects_guard(subjects: Vec<String>) -> Guard {
    let set_row = vec![SetValue::Json(json!(subjects))];
    Guard::exactly_one(
        "SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM record_deletions WHERE record_id = ANY($1))",
        vec![Box::new(subjects)],
        AppendError::Conflict { code: SUBJECT_DELETING, message: String::new() },
    )
    .with_set(
        "SELECT 1 FROM unnest($1::jsonb[]) AS g(subjects)
         WHERE NOT EXISTS (SELECT 1 FROM record_deletions
                           WHERE record_id IN (SELECT jsonb_array_elements_text(g.subjects)))",
        set_row,
    )
}

/// Takes `count` admissions (`pending` of them needing preparation) in every scope at once:
/// refills each token bucket to now (the database's clock), and succeeds only if every scope
/// has the tokens and stays within its caps. Rows are locked in scope order.
///
/// Set-wise, the batch's admissions are summed per scope and taken at once, under the
/// tightest limits any command gives the scope; the statement yields a row per command whose
/// every scope was taken. Taking the sum at once never admits what taking each command in
/// turn would refuse (the bucket refills less, not more); when it refuses, the batch is
/// written a command at a time and the buckets decide exactly who is admitted.
pub(crate) fn admission_guard(scopes: &[(String, ScopeLimits)], count: i64, pending: i64) -> Guard {
    let set_scopes: Vec<Value> = scopes
        .iter()
        .map(|(scope, limits)| {
            json!({"scope": scope, "rate": limits.rate, "burst": limits.burst,
                   "pending_cap": limits.pending, "receipt_cap": limits.receipts})
        })
        .collect();
    let set_row = vec![SetValue::Json(Value::Array(set_scopes)), SetValue::BigInt(count), SetValue::BigInt(pending)];
    let names: Vec<String> = scopes.iter().map(|(name, _)| name.clone()).collect();
    let rates: Vec<f64> = scopes.iter().map(|(_, limits)| limits.rate).collect();
    let bursts: Vec<f64> = scopes.iter().map(|(_, limits)| limits.burst).collect();
    let pending_caps: Vec<i64> = scopes.iter().map(|(_, limits)| limits.pending).collect();
    let receipt_caps: Vec<i64> = scopes.iter().map(|(_, limits)| limits.receipts).collect();
    let expected = scopes.len() as u64;
    Guard {
        sql: "WITH l AS (
                  SELECT * FROM unnest($1::text[], $2::float8[], $3::float8[], $4::bigint[], $5::bigint[])
                      AS l(scope, rate, burst, pending_cap, receipt_cap)),
              locked AS (
                  SELECT a.scope, LEAST(l.burst, a.tokens
                             + GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - a.refilled_at)) * l.rate) AS tokens,
                         a.pending, a.receipts, l.pending_cap, l.receipt_cap
                  FROM event_admission a JOIN l ON l.scope = a.scope ORDER BY a.scope FOR UPDATE OF a)
              UPDATE event_admission a
              SET tokens = locked.tokens - $6::float8, refilled_at = GREATEST(a.refilled_at, clock_timestamp()),
                  receipts = a.receipts + $8::bigint, pending = a.pending + $7::bigint
              FROM locked
              WHERE a.scope = locked.scope AND locked.tokens >= $6::float8
                AND locked.receipts + $8::bigint <= locked.receipt_cap
                AND ($7::bigint = 0 OR locked.pending + $7::bigint <= locked.pending_cap)",
        params: vec![
            Box::new(names),
            Box::new(rates),
            Box::new(bursts),
            Box::new(pending_caps),
            Box::new(receipt_caps),
            Box::new(count as f64),
            Box::new(pending),
            Box::new(count),
        ],
        conflict: AppendError::Conflict { code: ADMISSION_REFUSED, message: String::new() },
        expect_rows: Some(expected),
        set: None,
    }
    .with_set_counting(
        "WITH g AS (SELECT * FROM unnest($1::jsonb[], $2::bigint[], $3::bigint[]) WITH ORDINALITY
                        AS g(scopes, taking, pending, ord)),
              l AS (SELECT g.ord, s.*, g.taking, g.pending FROM g, jsonb_to_recordset(g.scopes)
                        AS s(scope text, rate float8, burst float8, pending_cap bigint, receipt_cap bigint)),
              need AS (SELECT scope, min(rate) AS rate, min(burst) AS burst, min(pending_cap) AS pending_cap,
                              min(receipt_cap) AS receipt_cap, sum(taking)::bigint AS taking,
                              sum(pending)::bigint AS pending
                       FROM l GROUP BY scope),
              locked AS (
                  SELECT a.scope, LEAST(need.burst, a.tokens
                             + GREATEST(0, EXTRACT(EPOCH FROM clock_timestamp() - a.refilled_at)) * need.rate) AS tokens,
                         a.pending, a.receipts, need.pending_cap, need.receipt_cap, need.taking,
                         need.pending AS pending_taking
                  FROM event_admission a JOIN need ON need.scope = a.scope ORDER BY a.scope FOR UPDATE OF a),
              taken AS (
                  UPDATE event_admission a
                  SET tokens = locked.tokens - locked.taking, refilled_at = GREATEST(a.refilled_at, clock_timestamp()),
                      receipts = a.receipts + locked.taking, pending = a.pending + locked.pending_taking
                  FROM locked
                  WHERE a.scope = locked.scope AND locked.tokens >= locked.taking
                    AND locked.receipts + locked.taking <= locked.receipt_cap
                    AND (locked.pending_taking = 0 OR locked.pending + locked.pending_taking <= locked.pending_cap)
                  RETURNING a.scope)
         SELECT 1 FROM g WHERE NOT EXISTS (SELECT 1 FROM l WHERE l.ord = g.ord AND l.scope NOT IN (SELECT scope FROM taken))",
        set_row,
        1,
    )
}

/// Creates the admission rows of `scopes` that do not exist yet, with full buckets.
pub(crate) async fn ensure_scopes(
    client: &impl GenericClient,
    scopes: &[(String, ScopeLimits)],
) -> Result<(), tokio_postgres::Error> {
    let names: Vec<&str> = scopes.iter().map(|(name, _)| name.as_str()).collect();
    let bursts: Vec<f64> = scopes.iter().map(|(_, limits)| limits.burst).collect();
    let statement = client
        .prepare_cached(
            "INSERT INTO event_admission (scope, tokens) SELECT * FROM unnest($1::text[], $2::float8[])
             ON CONFLICT (scope) DO NOTHING",
        )
        .await?;
    client.execute(&statement, &[&names, &bursts]).await?;
    Ok(())
}

/// The scopes' admission state now, in the order of `scopes`, to say why and for how long
/// an admission was refused.
pub(crate) async fn admission_state(
    client: &impl GenericClient,
    scopes: &[(String, ScopeLimits)],
) -> Result<Vec<ScopeState>, tokio_postgres::Error> {
    let names: Vec<&str> = scopes.iter().map(|(name, _)| name.as_str()).collect();
    let statement = client
        .prepare_cached(
            "SELECT scope, tokens, EXTRACT(EPOCH FROM clock_timestamp() - refilled_at)::float8, pending, receipts
             FROM event_admission WHERE scope = ANY($1)",
        )
        .await?;
    let rows = client.query(&statement, &[&names]).await?;
    Ok(scopes
        .iter()
        .map(|(name, limits)| {
            let row = rows.iter().find(|row| row.get::<_, &str>(0) == name);
            match row {
                Some(row) => ScopeState {
                    limits: *limits,
                    tokens: (row.get::<_, f64>(1) + row.get::<_, f64>(2).max(0.0) * limits.rate).min(limits.burst),
                    pending: row.get(3),
                    receipts: row.get(4),
                },
                None => ScopeState { limits: *limits, tokens: limits.burst, pending: 0, receipts: 0 },
            }
        })
        .collect())
}
