//! Reading the log: a stored event and its columns, a follower's read after its checkpoint, a
//! decision's read of its streams, and the head.

use anyhow::Context;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::events::LogEvent;

/// A stored event as followers read it.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    pub position: i64,
    pub event_id: Uuid,
    pub stream_id: String,
    pub stream_version: i64,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub space_id: Option<String>,
    pub actor_key_id: Option<String>,
    pub subject_id: Option<String>,
    pub occurred_at: DateTime<Utc>,
    pub recorded_at: DateTime<Utc>,
}

/// The columns of `events` that [`StoredEvent::from_row`] reads, in its order.
pub const EVENT_COLUMNS: &str = "position, event_id, stream_id, stream_version, event_type, payload, space_id, \
                                 actor_key_id, subject_id, occurred_at, recorded_at";
/// How many columns [`EVENT_COLUMNS`] names.
const EVENT_COLUMN_COUNT: usize = 11;

impl StoredEvent {
    /// A row of `SELECT {EVENT_COLUMNS}`.
    pub fn from_row(row: &tokio_postgres::Row) -> Self {
        Self {
            position: row.get(0),
            event_id: row.get(1),
            stream_id: row.get(2),
            stream_version: row.get(3),
            event_type: row.get(4),
            payload: row.get(5),
            space_id: row.get(6),
            actor_key_id: row.get(7),
            subject_id: row.get(8),
            occurred_at: row.get(9),
            recorded_at: row.get(10),
        }
    }

    pub fn decode(&self) -> anyhow::Result<LogEvent> {
        LogEvent::decode(&self.event_type, &self.payload)
            .with_context(|| format!("decoding {} at position {}", self.event_type, self.position))
    }
}

/// What a follower reads of the log after its checkpoint: the events of the types it wants,
/// and how far the read reached.
#[derive(Debug, Default)]
pub struct Followed {
    /// The events of the wanted types, in position order.
    pub events: Vec<StoredEvent>,
    /// How many positions the read passed over, wanted or not.
    pub read: usize,
    /// The last position the read passed over (the follower's next checkpoint), if it
    /// passed over any.
    pub last: Option<i64>,
}

/// Reads the events of the `wanted` types among the (at most `limit`) positions after
/// `position` up to the head. Every position up to the head is committed (each append moves
/// the head under its row lock until it commits), so the follower can advance to the end of
/// that span knowing it saw every event of its types there; the events of other types are not
/// read at all (every read model and follower reads every span of the log, and most events
/// are of types a follower does not read).
pub async fn read_wanted(
    client: &impl deadpool_postgres::GenericClient,
    position: i64,
    limit: i64,
    wanted: &[&str],
) -> Result<Followed, tokio_postgres::Error> {
    let statement = client.prepare_cached(&span_statement("", "$1::bigint")).await?;
    let rows = client.query(&statement, &[&position, &limit.max(1), &wanted]).await?;
    Ok(followed_from(&rows).map(|(_, followed)| followed).unwrap_or_default())
}

/// [`read_wanted`] after a checkpoint the database keeps, read in the same statement:
/// `checkpoint` is a query giving the `position` stored for `$1` (`key`). Returns the
/// checkpoint and its span, or `None` when the query finds no row.
pub async fn read_wanted_after(
    client: &impl deadpool_postgres::GenericClient,
    checkpoint: &str,
    key: &str,
    limit: i64,
    wanted: &[&str],
) -> Result<Option<(i64, Followed)>, tokio_postgres::Error> {
    let from = format!("({checkpoint}) c CROSS JOIN LATERAL");
    let statement = client.prepare_cached(&span_statement(&from, "c.position")).await?;
    let rows = client.query(&statement, &[&key, &limit.max(1), &wanted]).await?;
    Ok(followed_from(&rows))
}

/// One round trip: the checkpoint (`checkpoint`, an expression over `$1`, whose rows `from`
/// gives, if any), the span's end (the head, or `$2` positions on), and the events of the
/// types `$3` in it; an empty span or one without wanted events is one row of nulls beside
/// its end.
fn span_statement(from: &str, checkpoint: &str) -> String {
    let columns = EVENT_COLUMNS.split(", ").map(|column| format!("e.{column}")).collect::<Vec<_>>().join(", ");
    format!(
        "SELECT {columns}, span.last, {checkpoint}
         FROM {from} (SELECT least(position, {checkpoint} + $2::bigint) AS last FROM log_head LIMIT 1) span
         LEFT JOIN LATERAL (SELECT {EVENT_COLUMNS} FROM events
                            WHERE event_type = ANY($3) AND position > {checkpoint} AND position <= span.last) e ON true
         ORDER BY e.position"
    )
}

/// The checkpoint and span a [`span_statement`] read, `None` when it found no checkpoint.
fn followed_from(rows: &[tokio_postgres::Row]) -> Option<(i64, Followed)> {
    let first = rows.first()?;
    let (last, checkpoint): (i64, i64) = (first.get(EVENT_COLUMN_COUNT), first.get(EVENT_COLUMN_COUNT + 1));
    if last <= checkpoint {
        return Some((checkpoint, Followed::default()));
    }
    Some((
        checkpoint,
        Followed {
            events: rows
                .iter()
                .filter(|row| row.get::<_, Option<i64>>(0).is_some())
                .map(StoredEvent::from_row)
                .collect(),
            read: usize::try_from(last - checkpoint).unwrap_or(usize::MAX),
            last: Some(last),
        },
    ))
}

/// Every event of the streams `stream_ids`, in log order: what a decision reads of the
/// resources it is about (as new as every acknowledged write).
pub async fn read_streams(
    client: &impl deadpool_postgres::GenericClient,
    stream_ids: &[String],
) -> Result<Vec<StoredEvent>, tokio_postgres::Error> {
    let statement = client
        .prepare_cached(&format!("SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ANY($1) ORDER BY position"))
        .await?;
    let rows = client.query(&statement, &[&stream_ids]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}

/// The events of each stream after its given version, in log order: what a follower that
/// keeps a stream's fold between its steps reads of it (0 reads the whole stream).
pub async fn read_streams_after(
    client: &impl deadpool_postgres::GenericClient,
    stream_ids: &[String],
    after_versions: &[i64],
) -> Result<Vec<StoredEvent>, tokio_postgres::Error> {
    let columns = EVENT_COLUMNS.split(", ").map(|column| format!("e.{column}")).collect::<Vec<_>>().join(", ");
    let statement = client
        .prepare_cached(&format!(
            "SELECT {columns} FROM unnest($1::text[], $2::bigint[]) AS a(stream_id, after)
             JOIN events e ON e.stream_id = a.stream_id AND e.stream_version > a.after
             ORDER BY e.position"
        ))
        .await?;
    let rows = client.query(&statement, &[&stream_ids, &after_versions]).await?;
    Ok(rows.iter().map(StoredEvent::from_row).collect())
}

/// The current head position of the log.
pub async fn head(client: &impl deadpool_postgres::GenericClient) -> Result<i64, tokio_postgres::Error> {
    Ok(client.query_one("SELECT position FROM log_head", &[]).await?.get(0))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_event_column_count_is_the_columns_named() {
        assert_eq!(super::EVENT_COLUMNS.split(", ").count(), super::EVENT_COLUMN_COUNT);
    }

    fn stored(event_type: &str, payload: Vec<u8>) -> super::StoredEvent {
        super::StoredEvent {
            position: 7,
            event_id: uuid::Uuid::nil(),
            stream_id: "rec_1".to_owned(),
            stream_version: 2,
            event_type: event_type.to_owned(),
            payload,
            space_id: None,
            actor_key_id: None,
            subject_id: None,
            occurred_at: crate::time::from_millis(0),
            recorded_at: crate::time::from_millis(0),
        }
    }

    #[test]
    fn the_event_columns_are_the_stored_events_fields_in_their_order() {
        // The fields as Debug prints them: `StoredEvent { position: 7, event_id: .., ... }`.
        let printed = format!("{:?}", stored("RecordCreated.v1", Vec::new()));
        let fields: Vec<&str> = printed
            .trim_start_matches("StoredEvent { ")
            .split(", ")
            .filter_map(|field| field.split_once(": ").map(|(name, _)| name))
            .collect();
        assert_eq!(fields.len(), super::EVENT_COLUMN_COUNT, "{printed}");
        assert_eq!(super::EVENT_COLUMNS.split(", ").collect::<Vec<_>>(), fields);
    }

    #[test]
    fn a_stored_event_decodes_its_payload_and_names_its_type_and_position_when_it_cannot() {
        use crate::events::LogEvent;
        let event = LogEvent::RecordCreated(crate::proto::RecordCreated {
            record_id: "rec_1".to_owned(),
            ..Default::default()
        });
        let decoded = stored(event.event_type(), event.encode()).decode().expect("decodes");
        assert_eq!(decoded, event);
        // A length longer than the bytes that follow it.
        let error = stored("RecordCreated.v1", vec![0x0a, 0x05, b'r']).decode().expect_err("a truncated payload");
        assert_eq!(error.to_string(), "decoding RecordCreated.v1 at position 7");
        let unknown = stored("Future.v9", vec![0x0a, 0x05, b'r']).decode().expect("an unknown type is not an error");
        assert_eq!(unknown, LogEvent::Unknown("Future.v9".to_owned()));
    }
}
